"""Gradient statistics: oracle norms, low-precision safety, mixed devices, counts, pure formulas."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from morphogen.telemetry.gradients import (
    DEFAULT_EXPLODING_THRESHOLD,
    DEFAULT_VANISHING_THRESHOLD,
    RATIO_HOST_FLOOR,
    clip_gradients,
    global_gradient_norm,
    gradient_ratio,
    group_gradient_stats,
    health_score,
)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 3))


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 5 * 5, 4)
    )


def _partly_frozen() -> nn.Module:
    model = nn.Sequential(nn.Linear(5, 9), nn.Tanh(), nn.LayerNorm(9), nn.Linear(9, 2))
    model[0].requires_grad_(False)  # their .grad stays None and must be skipped
    return model


@pytest.mark.parametrize(
    ("build", "input_shape"),
    [(_mlp, (11, 7)), (_cnn, (6, 3, 5, 5)), (_partly_frozen, (4, 5))],
    ids=["mlp", "cnn", "partly_frozen"],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_norm_equals_get_total_norm(
    build: Callable[[], nn.Module], input_shape: tuple[int, ...], seed: int
) -> None:
    torch.manual_seed(seed)
    model = build()
    (model(torch.randn(input_shape)) ** 2).mean().backward()
    params = list(model.parameters())
    grads = [param.grad for param in params if param.grad is not None]
    expected = torch.nn.utils.get_total_norm(grads)
    stats = group_gradient_stats(params)
    torch.testing.assert_close(global_gradient_norm(params), expected, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(stats.norm, expected, rtol=1e-6, atol=0.0)
    assert stats.norm.dtype == torch.float32 and stats.norm.shape == ()
    assert stats.n_tensors == len(grads)
    assert stats.n_parameters == sum(grad.numel() for grad in grads)


def test_float16_gradients_do_not_overflow() -> None:
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(n, generator=generator) * 1e3 for n in (20000, 5000, 300)]
    params = [torch.zeros(g.shape, dtype=torch.float16, requires_grad=True) for g in grads]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad.to(torch.float16)
    float64_reference = math.sqrt(sum(float(np.sum(p.grad.double().numpy() ** 2)) for p in params))
    # The contrast: squaring and summing in float16 overflows (pitfall 5).
    naive = sum(((p.grad * p.grad).sum() for p in params), torch.zeros((), dtype=torch.float16))
    assert torch.isinf(naive)
    norm = global_gradient_norm(params)
    assert norm.dtype == torch.float32 and torch.isfinite(norm)
    assert norm.item() == pytest.approx(float64_reference, rel=1e-3)


def test_mixed_dtypes_in_one_group() -> None:
    values = {torch.float16: [3.0, 4.0], torch.float64: [12.0], torch.float32: [0.0, 84.0]}
    params = []
    for dtype, grad in values.items():
        param = torch.zeros(len(grad), dtype=dtype, requires_grad=True)
        param.grad = torch.tensor(grad, dtype=dtype)
        params.append(param)
    stats = group_gradient_stats(params)
    # sqrt(3² + 4² + 12² + 84²) = sqrt(9 + 16 + 144 + 7056) = sqrt(7225) = 85
    assert stats.norm.item() == pytest.approx(85.0, rel=1e-6)
    assert stats.exploding.item() == 2  # 12 and 84 exceed 10; the fp16 tensor has norm 5


def test_mixed_devices_move_norms_to_one_device() -> None:
    on_cpu = torch.zeros(4, requires_grad=True)
    on_cpu.grad = torch.ones(4)
    on_meta = torch.zeros(3, device="meta", requires_grad=True)
    on_meta.grad = torch.ones(3, device="meta")
    stats = group_gradient_stats([on_cpu, on_meta], device="meta")
    assert stats.norm.device.type == "meta" and stats.norm.shape == ()
    assert stats.vanishing.device.type == "meta" and stats.exploding.device.type == "meta"
    assert (stats.n_tensors, stats.n_parameters) == (2, 7)
    # Without `device`, the first gradient's device is used.
    assert group_gradient_stats([on_meta, on_cpu]).norm.device.type == "meta"
    assert group_gradient_stats([on_cpu]).norm.device.type == "cpu"


def test_vanishing_and_exploding_counts() -> None:
    magnitudes = [0.0, 1e-8, 5e-7, 0.5, 10.0, 11.0, math.inf, math.nan]
    params = []
    for magnitude in magnitudes:
        param = torch.zeros(1, requires_grad=True)
        param.grad = torch.tensor([-magnitude])
        params.append(param)
    stats = group_gradient_stats(params)
    assert stats.vanishing.item() == 2  # 0 and 1e-8 are below 1e-7
    assert (
        stats.exploding.item() == 3
    )  # 11, inf, and nan (non-finite counts as exploding); 10 is not above 10
    assert stats.vanishing.dtype == torch.int64
    tight = group_gradient_stats(params, vanishing_threshold=1e-6, exploding_threshold=0.25)
    assert tight.vanishing.item() == 3
    assert tight.exploding.item() == 5


def test_parameters_without_gradient_are_skipped_and_empty_group_is_zero() -> None:
    no_grad = torch.zeros(5, requires_grad=True)
    stats = group_gradient_stats([no_grad])
    assert stats.norm.item() == 0.0 and stats.vanishing.item() == 0 and stats.exploding.item() == 0
    assert (stats.n_tensors, stats.n_parameters) == (0, 0)
    assert stats.norm.device.type == "cpu"
    assert group_gradient_stats([], device="meta").norm.device.type == "meta"


def test_default_thresholds() -> None:
    assert DEFAULT_VANISHING_THRESHOLD == 1e-7
    assert DEFAULT_EXPLODING_THRESHOLD == 10.0


@pytest.mark.parametrize(("vanishing", "exploding"), [(-1.0, 10.0), (1.0, 1.0), (2.0, 1.0)])
def test_bad_thresholds_raise(vanishing: float, exploding: float) -> None:
    with pytest.raises(ValueError, match="vanishing_threshold < exploding_threshold"):
        group_gradient_stats([], vanishing_threshold=vanishing, exploding_threshold=exploding)


def test_group_stats_do_not_sync(sync_calls: list[str]) -> None:
    params = []
    for size in (3, 8, 1):
        param = torch.zeros(size, requires_grad=True)
        param.grad = torch.full((size,), 2.0)
        params.append(param)
    stats = group_gradient_stats(params)
    assert sync_calls == []
    assert stats.norm.item() == pytest.approx(math.sqrt(4.0 * 12))


@pytest.mark.parametrize(
    ("vanishing_fraction", "exploding_fraction", "expected"),
    [(0.0, 0.0, 1.0), (0.0, 0.3, 0.7), (0.6, 0.0, 0.7), (0.5, 0.25, 0.5), (1.0, 0.0, 0.5), (0.5, 1.0, 0.0)],
)
def test_health_score(vanishing_fraction: float, exploding_fraction: float, expected: float) -> None:
    assert health_score(vanishing_fraction, exploding_fraction) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("vanishing_fraction", "exploding_fraction"), [(-0.1, 0.0), (0.0, 1.5), (math.nan, 0.0)]
)
def test_health_score_rejects_non_fractions(vanishing_fraction: float, exploding_fraction: float) -> None:
    with pytest.raises(ValueError, match=r"must be a fraction in \[0, 1\]"):
        health_score(vanishing_fraction, exploding_fraction)


def test_gradient_ratio() -> None:
    # seed 6 / sqrt(4) = 3 per parameter; host 2 / sqrt(16) = 0.5 per parameter.
    assert gradient_ratio(6.0, 4, 2.0, 16) == pytest.approx(6.0)
    assert gradient_ratio(0.0, 4, 2.0, 16) == 0.0
    # A host without gradient: the floor replaces a division by zero.
    assert gradient_ratio(6.0, 4, 0.0, 16) == pytest.approx(3.0 / RATIO_HOST_FLOOR)
    assert gradient_ratio(6.0, 4, 0.0, 0) == pytest.approx(3.0 / RATIO_HOST_FLOOR)
    assert gradient_ratio(0.0, 0, 0.0, 0) == 0.0
    assert math.isnan(gradient_ratio(math.nan, 4, 2.0, 16))
    with pytest.raises(ValueError, match="seed_norm must be a non-negative"):
        gradient_ratio(-1.0, 4, 2.0, 16)
    with pytest.raises(ValueError, match="host_parameters must be a non-negative"):
        gradient_ratio(1.0, 4, 2.0, -16)


def _peak_allocated_bytes(function: Callable[[], object]) -> int:
    """Peak of the CPU bytes allocated, and not yet freed, while `function` runs.

    With `profile_memory=True` the profiler records every allocation and free of torch's CPU
    allocator with its size (negative for frees). Summing them in time order gives the memory the
    call holds at each moment; its maximum is the call's peak extra memory. Unlike the process RSS
    this is exact, counts nothing allocated before the call, and does not depend on malloc reusing pages.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        function()
    pending = list(profiler.profiler.kineto_results.experimental_event_tree())
    sizes: list[tuple[int, int]] = []
    while pending:
        node = pending.pop()
        pending.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
    running = peak = 0
    for _, size in sorted(sizes):
        running += size
        peak = max(peak, running)
    return peak


def test_statistics_of_20m_parameters_allocate_under_one_percent_of_the_gradients() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(2048, 2048) for _ in range(5)))  # 5 x (2048² + 2048) ~ 21M parameters
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    params = list(model.parameters())
    gradient_bytes = sum(param.grad.numel() * param.grad.element_size() for param in params)
    assert sum(param.numel() for param in params) > 20_000_000
    peak = _peak_allocated_bytes(lambda: group_gradient_stats(params))
    assert 0 < peak < 0.01 * gradient_bytes
    # The contrast that shows the measurement sees allocations: a cat of all gradients (pitfall 6).
    concatenated = _peak_allocated_bytes(lambda: torch.cat([param.grad.flatten() for param in params]).norm())
    assert concatenated >= gradient_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_clipping_with_the_groups_norm_scales_the_gradients_as_torch_does(dtype: torch.dtype) -> None:
    """`clip_gradients(params, max_norm, stats.clip_norm)` leaves the gradients of `clip_grad_norm_` bit for bit: with
    the group's norm where it is torch's own (float32 gradients), and computing torch's where it is not (the
    float32 norm of bfloat16 gradients, or float64 ones, is another number than the one torch clips by)."""
    torch.manual_seed(0)
    model = _cnn().to(dtype)
    (model(torch.randn(6, 3, 5, 5, dtype=dtype)) ** 2).sum().backward()
    params = list(model.parameters())
    twins = [nn.Parameter(param.detach().clone()) for param in params]
    for twin, param in zip(twins, params, strict=True):
        twin.grad = None if param.grad is None else param.grad.clone()
    torch.nn.utils.clip_grad_norm_(twins, 0.5, foreach=True)
    stats = group_gradient_stats(params)
    assert (stats.clip_norm is stats.norm) if dtype == torch.float32 else stats.clip_norm is None
    assert float(stats.norm) > 0.5  # the clip scales them
    clip_gradients(params, 0.5, stats.clip_norm)
    for param, twin in zip(params, twins, strict=True):
        assert param.grad is not None and twin.grad is not None and torch.equal(param.grad, twin.grad)
