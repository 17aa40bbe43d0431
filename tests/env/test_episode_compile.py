"""A whole episode with `--compile` against the same episode run eagerly: a seed walked through its life
(germinate, train in the shadow pass, blend, hold, fossilize) makes the same transitions, and the
measurements agree to float32 rounding (the compiled graph may order its float operations differently;
over 6 epochs of SGD that stays far below a tolerance of 1e-3 in loss and 0.5 accuracy points)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from morphogen.core.compilation import CompileSettings
from morphogen.core.lifecycle import GateConfig, GateMode
from morphogen.core.slot import SlotConfig
from morphogen.data import load_task
from morphogen.env.actions import Action, Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.telemetry import events
from morphogen.telemetry.debug import layer_statistics
from morphogen.telemetry.sinks import Telemetry

SCRIPT = (Action(Op.GERMINATE, "r0c1", "conv_light"), Action(), Action(Op.ADVANCE, "r0c1"), Action(), Action(),
          Action(Op.FOSSILIZE, "r0c1"))


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _play(settings: CompileSettings | None, level: str = "off") -> tuple[list[EpisodeSnapshot], list[str], int]:
    """Snapshots, stage path and layer-statistics events of the scripted episode."""
    task = load_task("digits", max_train_samples=200, host={"base_channels": 4})
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=2)
    config = EpisodeConfig(max_epochs=len(SCRIPT), slots=SlotConfig(gates=gates, blend_epochs=1))
    episode = MorphogenesisEpisode(task, config, seed=0, slots=["r0c0", "r0c1"],
                                   telemetry=Telemetry(None, level=level))
    episode.compile_settings = settings
    episode.reset()
    snapshots = [episode.step(action).snapshot for action in SCRIPT]
    path = [f"{e.from_stage}->{e.to_stage}" for e in episode.history if isinstance(e, events.StageTransition)]
    layer_events = sum(isinstance(e, events.LayerStatistics) for e in episode.history)
    return snapshots, path, layer_events


def test_compiled_episode_makes_the_same_decisions_and_measurements_as_eager() -> None:
    eager, eager_path, _ = _play(None)
    compiled, compiled_path, _ = _play(CompileSettings(backend="aot_eager"))
    assert compiled_path == eager_path
    assert eager_path[-1] == "holding->fossilized"
    for eager_step, compiled_step in zip(eager, compiled, strict=True):
        assert compiled_step.last_action_succeeded == eager_step.last_action_succeeded
        assert [s.stage for s in compiled_step.slots] == [s.stage for s in eager_step.slots]
        assert compiled_step.val_accuracy == pytest.approx(eager_step.val_accuracy, abs=0.5)
        assert compiled_step.val_loss == pytest.approx(eager_step.val_loss, rel=1e-3)
        assert compiled_step.train_loss == pytest.approx(eager_step.train_loss, rel=1e-3)
    # Graphs: the bare host, the seed in its shadow pass, the seed blended; each once (plus the last,
    # smaller batch of an epoch, which dynamo compiles once with a dynamic batch size).
    assert int(torch._dynamo.utils.counters["stats"]["unique_graphs"]) <= 6


def test_debug_layer_statistics_stay_out_of_the_compiled_graphs() -> None:
    """At level debug every epoch measures layer statistics; they are `torch.compiler.disable`d, so dynamo
    never traces them, and the compiled graphs are the same as without them."""
    _, _, events_measured = _play(CompileSettings(backend="eager"), level="debug")
    assert events_measured == len(SCRIPT)
    graphs_with_debug = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    _play(CompileSettings(backend="eager"), level="normal")
    assert int(torch._dynamo.utils.counters["stats"]["unique_graphs"]) == graphs_with_debug
    assert getattr(layer_statistics, "_torchdynamo_disable", False)
