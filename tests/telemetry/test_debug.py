"""Per-layer debug statistics: float64 NumPy oracles, NaN/Inf/zero counts, one sync, out of compiled graphs."""

from __future__ import annotations

import copy
import math
import time

import numpy as np
import pytest
import torch
from torch import nn

from morphogen.telemetry.debug import layer_statistics, layer_statistics_event
from morphogen.telemetry.events import LayerStats


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _reference(name: str, source: str, tensor: torch.Tensor) -> LayerStats:
    values = tensor.detach().double().numpy().ravel()
    return LayerStats(
        name=name,
        source=source,
        numel=values.size,
        norm=float(np.sqrt(np.sum(values**2))),
        mean=float(np.mean(values)),
        std=float(np.std(values)),  # NumPy's default is the population std (ddof=0)
        min=float(np.min(values)),
        max=float(np.max(values)),
        zeros=int(np.sum(values == 0)),
        nan=int(np.sum(np.isnan(values))),
        inf=int(np.sum(np.isinf(values))),
    )


def _assert_close(actual: LayerStats, expected: LayerStats) -> None:
    assert (actual.name, actual.source, actual.numel) == (expected.name, expected.source, expected.numel)
    assert (actual.zeros, actual.nan, actual.inf) == (expected.zeros, expected.nan, expected.inf)
    for field in ("norm", "mean", "std", "min", "max"):
        assert getattr(actual, field) == pytest.approx(getattr(expected, field), rel=1e-5, abs=1e-7, nan_ok=True)


def test_parameters_and_gradients_match_a_float64_reference() -> None:
    model = _model()
    model[0].bias.data[:3] = 0.0  # some exact zeros to count
    (model(torch.randn(5, 4)) ** 2).mean().backward()
    stats = layer_statistics(model)
    named = list(model.named_parameters())
    expected = [_reference(name, "parameter", param) for name, param in named]
    expected += [_reference(name, "gradient", param.grad) for name, param in named if param.grad is not None]
    assert len(stats) == len(expected) == 8
    for actual, reference in zip(stats, expected, strict=True):
        _assert_close(actual, reference)
    assert stats[1].zeros >= 3
    assert [layer.source for layer in layer_statistics(model, gradients=False)] == ["parameter"] * 4


def test_nan_inf_and_zero_counts_by_hand() -> None:
    module = nn.Module()
    module.weight = nn.Parameter(torch.tensor([1.0, 0.0, math.nan, math.inf, -math.inf, 0.0]))
    (layer,) = layer_statistics(module)
    assert (layer.zeros, layer.nan, layer.inf) == (2, 1, 2)
    assert math.isnan(layer.mean) and math.isnan(layer.norm)


def test_single_entry_and_empty_tensors() -> None:
    module = nn.Module()
    module.scale = nn.Parameter(torch.tensor([-3.0]))
    module.empty = nn.Parameter(torch.zeros(0))
    scale, empty = layer_statistics(module)
    assert (scale.norm, scale.mean, scale.std, scale.min, scale.max) == (3.0, -3.0, 0.0, -3.0, -3.0)
    assert empty.numel == 0 and empty.norm == 0.0 and math.isnan(empty.mean)


def test_half_precision_does_not_overflow_and_parameters_without_gradient_have_no_row() -> None:
    module = nn.Module()
    module.big = nn.Parameter(torch.full((10000,), 1000.0, dtype=torch.float16))
    module.exact = nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    module.big.grad = torch.full((10000,), 1000.0, dtype=torch.float16)
    stats = layer_statistics(module)
    assert [(layer.name, layer.source) for layer in stats] == [
        ("big", "parameter"),
        ("exact", "parameter"),
        ("big", "gradient"),
    ]
    # sqrt(10000 * 1000²) = 1e5, far above float16's largest value 65504
    assert stats[0].norm == pytest.approx(1e5, rel=1e-5) and stats[2].norm == pytest.approx(1e5, rel=1e-5)
    assert stats[1].norm == 5.0


def test_one_sync_per_call(sync_calls: list[str]) -> None:
    model = nn.Sequential(*(nn.Linear(6, 6) for _ in range(10)))
    (model(torch.randn(3, 6)).sum()).backward()
    stats = layer_statistics(model)
    assert len(stats) == 40
    assert sync_calls == ["tolist"]


def test_event_names_the_module() -> None:
    model = _model()
    event = layer_statistics_event(model, name="policy", epoch=3, env_id=1, gradients=False)
    assert event.module == "policy" and event.epoch == 3 and len(event.layers) == 4
    assert layer_statistics(nn.ReLU()) == ()


def _train_step(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, tuple[LayerStats, ...]]:
    loss = nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    return loss.detach(), layer_statistics(model)


def test_statistics_are_excluded_from_compiled_graphs() -> None:
    started = time.perf_counter()
    inputs, targets = torch.randn(5, 4), torch.randn(5, 2)
    eager_model = _model()
    compiled_model = copy.deepcopy(eager_model)
    eager_loss, eager_stats = _train_step(eager_model, inputs, targets)

    torch._dynamo.reset()
    compiled_step = torch.compile(_train_step, backend="aot_eager")
    compiled_loss, compiled_stats = compiled_step(compiled_model, inputs, targets)
    torch.testing.assert_close(compiled_loss, eager_loss)
    assert len(compiled_stats) == len(eager_stats) == 8
    for compiled, eager in zip(compiled_stats, eager_stats, strict=True):
        _assert_close(compiled, eager)

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(_train_step)(copy.deepcopy(eager_model), inputs, targets)
    reasons = " ".join(str(reason.reason) for reason in explanation.break_reasons)
    assert "torch.compiler.disable" in reasons and "layer_statistics" in reasons
    traced = " ".join(graph.code for graph in explanation.graphs)
    assert "mse_loss" in traced  # the training step itself was traced
    for operation in ("_foreach_norm", "amin", "amax", "isnan", "isinf"):
        assert operation not in traced, operation  # the statistics' body was not
    assert time.perf_counter() - started < 20.0
