"""IsolationMonitor: hand-computed report, unmeasured seeds, reset, sync budget, mixed devices."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from morphogen.core.isolation import IsolationMonitor, IsolationReport, SeedAccumulation, SeedGradientHealth
from morphogen.telemetry.gradients import RATIO_HOST_FLOOR


def _param(size: int, device: str = "cpu") -> torch.Tensor:
    return torch.zeros(size, device=device, requires_grad=True)


def _set_grads(params: list[torch.Tensor], grads: list[list[float] | None]) -> None:
    for param, grad in zip(params, grads, strict=True):
        param.grad = None if grad is None else torch.tensor(grad, device=param.device)


def _two_batch_example(monitor: IsolationMonitor) -> None:
    """Host of 4 parameters and seeds a (5 parameters), b (3) and c (2) over two batches."""
    host = [_param(2), _param(2)]
    seed_a = [_param(4), _param(1)]
    seed_b = [_param(3)]
    seed_c = [_param(2)]
    seeds = {"a": seed_a, "b": seed_b, "c": seed_c}
    # Batch 1: host norm 5; seed a norms 4 and 3 -> 5; seed b and c have no gradient.
    _set_grads(host, [[3.0, 4.0], [0.0, 0.0]])
    _set_grads(seed_a, [[2.0, 2.0, 2.0, 2.0], [3.0]])
    _set_grads(seed_b, [None])
    _set_grads(seed_c, [None])
    monitor.accumulate(host, seeds)
    # Batch 2: host norm 10; seed a norms 0 (vanishing) and 12 (exploding) -> 12; seed b norm 3.
    _set_grads(host, [[6.0, 8.0], [0.0, 0.0]])
    _set_grads(seed_a, [[0.0, 0.0, 0.0, 0.0], [12.0]])
    _set_grads(seed_b, [[1.0, 2.0, 2.0]])
    monitor.accumulate(host, seeds)


def test_report_matches_hand_computation() -> None:
    monitor = IsolationMonitor()
    _two_batch_example(monitor)
    report = monitor.materialize()
    assert isinstance(report, IsolationReport)
    assert report.batches == 2
    assert report.host_gradient_norm == pytest.approx(7.5)  # (5 + 10) / 2
    assert set(report.seeds) == {"a", "b"}  # c never had a gradient: unmeasured, not zero
    host_per_parameter = 7.5 / math.sqrt(4)
    # Seed a: mean norm (5 + 12) / 2 = 8.5; 4 tensor measurements, 1 vanishing, 1 exploding.
    a = report.seeds["a"]
    assert a.gradient_norm == pytest.approx(8.5)
    assert a.vanishing_fraction == pytest.approx(0.25)
    assert a.exploding_fraction == pytest.approx(0.25)
    assert a.health == pytest.approx(1.0 - 0.25 - 0.5 * 0.25)
    assert a.gradient_ratio == pytest.approx((8.5 / math.sqrt(5)) / host_per_parameter)
    # Seed b: measured in batch 2 only, so its mean is over that one batch.
    assert report.seeds["b"] == SeedGradientHealth(
        gradient_norm=pytest.approx(3.0),
        health=1.0,
        gradient_ratio=pytest.approx((3.0 / math.sqrt(3)) / host_per_parameter),
        vanishing_fraction=0.0,
        exploding_fraction=0.0,
    )


def test_thresholds_are_passed_through() -> None:
    monitor = IsolationMonitor(vanishing_threshold=0.5, exploding_threshold=20.0)
    _two_batch_example(monitor)
    report = monitor.materialize()
    # Seed a: 12 no longer explodes; 0 still vanishes. Seed b: its single tensor (norm 3) is fine.
    assert report.seeds["a"].exploding_fraction == 0.0
    assert report.seeds["a"].vanishing_fraction == pytest.approx(0.25)


def test_materialize_resets() -> None:
    monitor = IsolationMonitor()
    _two_batch_example(monitor)
    monitor.materialize()
    empty = monitor.materialize()
    assert empty.batches == 0 and empty.seeds == {}
    assert math.isnan(empty.host_gradient_norm)
    _two_batch_example(monitor)
    assert monitor.materialize().host_gradient_norm == pytest.approx(7.5)


def test_frozen_host_gives_large_finite_ratio() -> None:
    monitor = IsolationMonitor()
    host = [_param(4)]  # no gradient: the host is frozen
    seed = [_param(4)]
    _set_grads(seed, [[1.0, 1.0, 1.0, 1.0]])
    monitor.accumulate(host, {"r0c0": seed})
    report = monitor.materialize()
    assert report.host_gradient_norm == 0.0
    assert report.seeds["r0c0"].gradient_ratio == pytest.approx((2.0 / 2.0) / RATIO_HOST_FLOOR)


def test_host_norm_matches_get_total_norm_on_a_model() -> None:
    torch.manual_seed(0)
    host = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
    seed = nn.Linear(12, 12)
    monitor = IsolationMonitor()
    expected = []
    for _ in range(3):
        host.zero_grad()
        seed.zero_grad()
        hidden = host[1](host[0](torch.randn(8, 6)))
        hidden = hidden + seed(hidden.detach())
        host[2](hidden).square().mean().backward()
        expected.append(torch.nn.utils.get_total_norm([p.grad for p in host.parameters()]).item())
        monitor.accumulate(host.parameters(), {"r0c0": seed.parameters()})
    report = monitor.materialize()
    assert report.host_gradient_norm == pytest.approx(sum(expected) / 3, rel=1e-6)
    assert report.batches == 3 and set(report.seeds) == {"r0c0"}


def test_accumulate_does_not_sync_and_materialize_syncs_once(sync_calls: list[str]) -> None:
    monitor = IsolationMonitor()
    _two_batch_example(monitor)
    assert sync_calls == []
    monitor.collect()
    assert sync_calls == []
    monitor.materialize()
    assert sync_calls == ["tolist"]


def test_host_on_cpu_and_seeds_on_another_device() -> None:
    monitor = IsolationMonitor(device="meta")
    host = [_param(3), _param(2)]
    seed = [_param(4, device="meta"), _param(1, device="meta")]
    _set_grads(host, [[1.0, 2.0, 3.0], [4.0, 5.0]])
    for param in seed:
        param.grad = torch.ones_like(param)
    monitor.accumulate(host, {"r0c0": seed})
    monitor.accumulate(host, {"r0c0": seed})
    totals = monitor.collect()
    assert totals.batches == 2
    assert totals.host_norm_sum.device.type == "meta"
    assert totals.seed_sums["r0c0"].device.type == "meta" and totals.seed_sums["r0c0"].shape == (3,)


def test_accumulation_device_defaults_to_first_gradient() -> None:
    monitor = IsolationMonitor()
    assert monitor.device is None
    host = [_param(2, device="meta")]
    host[0].grad = torch.ones(2, device="meta")
    seed = [_param(3)]
    _set_grads(seed, [[1.0, 1.0, 1.0]])
    monitor.accumulate(host, {"r0c0": seed})
    assert monitor.device == torch.device("meta")
    assert monitor.collect().seed_sums["r0c0"].device.type == "meta"


def test_bad_thresholds_raise() -> None:
    with pytest.raises(ValueError, match="vanishing_threshold < exploding_threshold"):
        IsolationMonitor(vanishing_threshold=1.0, exploding_threshold=0.5)


def test_accumulated_sums_give_the_report_of_per_batch_accumulation() -> None:
    """Two batches summed elsewhere (host norms 5 + 10; seed a: norms 5 + 12, one vanishing and one exploding
    tensor out of 2 x 2, 5 parameters) report what `accumulate` batch by batch reports (hand-computed above)."""
    monitor = IsolationMonitor()
    monitor.add_accumulated(torch.tensor(15.0), 4, 2, {"a": SeedAccumulation(torch.tensor([17.0, 1.0, 1.0]), 2, 5)})
    report = monitor.materialize()
    assert report.batches == 2
    assert report.host_gradient_norm == pytest.approx(7.5)
    a = report.seeds["a"]
    assert a.gradient_norm == pytest.approx(8.5)
    assert (a.vanishing_fraction, a.exploding_fraction) == (pytest.approx(0.25), pytest.approx(0.25))
    assert a.gradient_ratio == pytest.approx((8.5 / math.sqrt(5)) / (7.5 / math.sqrt(4)))
    with pytest.raises(ValueError, match="batches must be >= 1"):
        monitor.add_accumulated(torch.tensor(1.0), 4, 0, {})
