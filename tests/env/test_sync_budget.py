"""One env step synchronizes with the device a documented, size-independent number of times."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from morphogen.core.lifecycle import GateConfig, GateMode, Stage
from morphogen.core.slot import SlotConfig
from morphogen.data import load_task
from morphogen.env.actions import Action, Op
from morphogen.env.episode import SYNCS_PER_STEP, EpisodeConfig, MorphogenesisEpisode
from morphogen.telemetry.sinks import Telemetry

SYNC_METHODS = ("item", "tolist", "cpu")


def count_syncs(monkeypatch: pytest.MonkeyPatch, work: Callable[[], object]) -> int:
    calls: list[str] = []
    for name in SYNC_METHODS:
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: object, _name: str = name, _original=original, **kwargs: object):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    work()
    monkeypatch.undo()
    return len(calls)


@pytest.mark.parametrize("base_channels,n_blocks", [(4, 2), (16, 3)])
def test_env_step_sync_budget_is_constant(monkeypatch, tmp_path, base_channels, n_blocks):
    task = load_task("digits", max_train_samples=128)
    task = dataclasses.replace(task, host_kwargs={**task.host_kwargs, "base_channels": base_channels,
                                                  "n_blocks": n_blocks})
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=1)
    config = EpisodeConfig(max_epochs=8, slots=SlotConfig(gates=gates, blend_epochs=1))
    with Telemetry(tmp_path, level="normal") as telemetry:
        episode = MorphogenesisEpisode(task, config, seed=0, telemetry=telemetry)
        episode.reset()
        episode.step(Action(Op.GERMINATE, "r0c0", "conv_light"))
        episode.step(Action())
        episode.step(Action(Op.ADVANCE, "r0c0"))
        episode.step(Action())
        assert episode.model.slot("r0c0").stage in (Stage.HOLDING, Stage.BLENDING)
        # A step with a blended seed: counterfactual validation and a seed in the gradient report.
        syncs = count_syncs(monkeypatch, lambda: episode.step(Action()))
    assert syncs == SYNCS_PER_STEP
