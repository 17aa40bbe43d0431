"""`--compile` of the host: no graph break with seeds in any stage, compiled equals eager (outputs and
gradients), and what recompiles when: a germination at most once, later stages that run the same code
never, another model with the same plan never.

Dynamo backends "eager" and "aot_eager" trace exactly what inductor would compile, without generating
kernels, so these tests stay fast; the inductor path runs in tests/test_cli_compile.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._dynamo
from slot_driver import EASY_CONFIG, drive_to, perturb_seed
from torch import Tensor
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from morphogen.core.blend import BlendKind
from morphogen.core.compilation import RECOMPILE_LIMIT, CompileSettings, _CompiledFunction
from morphogen.core.hosts import CNNHost, TransformerHost
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import IDLE, SlotMode, SlotPlan

SEED_STAGES = (Stage.GERMINATED, Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED)


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _graphs() -> int:
    """Graphs dynamo compiled since the counters were cleared."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _model(topology: str, seed: int = 0) -> MorphogeneticModel:
    torch.manual_seed(seed)
    if topology == "cnn":
        host = CNNHost(5, 1, n_blocks=3, base_channels=4)
    else:
        host = TransformerHost(vocab_size=11, d_model=16, n_heads=2, n_layers=3, block_size=6, n_segments=3)
    return MorphogeneticModel(host, config=EASY_CONFIG)


def _batch(topology: str) -> Tensor:
    generator = torch.Generator().manual_seed(7)
    if topology == "cnn":
        return torch.randn(4, 1, 8, 8, generator=generator)
    return torch.randint(0, 11, (4, 6), generator=generator)


def _grow(model: MorphogeneticModel, slot_id: str, blueprint: str, stage: Stage, blend: BlendKind,
          alpha: float = 0.6) -> None:
    slot = model.germinate(slot_id, blueprint, blend=blend)
    perturb_seed(slot, torch.Generator().manual_seed(3))
    drive_to(slot, stage, alpha=alpha)


#: Seeds of `_mixed_stages` per case: a case is a topology, and "transformer blocks" grows whole layers.
MIXED_BLUEPRINTS = {"cnn": ("conv_light", "attention", "depthwise"), "transformer": ("lora", "mlp_small", "norm"),
                    "transformer blocks": ("block", "block_copy", "block")}


def _mixed_stages(case: str) -> MorphogeneticModel:
    """Three slots: one TRAINING (shadow pass), one BLENDING with a gate, one FOSSILIZED."""
    model = _model(case.split()[0])
    first, second, third = model.slot_ids
    blueprints = MIXED_BLUEPRINTS[case]
    _grow(model, first, blueprints[0], Stage.TRAINING, BlendKind.ADD)
    _grow(model, second, blueprints[1], Stage.BLENDING, BlendKind.GATE, alpha=0.4)
    _grow(model, third, blueprints[2], Stage.FOSSILIZED, BlendKind.MULTIPLY)
    return model


def test_settings_pick_the_mode_by_device_and_reject_unknown_names() -> None:
    assert CompileSettings().resolved_mode("cpu") == "default"
    assert CompileSettings().resolved_mode("cuda:0") == "reduce-overhead"
    assert CompileSettings(mode="max-autotune").resolved_mode("cpu") == "max-autotune"
    assert CompileSettings(backend="aot_eager").resolved_mode("cuda") is None  # only inductor takes a mode
    with pytest.raises(ValueError, match="compile_mode must be one of"):
        CompileSettings(mode="fast")
    with pytest.raises(ValueError, match="compile_backend must be one of"):
        CompileSettings(backend="tvm")


def test_under_cuda_graphs_a_compiled_function_returns_copies_the_next_replay_cannot_overwrite() -> None:
    """The policy keeps its LSTM state across calls; a CUDA graph's next replay overwrites its outputs in place.
    (Building the wrapper compiles nothing, so this runs without CUDA: the compiled call is stood in for.)"""
    kept = (torch.ones(2), (torch.zeros(3), torch.full((1,), 5.0)))
    for device, settings, copies in ((torch.device("cuda"), CompileSettings(), True),
                                     (torch.device("cuda"), CompileSettings(mode="max-autotune-no-cudagraphs"), False),
                                     (torch.device("cpu"), CompileSettings(), False)):
        wrapper = _CompiledFunction(lambda: kept, settings, device)
        assert wrapper.cuda_graphs is copies
        wrapper.function = lambda: kept
        features, (hidden, cell) = wrapper()
        for returned, original in zip((features, hidden, cell), (kept[0], *kept[1]), strict=True):
            torch.testing.assert_close(returned, original)
            assert (returned.data_ptr() != original.data_ptr()) is copies, (device, settings)


@pytest.mark.parametrize("case", list(MIXED_BLUEPRINTS))
def test_host_and_slots_forward_has_no_graph_break_in_any_stage(case: str) -> None:
    model = _mixed_stages(case).train()
    x = _batch(case.split()[0])
    plan = model.execution_plan()
    _, captured = model._host_forward(x, plan)
    assert len(captured) == 1  # the TRAINING seed's input
    for function, arguments in ((MorphogeneticModel.forward, (model, x)),
                                (MorphogeneticModel._host_forward, (model, x, plan)),
                                (MorphogeneticModel._shadow_pass, (model, captured, plan))):
        explanation = torch._dynamo.explain(function)(*arguments)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        assert explanation.graph_count == 1


@pytest.mark.parametrize("stage", SEED_STAGES)
def test_training_forward_traces_as_one_graph_with_a_seed_in_each_stage(stage: Stage) -> None:
    model = _model("cnn").train()
    _grow(model, "r0c1", "conv_light", stage, BlendKind.ADD)
    plan = model.execution_plan()
    host_forward = torch.compile(MorphogeneticModel._host_forward, fullgraph=True, backend="eager")
    output, captured = host_forward(model, _batch("cnn"), plan)  # fullgraph: a graph break raises
    assert output.shape == (4, 5)
    assert len(captured) == (1 if stage is Stage.TRAINING else 0)
    if captured:
        shadow_pass = torch.compile(MorphogeneticModel._shadow_pass, fullgraph=True, backend="eager")
        assert shadow_pass(model, captured, plan).shape == (1, 4, 5)


@pytest.mark.parametrize("case", list(MIXED_BLUEPRINTS))
def test_compiled_training_forward_matches_eager_outputs_and_gradients(case: str) -> None:
    eager, compiled = _mixed_stages(case).train(), _mixed_stages(case).train()
    compiled.compile_forward(CompileSettings(backend="aot_eager"))
    x = _batch(case.split()[0])
    results = []
    for model in (eager, compiled):
        output, shadow = model.forward_with_shadow(x)
        assert shadow is not None
        output.square().mean().backward()  # two backward passes, as the trainer makes them
        shadow.outputs.square().mean().backward(inputs=list(shadow.parameters))
        gradients = [p.grad for p in model.parameters() if p.grad is not None]
        results.append((output, shadow, gradients))
    (eager_output, eager_shadow, eager_gradients), (output, shadow, gradients) = results
    torch.testing.assert_close(output, eager_output, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(shadow.outputs, eager_shadow.outputs, rtol=1e-5, atol=1e-6)
    assert shadow.slot_ids == eager_shadow.slot_ids
    assert [p.shape for p in shadow.parameters] == [p.shape for p in eager_shadow.parameters]
    assert len(gradients) == len(eager_gradients)
    for gradient, eager_gradient in zip(gradients, eager_gradients, strict=True):
        torch.testing.assert_close(gradient, eager_gradient, rtol=1e-5, atol=1e-6)
    # The compiled shadow's parameters are the model's own tensors, so the seed optimizer steps them.
    assert all(any(p is q for q in compiled.parameters()) for p in shadow.parameters)


def test_plans_name_what_a_slot_runs_not_its_stage() -> None:
    model = _model("cnn")
    slot = model.slot("r0c1")
    assert slot.plan() == IDLE
    plans = {}
    for stage in SEED_STAGES:
        if stage is Stage.GERMINATED:
            slot = model.germinate("r0c1", "conv_light")
        else:
            drive_to(slot, stage)
        plans[stage] = slot.plan()
    assert plans[Stage.GERMINATED] == IDLE  # a seed that does not run changes no graph
    assert plans[Stage.TRAINING] == SlotPlan(SlotMode.SHADOW, "conv_light", "[]", BlendKind.ADD, True)
    assert plans[Stage.BLENDING] == plans[Stage.TRAINING]._replace(mode=SlotMode.BLENDED)
    assert plans[Stage.BLENDING] == plans[Stage.HOLDING] == plans[Stage.FOSSILIZED]
    assert len({hash(plan) for plan in plans.values()}) == 3  # hashable: dynamo guards on it, caches key on it


def _entries(function: Callable[..., object]) -> int:
    """Compiled graphs dynamo holds for `function` (one per plan and shapes it has seen)."""
    return len(_debug_get_cache_entry_list(function.__code__))  # type: ignore[attr-defined]


def test_a_germination_recompiles_the_model_at_most_once_and_later_stages_reuse_graphs() -> None:
    """Counted per compiled function: the host forward, and the shadow pass that TRAINING seeds add."""
    model, other_env = _model("cnn", seed=0), _model("cnn", seed=1)
    settings = CompileSettings(backend="eager")
    model.compile_forward(settings)
    other_env.compile_forward(settings)
    x = _batch("cnn")

    def train_step(target: MorphogeneticModel) -> tuple[int, int]:
        """New graphs of (host forward, shadow pass) in one training step of `target`."""
        before = _entries(MorphogeneticModel._host_forward), _entries(MorphogeneticModel._shadow_pass)
        output, shadow = target.forward_with_shadow(x)
        output.square().mean().backward()
        if shadow is not None:
            shadow.outputs.square().mean().backward(inputs=list(shadow.parameters))
        return (_entries(MorphogeneticModel._host_forward) - before[0],
                _entries(MorphogeneticModel._shadow_pass) - before[1])

    assert train_step(model) == (1, 0)  # the first call compiles
    assert train_step(model) == (0, 0)
    assert train_step(other_env) == (0, 0)  # another env's model: same plan, its own weights, the same graph
    slot = model.germinate("r0c1", "conv_light")
    assert train_step(model) == (0, 0)  # GERMINATED: the seed does not run yet
    drive_to(slot, Stage.TRAINING)
    assert train_step(model) == (1, 1)  # the germination's one recompile of each: the seed runs in the shadow pass
    drive_to(slot, Stage.BLENDING, alpha=0.3)
    assert train_step(model) == (1, 0)  # blended in: the host forward once more; no shadow pass any more
    slot.set_alpha_target(1.0, 0, 0)
    assert train_step(model) == (0, 0)  # alpha is a buffer, not a constant: no recompile on a new value
    drive_to(slot, Stage.HOLDING)
    drive_to(slot, Stage.FOSSILIZED)
    assert train_step(model) == (0, 0)  # HOLDING and FOSSILIZED run what BLENDING ran
    other_slot = other_env.germinate("r0c1", "conv_light")
    drive_to(other_slot, Stage.FOSSILIZED)
    assert train_step(other_env) == (0, 0)  # the other env reaching a plan already compiled reuses it
    assert _graphs() <= RECOMPILE_LIMIT


def test_compiled_model_follows_a_prune_and_a_different_blueprint_in_the_same_slot() -> None:
    """After a prune, the same slot holding another blueprint must not reuse the old seed's graph."""
    eager, compiled = _model("cnn"), _model("cnn")
    compiled.compile_forward(CompileSettings(backend="eager"))
    x = _batch("cnn")
    for blueprint in ("conv_light", "depthwise"):
        for model in (eager, compiled):
            slot = model.slot("r0c1")
            if slot.seed is not None:
                slot.prune(0)
                slot.lifecycle.embargo_remaining = 0
                for _ in range(3):  # PRUNED -> EMBARGOED -> RESETTING -> DORMANT
                    slot.step_epoch(0)
            torch.manual_seed(5)
            _grow(model, "r0c1", blueprint, Stage.BLENDING, BlendKind.ADD)
        with torch.no_grad():
            torch.testing.assert_close(compiled.forward_with_shadow(x)[0], eager.forward_with_shadow(x)[0],
                                       rtol=1e-5, atol=1e-6)


def test_eager_again_after_compile_is_switched_off() -> None:
    model = _model("cnn")
    model.compile_forward(CompileSettings(backend="eager"))
    model.forward_with_shadow(_batch("cnn"))
    compiled_graphs = _graphs()
    model.compile_forward(None)
    model.forward_with_shadow(_batch("cnn"))
    assert compiled_graphs == 1 and _graphs() == 1
