"""Tests for the running normalizers; expected values come from float64 NumPy or hand computation."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch._dynamo.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from morphogen.control.normalization import (
    RewardNormalizer,
    RunningMeanStd,
    ValueNormalizer,
    merge_moments,
)

EPSILON = 1e-4


def reference_moments(stream: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Pooled mean/variance of the prior (epsilon samples, mean 0, variance 1) and a stream [n, *shape]."""
    n = stream.shape[0]
    data_mean = stream.mean(axis=0)
    data_var = stream.var(axis=0)
    count = epsilon + n
    mean = n * data_mean / count
    # Sum of squared deviations of both groups plus the between-group term, over the total count.
    var = (epsilon * 1.0 + n * data_var + data_mean**2 * epsilon * n / count) / count
    return mean, var, count


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().double().numpy()


@st.composite
def split_streams(draw: st.DrawFn) -> tuple[np.ndarray, list[int]]:
    shape = draw(st.sampled_from([(), (3,)]))
    length = draw(st.integers(min_value=1, max_value=40))
    stream = draw(arrays(np.float64, (length, *shape), elements=st.floats(-1e3, 1e3, allow_nan=False, width=64)))
    cuts = draw(st.lists(st.integers(min_value=1, max_value=length - 1), unique=True)) if length > 1 else []
    return stream, sorted(cuts)


@settings(max_examples=60, deadline=None)
@given(split_streams())
def test_running_mean_std_matches_numpy_for_any_split(case: tuple[np.ndarray, list[int]]) -> None:
    stream, cuts = case
    stats = RunningMeanStd(stream.shape[1:], epsilon=EPSILON)
    for batch in np.split(stream, cuts):
        stats.update(torch.from_numpy(batch))
    mean, var, count = reference_moments(stream, EPSILON)
    np.testing.assert_allclose(to_numpy(stats.mean), mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(to_numpy(stats.var), var, rtol=1e-9, atol=1e-9)
    assert stats.count.item() == pytest.approx(count, rel=1e-12)


def test_fresh_stats_are_the_prior_and_normalize_is_near_identity() -> None:
    stats = RunningMeanStd((2,))
    assert stats.mean.dtype == torch.float64
    x = torch.tensor([[0.5, -2.0]], dtype=torch.float32)
    expected = np.array([[0.5, -2.0]]) / math.sqrt(1.0 + EPSILON)
    np.testing.assert_allclose(to_numpy(stats.normalize(x)), expected, rtol=1e-6)
    assert stats.normalize(x).dtype == torch.float32


def test_update_flattens_all_leading_dimensions() -> None:
    data = np.random.default_rng(0).normal(2.0, 3.0, size=(4, 5, 3))
    stats = RunningMeanStd((3,))
    stats.update(torch.from_numpy(data))
    mean, var, _ = reference_moments(data.reshape(-1, 3), EPSILON)
    np.testing.assert_allclose(to_numpy(stats.mean), mean, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(stats.var), var, rtol=1e-12)


def test_float32_input_uses_its_rounded_values_and_empty_batch_changes_nothing() -> None:
    data = np.random.default_rng(1).normal(0.0, 1.0, size=(64,)).astype(np.float32)
    stats = RunningMeanStd()
    stats.update(torch.from_numpy(data))
    stats.update(torch.empty(0))
    mean, var, count = reference_moments(data.astype(np.float64), EPSILON)
    np.testing.assert_allclose(to_numpy(stats.mean), mean, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(stats.var), var, rtol=1e-12)
    assert stats.count.item() == pytest.approx(count)


def test_merge_moments_with_count_share_is_the_pooled_moments() -> None:
    left, right = np.array([1.0, 2.0, 6.0]), np.array([-4.0, 10.0])
    weight = 2 / 5
    mean, var = merge_moments(
        torch.tensor(left.mean()),
        torch.tensor(left.var()),
        torch.tensor(right.mean()),
        torch.tensor(right.var()),
        weight,
    )
    both = np.concatenate([left, right])
    assert mean.item() == pytest.approx(both.mean(), rel=1e-12)
    assert var.item() == pytest.approx(both.var(), rel=1e-12)


def test_ema_mode_matches_hand_computed_mixture() -> None:
    momentum = 0.25
    stats = RunningMeanStd(epsilon=EPSILON, momentum=momentum)
    # Batch 1, [1, 3]: mean 2, var 1; share 2/(eps+2) > momentum, so it weighs its share.
    w1 = 2 / (EPSILON + 2)
    mean1 = w1 * 2
    var1 = (1 - w1) * 1 + w1 * 1 + w1 * (1 - w1) * (2 - 0) ** 2
    # Batch 2, [10]: var 0; share 1/(eps+3) = 0.33 > momentum still.
    w2 = 1 / (EPSILON + 3)
    mean2 = mean1 + w2 * (10 - mean1)
    var2 = (1 - w2) * var1 + w2 * (1 - w2) * (10 - mean1) ** 2
    # Batch 3, [-2]: share 1/(eps+4) < 0.25, so the EMA weight 0.25 takes over.
    mean3 = 0.75 * mean2 + 0.25 * -2
    var3 = 0.75 * var2 + 0.25 * 0.75 * (-2 - mean2) ** 2
    # Batch 4, [4, 4]: share 2/(eps+6) = 0.33 > 0.25 again, so it weighs its share.
    w4 = 2 / (EPSILON + 6)
    mean4 = mean3 + w4 * (4 - mean3)
    var4 = (1 - w4) * var3 + w4 * (1 - w4) * (4 - mean3) ** 2
    # Batch 5, [0]: share 1/(eps+7) < 0.25.
    mean5 = 0.75 * mean4
    var5 = 0.75 * var4 + 0.25 * 0.75 * mean4**2
    expected = [(mean1, var1), (mean2, var2), (mean3, var3), (mean4, var4), (mean5, var5)]
    batches = [[1.0, 3.0], [10.0], [-2.0], [4.0, 4.0], [0.0]]
    for batch, (mean, var) in zip(batches, expected, strict=True):
        stats.update(torch.tensor(batch, dtype=torch.float64))
        assert stats.mean.item() == pytest.approx(mean, rel=1e-12)
        assert stats.var.item() == pytest.approx(var, rel=1e-12)


def test_normalize_clips_and_denormalize_inverts_inside_the_clip_range() -> None:
    stats = RunningMeanStd((2,), clip=3.0)
    stats.update(torch.tensor([[0.0, 10.0], [2.0, 30.0]], dtype=torch.float64))
    std = np.sqrt(to_numpy(stats.var) + EPSILON)
    far = torch.tensor([[1.0 + 100 * std[0], 20.0 - 100 * std[1]]], dtype=torch.float64)
    np.testing.assert_array_equal(to_numpy(stats.normalize(far)), [[3.0, -3.0]])
    inside = torch.tensor([[1.5, 12.0], [0.2, 25.0]], dtype=torch.float64)
    np.testing.assert_allclose(to_numpy(stats.denormalize(stats.normalize(inside))), to_numpy(inside))
    expected = (to_numpy(inside) - to_numpy(stats.mean)) / std
    np.testing.assert_allclose(to_numpy(stats.normalize(inside)), expected, rtol=1e-12)


def test_wrong_trailing_shape_and_bad_config_raise_value_error() -> None:
    stats = RunningMeanStd((3,))
    with pytest.raises(ValueError, match=r"\[\.\.\., 3\]"):
        stats.normalize(torch.zeros(3, 1))
    with pytest.raises(ValueError, match="shape"):
        stats.update(torch.zeros(()))
    with pytest.raises(ValueError, match="momentum"):
        RunningMeanStd(momentum=0.0)
    with pytest.raises(ValueError, match="epsilon"):
        RunningMeanStd(epsilon=0.0)
    with pytest.raises(TypeError, match="floating"):
        RunningMeanStd(dtype=torch.int64)


def _fitted_stats() -> RunningMeanStd:
    stats = RunningMeanStd((3,))
    stats.update(torch.tensor([[1.0, -5.0, 0.0], [3.0, 5.0, 0.5], [2.0, 0.0, 40.0]]))
    return stats


def test_compiled_normalize_traces_as_one_graph_without_recompiling() -> None:
    stats = _fitted_stats()

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return stats.normalize(x) * 2.0

    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(scaled, fullgraph=True, backend=counter)
    for seed in range(2):
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(seed)) * 20
        torch.testing.assert_close(compiled(x), scaled(x), rtol=0, atol=0)
    # fullgraph=True fails on any graph break; one frame means the device check was a constant.
    assert counter.frame_count == 1


@pytest.mark.slow  # inductor's first C++ build takes ~30 s on a cold cache
def test_inductor_compiled_normalize_equals_eager() -> None:
    stats = _fitted_stats()
    compiled = torch.compile(stats.normalize, fullgraph=True)
    x = torch.randn(7, 3) * 20
    torch.testing.assert_close(compiled(x), stats.normalize(x))


def test_input_on_another_device_moves_stats_with_one_warning() -> None:
    stats = RunningMeanStd((3,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # so only the per-instance rule can keep this to one warning
        stats.update(torch.zeros(4, 3, device="meta"))
        stats.normalize(torch.zeros(4, 3, device="meta"))
        assert {buffer.device.type for buffer in stats.buffers()} == {"meta"}
        # A second migration of the same instance still moves the stats but stays silent.
        stats.to_empty(device="cpu")
        stats.normalize(torch.zeros(4, 3, device="meta"))
        assert {buffer.device.type for buffer in stats.buffers()} == {"meta"}
        assert len(caught) == 1
        RunningMeanStd((3,)).normalize(torch.zeros(3, device="meta"))  # another instance warns again
    assert len(caught) == 2
    assert all(issubclass(warning.category, UserWarning) for warning in caught)
    assert "strict_device=True" in str(caught[0].message)
    assert ".to(device)" in str(caught[0].message)


def test_strict_device_raises_and_moves_nothing() -> None:
    normalizers: list[RunningMeanStd | ValueNormalizer | RewardNormalizer] = [
        RunningMeanStd((3,), strict_device=True),
        ValueNormalizer(strict_device=True),
        RewardNormalizer(3, strict_device=True),
    ]
    meta = torch.zeros(3, device="meta")
    for normalizer in normalizers:
        with pytest.raises(ValueError, match=r"\.to\('meta'\)"):
            normalizer.normalize(meta)
        assert {buffer.device.type for buffer in normalizer.buffers()} == {"cpu"}


def test_reward_normalizer_moves_its_returns_too() -> None:
    normalizer = RewardNormalizer(2)
    with pytest.warns(UserWarning, match="RewardNormalizer"):
        normalizer.update(torch.zeros(2, device="meta"), torch.zeros(2, dtype=torch.bool, device="meta"))
    assert {buffer.device.type for buffer in normalizer.buffers()} == {"meta"}


def test_reward_normalizer_hand_computed_two_envs_with_a_done() -> None:
    gamma = 0.5
    normalizer = RewardNormalizer(2, gamma=gamma, dtype=torch.float64)
    rewards = [[1.0, 2.0], [1.0, 0.0], [2.0, 4.0]]
    dones = [[False, False], [True, False], [False, False]]
    # Returns by hand: t0 [1, 2]; t1 [0.5*1+1, 0.5*2+0] = [1.5, 1]; env 0 is done, so it restarts:
    # t2 [0+2, 0.5*1+4] = [2, 4.5].
    returns_by_step = [[1.0, 2.0], [1.5, 1.0], [2.0, 4.5]]
    seen: list[float] = []
    for step in range(3):
        scaled = normalizer.update(torch.tensor(rewards[step], dtype=torch.float32), torch.tensor(dones[step]))
        seen.extend(returns_by_step[step])
        _, var, _ = reference_moments(np.array(seen), EPSILON)
        expected = np.array(rewards[step]) / np.sqrt(var + EPSILON)
        np.testing.assert_allclose(to_numpy(scaled), expected, rtol=1e-6)
        assert scaled.dtype == torch.float32
    np.testing.assert_array_equal(to_numpy(normalizer.returns), [2.0, 4.5])
    normalizer.reset()
    np.testing.assert_array_equal(to_numpy(normalizer.returns), [0.0, 0.0])


def test_reward_normalizer_clips_and_checks_shapes() -> None:
    normalizer = RewardNormalizer(2, clip=10.0)
    scaled = normalizer.normalize(torch.tensor([1e6, -1e6]))
    np.testing.assert_array_equal(to_numpy(scaled), [10.0, -10.0])
    with pytest.raises(ValueError, match=r"dones of shape \[n_envs\] = \[2\]"):
        normalizer.update(torch.zeros(2), torch.zeros(3))


def test_value_normalizer_stats_match_numpy_and_round_trip() -> None:
    targets = np.random.default_rng(2).normal(50.0, 8.0, size=(16, 4))
    values = torch.from_numpy(targets[:3])
    for center in (True, False):
        normalizer = ValueNormalizer(center=center)
        normalizer.update(torch.from_numpy(targets))
        mean, var, _ = reference_moments(targets.reshape(-1), EPSILON)
        assert normalizer.stats.mean.item() == pytest.approx(float(mean), rel=1e-12)
        assert normalizer.stats.var.item() == pytest.approx(float(var), rel=1e-12)
        shift = float(mean) if center else 0.0
        expected = (targets[:3] - shift) / np.sqrt(var + EPSILON)
        np.testing.assert_allclose(to_numpy(normalizer.normalize(values)), expected, rtol=1e-12)
        # Values far out of range are not clipped, so the round trip holds everywhere.
        far = torch.tensor([1e4, -1e4], dtype=torch.float64)
        torch.testing.assert_close(normalizer.denormalize(normalizer.normalize(far)), far)


def test_state_dict_round_trip_reproduces_outputs() -> None:
    rng = np.random.default_rng(3)
    observations = torch.from_numpy(rng.normal(size=(10, 3)))
    source_stats, target_stats = RunningMeanStd((3,), momentum=0.1), RunningMeanStd((3,), momentum=0.1)
    source_stats.update(observations)
    target_stats.load_state_dict(source_stats.state_dict())
    torch.testing.assert_close(target_stats.normalize(observations), source_stats.normalize(observations))

    source_values, target_values = ValueNormalizer(), ValueNormalizer()
    source_values.update(observations)
    target_values.load_state_dict(source_values.state_dict())
    torch.testing.assert_close(target_values.normalize(observations), source_values.normalize(observations))

    source_rewards, target_rewards = RewardNormalizer(3), RewardNormalizer(3)
    dones = torch.tensor([False, True, False])
    for row in observations[:5]:
        source_rewards.update(row, dones)
    assert set(source_rewards.state_dict()) == {"returns", "stats.mean", "stats.var", "stats.count"}
    target_rewards.load_state_dict(source_rewards.state_dict())
    # Carried returns make the next updates agree too, not only the current scale.
    for row in observations[5:]:
        torch.testing.assert_close(target_rewards.update(row, dones), source_rewards.update(row, dones))


@pytest.mark.parametrize("momentum", [None, 0.1])
def test_compiled_update_and_normalize_run_as_one_graph_and_match_eager(momentum: float | None) -> None:
    """`update` (the Welford or EMA merge, in place on the buffers) and `normalize` trace without a graph
    break (fullgraph=True raises on one) and leave the same statistics as eager calls."""
    eager, traced = RunningMeanStd((3,), momentum=momentum), RunningMeanStd((3,), momentum=momentum)

    def step(stats: RunningMeanStd, batch: torch.Tensor) -> torch.Tensor:
        stats.update(batch)
        return stats.normalize(batch)

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    for seed in range(3):
        batch = torch.randn(6, 3, generator=torch.Generator().manual_seed(seed)) * (seed + 1) + seed
        torch.testing.assert_close(compiled(traced, batch), step(eager, batch), rtol=0, atol=0)
    for name in ("mean", "var", "count"):
        torch.testing.assert_close(getattr(traced, name), getattr(eager, name), rtol=0, atol=0)


def test_value_and_reward_normalizers_trace_without_graph_breaks() -> None:
    values, rewards = ValueNormalizer(), RewardNormalizer(4)

    def value_step(targets: torch.Tensor) -> torch.Tensor:
        values.update(targets)
        return values.denormalize(values.normalize(targets))

    def reward_step(raw: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
        return rewards.update(raw, dones)

    targets = torch.tensor([1.0, -2.0, 3.0, 0.5])
    torch.testing.assert_close(torch.compile(value_step, fullgraph=True, backend="eager")(targets), targets)
    scaled = torch.compile(reward_step, fullgraph=True, backend="eager")(targets, torch.zeros(4, dtype=torch.bool))
    assert scaled.shape == (4,) and bool(torch.isfinite(scaled).all())
