"""PPO maths against hand-computed answers, the update on a fixed batch, and training on Gymnasium envs."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from morphogen.control.distributed import RankShare
from morphogen.control.gym_training import train_gym
from morphogen.control.policy import FactoredLSTMPolicy
from morphogen.control.ppo import (
    PPOConfig,
    annealed_coefficient,
    build_optimizer,
    clipped_surrogate_loss,
    entropy_bonus,
    explained_variance,
    ppo_losses,
    ppo_update,
    value_loss,
)
from morphogen.control.rollout import RolloutBatch, RolloutBuffer, generalized_advantage_estimation

# ----------------------------------------------------------------------------------------------
# Pure maths


def test_gae_with_one_truncation_and_one_termination() -> None:
    as_columns = lambda rows: torch.tensor(rows, dtype=torch.float64).T  # noqa: E731  [env][t] -> [T, B]
    rewards = as_columns([[1, 2, 3, 4], [0, 1, 0, 1]])
    values = as_columns([[0.5, 1.0, 1.5, 2.0], [1, 2, 1, 0.5]])
    # env 0 is truncated at t=1: next_values[1] = V(final observation) = 10.
    # env 1 terminates at t=2: its next value 7 belongs to the next episode and must not count.
    next_values = as_columns([[1.0, 10.0, 2.0, 3.0], [2, 1, 7, 4]])
    terminated = as_columns([[0, 0, 0, 0], [0, 0, 1, 0]]).bool()
    truncated = as_columns([[0, 1, 0, 0], [0, 0, 0, 0]]).bool()
    advantages, returns = generalized_advantage_estimation(
        rewards, values, next_values, terminated, truncated, gamma=0.9, gae_lambda=0.8
    )
    # By hand, gamma * lambda = 0.72.
    # env 0: deltas 1 + 0.9 - 0.5 = 1.4, 2 + 9 - 1 = 10, 3 + 1.8 - 1.5 = 3.3, 4 + 2.7 - 2 = 4.7
    #        A3 = 4.7, A2 = 3.3 + 0.72 * 4.7 = 6.684, A1 = 10 (cut), A0 = 1.4 + 0.72 * 10 = 8.6
    # env 1: deltas 0 + 1.8 - 1 = 0.8, 1 + 0.9 - 2 = -0.1, 0 + 0 - 1 = -1, 1 + 3.6 - 0.5 = 4.1
    #        A3 = 4.1, A2 = -1 (cut), A1 = -0.1 - 0.72 = -0.82, A0 = 0.8 - 0.72 * 0.82 = 0.2096
    expected_advantages = [[8.6, 10.0, 6.684, 4.7], [0.2096, -0.82, -1.0, 4.1]]
    expected_returns = [[9.1, 11.0, 8.184, 6.7], [1.2096, 1.18, 0.0, 4.6]]
    torch.testing.assert_close(advantages.T, torch.tensor(expected_advantages, dtype=torch.float64))
    torch.testing.assert_close(returns.T, torch.tensor(expected_returns, dtype=torch.float64))


def test_gae_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="rewards"):
        generalized_advantage_estimation(
            torch.zeros(3, 2),
            torch.zeros(4, 2),
            torch.zeros(4, 2),
            torch.zeros(4, 2, dtype=torch.bool),
            torch.zeros(4, 2, dtype=torch.bool),
            0.9,
            0.9,
        )


def test_clipped_surrogate_per_head_against_hand_values() -> None:
    log = math.log
    new = torch.tensor([[log(0.6), log(0.5)], [log(0.3), log(0.9)]], dtype=torch.float64)
    old = torch.tensor([[log(0.4), log(0.5)], [log(0.5), log(0.1)]], dtype=torch.float64)
    relevant = torch.tensor([[True, True], [True, False]])
    advantages = torch.tensor([2.0, -1.0], dtype=torch.float64)
    result = clipped_surrogate_loss(new, old, advantages, relevant, clip_range=0.2)
    # sample 0: ratios 1.5 and 1.0, A = 2: min(3, 2.4) + min(2, 2) = 4.4
    # sample 1: ratio 0.6 on head 0, A = -1: min(-0.6, -0.8) = -0.8; head 1 (ratio 9) does not matter.
    assert result.loss.item() == pytest.approx(-(4.4 - 0.8) / 2, abs=1e-12)
    # Clipped: sample 0 head 0 (|0.5| > 0.2) and sample 1 head 0 (|-0.4| > 0.2), of 3 relevant pairs.
    assert result.clip_fraction.item() == pytest.approx(2 / 3)
    # Joint ratios 1.5 and 0.6: ((1.5 - 1) - ln 1.5 + (0.6 - 1) - ln 0.6) / 2
    assert result.approx_kl.item() == pytest.approx((0.5 - log(1.5) - 0.4 - log(0.6)) / 2, abs=1e-12)


def test_approximate_kl_of_a_ratio_a_hair_from_one_is_not_below_zero() -> None:
    """(r - 1) - ln r >= 0 for every r; at ln r = -1e-7 in float32 `exp(ln r) - 1` rounded to -1.19e-7 and the
    estimate to -1.9e-8, which the round line printed as "kl -0.0000". The float64 value is 1e-14 / 2."""
    new, old = torch.zeros(1, 1), torch.full((1, 1), 1e-7)
    result = clipped_surrogate_loss(new, old, torch.ones(1), torch.ones(1, 1, dtype=torch.bool), 0.2)
    assert 0.0 <= result.approx_kl.item() <= 1e-13
    assert f"{result.approx_kl.item():.4f}" == "0.0000"


def test_clipped_surrogate_gradient_equals_the_joint_policy_gradient_at_ratio_one() -> None:
    log_probs = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    advantages = torch.tensor([1.5, -2.0])
    result = clipped_surrogate_loss(log_probs, log_probs.detach(), advantages, torch.ones(2, 2, dtype=torch.bool), 0.2)
    result.loss.backward()
    assert log_probs.grad is not None
    # d/dlogp of -mean(sum_h r_h A) at r = 1 is -A / N for every head.
    torch.testing.assert_close(log_probs.grad, torch.tensor([[-0.75, -0.75], [1.0, 1.0]]))


def test_value_loss_plain_and_clipped() -> None:
    values, old, returns = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 2.5]), torch.tensor([2.0, 0.0])
    assert value_loss(values, old, returns).item() == pytest.approx((1 + 4) / 2)
    # clipped predictions 0.7 and 2.3: max(1, 1.69) and max(4, 5.29)
    assert value_loss(values, old, returns, clip_range=0.2).item() == pytest.approx((1.69 + 5.29) / 2)


def test_entropy_bonus_and_annealing() -> None:
    entropies = torch.tensor([[1.0, 0.5], [0.2, 0.0]])
    assert entropy_bonus(entropies).item() == pytest.approx((1.5 + 0.2) / 2)
    assert entropy_bonus(entropies, torch.tensor([1.0, 2.0])).item() == pytest.approx((2.0 + 0.2) / 2)
    assert annealed_coefficient(0.05, 0.01, 0.5) == pytest.approx(0.03)
    assert annealed_coefficient(0.05, 0.01, 2.0) == pytest.approx(0.01)
    assert annealed_coefficient(0.05, None, 0.7) == 0.05
    assert PPOConfig(entropy_coef=0.1, entropy_anneal_to=0.0).entropy_coef_at(0.25) == pytest.approx(0.075)


def test_explained_variance() -> None:
    returns = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(returns, returns).item() == pytest.approx(1.0)
    assert explained_variance(torch.zeros(3), returns).item() == pytest.approx(0.0)
    # residuals [0, 0, 1]: var 2/9 against var(returns) 2/3
    assert explained_variance(torch.tensor([1.0, 2.0, 2.0]), returns).item() == pytest.approx(1 - 1 / 3)
    assert math.isnan(explained_variance(torch.zeros(3), torch.ones(3)).item())


# ----------------------------------------------------------------------------------------------
# Configuration


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("learning_rate", 0.0),
        ("gamma", 1.5),
        ("gae_lambda", -0.1),
        ("clip_range", 0.0),
        ("value_coef", -1.0),
        ("value_clip_range", 0.0),
        ("entropy_coef", float("nan")),
        ("entropy_head_weights", (1.0, -1.0)),
        ("entropy_anneal_to", -0.01),
        ("max_grad_norm", 0.0),
        ("target_kl", 0.0),
        ("epochs", 0),
        ("minibatches", True),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"PPOConfig.{field} must be"):
        PPOConfig(**{field: value})  # type: ignore[arg-type]


def test_config_defaults_and_list_weights() -> None:
    config = PPOConfig(entropy_head_weights=[1, 0.5])  # type: ignore[arg-type]
    assert config.entropy_head_weights == (1.0, 0.5)
    default = PPOConfig()
    assert (default.learning_rate, default.gamma, default.gae_lambda, default.clip_range) == (3e-4, 0.995, 0.98, 0.2)
    assert (default.value_coef, default.entropy_coef, default.max_grad_norm, default.target_kl) == (
        0.5,
        0.05,
        5.0,
        0.015,
    )
    assert default.normalize_advantages and default.epochs == 4


# ----------------------------------------------------------------------------------------------
# The update

RELEVANCE = torch.tensor([[True, False], [True, True], [True, True]])


def make_policy(seed: int = 0) -> FactoredLSTMPolicy:
    torch.manual_seed(seed)
    return FactoredLSTMPolicy(4, (3, 2), hidden_size=16, head_relevance=RELEVANCE)


def collect_batch(policy: FactoredLSTMPolicy, steps: int = 8, envs: int = 4, seed: int = 0) -> RolloutBatch:
    """A rollout of random observations and rewards that favour op 1 and head-1 value 1."""
    generator = torch.Generator().manual_seed(seed)
    buffer = RolloutBuffer(steps, envs, 4, 2, 16, mask_shapes=[(3,), (3, 2)])
    state = policy.initial_state(envs)
    buffer.reset(state)
    starts = torch.ones(envs, dtype=torch.bool)
    for _ in range(steps):
        observation = torch.randn(envs, 4, generator=generator)
        masks = [torch.tensor([True, True, False]).expand(envs, 3), torch.ones(envs, 3, 2, dtype=torch.bool)]
        action = policy.act(observation, state, masks, generator=generator, episode_starts=starts)
        reward = (action.actions[:, 0] == 1).float() + (action.actions[:, 1] == 1).float()
        terminated = torch.rand(envs, generator=generator) < 0.2
        buffer.add(
            observation, starts, action, reward, terminated, torch.zeros(envs, dtype=torch.bool), action_masks=masks
        )
        state, starts = action.state, terminated
    return buffer.finish(policy.predict_value(observation, state, episode_starts=starts), gamma=0.9, gae_lambda=0.9)


def test_chunks_of_a_rollout_re_run_from_the_states_acting_had() -> None:
    """Truncated BPTT: each 2-step chunk, re-run from the LSTM state acting had at its start, gives back the
    log-probs and values of acting, episode starts inside the chunks included."""
    policy = make_policy()
    batch = collect_batch(policy, steps=8, envs=3)
    chunks = batch.in_chunks(2)
    assert chunks.actions.shape[:2] == (2, 12) and chunks.initial_state[0].shape == (1, 12, 16)
    # Chunk k of env b is sequence k * 3 + b.
    assert torch.equal(chunks.actions[:, 1 * 3 + 2], batch.actions[2:4, 2])
    assert torch.equal(chunks.advantages[:, 3 * 3 + 0], batch.advantages[6:8, 0])
    evaluation = policy.evaluate_sequence(chunks.observations, chunks.initial_state, chunks.episode_starts,
                                          chunks.actions, chunks.action_masks)
    torch.testing.assert_close(evaluation.log_prob, chunks.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(evaluation.value, chunks.values, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="must divide"):
        batch.in_chunks(3)


def test_update_reduces_the_loss_on_a_fixed_batch() -> None:
    policy = make_policy()
    batch = collect_batch(policy)
    config = PPOConfig(learning_rate=1e-3, target_kl=None, normalize_advantages=False, minibatches=2)
    before = ppo_losses(policy, batch, config, config.entropy_coef).total.item()
    statistics = ppo_update(
        policy, build_optimizer(policy, config), batch, config, 0.0, generator=torch.Generator().manual_seed(0)
    )
    after = ppo_losses(policy, batch, config, config.entropy_coef).total.item()
    assert after < before
    assert statistics.epochs_completed == 4 and not statistics.early_stopped
    assert len(statistics.entropy_per_head) == 2 and all(e > 0 for e in statistics.entropy_per_head)
    assert statistics.grad_norm > 0 and 0 <= statistics.clip_fraction <= 1 and statistics.approx_kl >= 0


def test_kl_early_stop_with_a_tiny_target() -> None:
    policy = make_policy()
    batch = collect_batch(policy)
    config = PPOConfig(learning_rate=1e-2, target_kl=1e-6, epochs=10, minibatches=2)
    statistics = ppo_update(policy, build_optimizer(policy, config), batch, config, 0.0)
    assert statistics.early_stopped
    assert statistics.epochs_completed < 10
    assert statistics.approx_kl > 1e-6


def test_update_is_reproducible_with_a_generator() -> None:
    batch = collect_batch(make_policy())
    config = PPOConfig(minibatches=4, target_kl=None)
    results = []
    for _ in range(2):
        policy = make_policy()
        ppo_update(
            policy, build_optimizer(policy, config), batch, config, 0.3, generator=torch.Generator().manual_seed(7)
        )
        results.append(torch.cat([p.detach().flatten() for p in policy.parameters()]))
    assert torch.equal(results[0], results[1])


def test_update_rejects_configs_that_do_not_fit_the_batch() -> None:
    policy = make_policy()
    batch = collect_batch(policy, envs=2)
    optimizer = build_optimizer(policy, PPOConfig())
    with pytest.raises(ValueError, match="minibatches=3"):
        ppo_update(policy, optimizer, batch, PPOConfig(minibatches=3), 0.0)
    with pytest.raises(ValueError, match="entropy_head_weights"):
        ppo_update(policy, optimizer, batch, PPOConfig(entropy_head_weights=(1.0, 1.0, 1.0)), 0.0)


# ----------------------------------------------------------------------------------------------
# Gymnasium


class MatchTargetEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """Each step shows a target pair (a, b) one-hot; reward 1 per action component that matches it.

    The MultiDiscrete space has non-zero starts, so the trainer's offset handling is exercised, and
    every episode is truncated after 8 steps, so its bootstrap is too. Random play earns
    8 * (1/3 + 1/4) = 4.67 per episode, perfect play 16.
    """

    def __init__(self) -> None:
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (7,), dtype=np.float32)
        self.action_space = gymnasium.spaces.MultiDiscrete([3, 4], start=[1, -2])
        self.target = np.zeros(2, dtype=np.int64)
        self.steps = 0

    def _observation(self) -> np.ndarray:
        self.target = self.np_random.integers([0, 0], [3, 4])
        observation = np.zeros(7, dtype=np.float32)
        observation[self.target[0]] = 1.0
        observation[3 + self.target[1]] = 1.0
        return observation

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.steps = 0
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = float(np.sum(np.asarray(action) - self.action_space.start == self.target))
        self.steps += 1
        return self._observation(), reward, False, self.steps >= 8, {}


MATCH_TARGET_ID = "morphogen-tests/MatchTarget-v0"
if MATCH_TARGET_ID not in gymnasium.registry:
    gymnasium.register(id=MATCH_TARGET_ID, entry_point=MatchTargetEnv)


def test_train_gym_learns_a_multidiscrete_task() -> None:
    config = PPOConfig(learning_rate=1e-3, entropy_coef=0.01, gamma=0.9, gae_lambda=0.9, minibatches=2)
    returns = train_gym(MATCH_TARGET_ID, total_steps=3000, seed=0, config=config, rollout_length=32).returns
    random_play = 8 * (1 / 3 + 1 / 4)
    assert np.mean(returns[:20]) < random_play + 2.5
    assert np.mean(returns[-20:]) > random_play + 5


def test_train_gym_learns_a_multidiscrete_task_with_a_feed_forward_policy() -> None:
    config = PPOConfig(learning_rate=1e-3, entropy_coef=0.01, gamma=0.9, gae_lambda=0.9, minibatches=2)
    training = train_gym(MATCH_TARGET_ID, total_steps=3000, seed=0, config=config, rollout_length=32, recurrent=False)
    assert training.policy.lstm is None
    random_play = 8 * (1 / 3 + 1 / 4)
    assert np.mean(training.returns[:20]) < random_play + 2.5
    assert np.mean(training.returns[-20:]) > random_play + 5


def test_train_gym_is_reproducible_from_its_seed() -> None:
    first = train_gym(MATCH_TARGET_ID, total_steps=256, seed=3, rollout_length=16)
    second = train_gym(MATCH_TARGET_ID, total_steps=256, seed=3, rollout_length=16)
    other = train_gym(MATCH_TARGET_ID, total_steps=256, seed=4, rollout_length=16)
    assert len(first.returns) == 256 // 8
    # 4 envs end their 8-step episodes together, every 32 steps taken over all of them.
    assert first.end_steps == [step for step in range(32, 257, 32) for _ in range(4)]
    assert first.returns == second.returns
    assert first.returns != other.returns
    for a, b in zip(first.policy.parameters(), second.policy.parameters(), strict=True):
        assert torch.equal(a, b)


class _CountedEnv(MatchTargetEnv):
    """MatchTarget whose third construction fails; counts the instances made and closed."""

    made: int = 0
    closed: int = 0

    def __init__(self) -> None:
        if _CountedEnv.made == 2:
            raise RuntimeError("no third env")
        _CountedEnv.made += 1
        super().__init__()

    def close(self) -> None:
        _CountedEnv.closed += 1


def test_train_gym_closes_the_envs_it_made_when_a_later_one_fails() -> None:
    gymnasium.register(id="morphogen-tests/Counted-v0", entry_point=_CountedEnv)
    try:
        with pytest.raises(RuntimeError, match="no third env"):
            train_gym("morphogen-tests/Counted-v0", total_steps=10, n_envs=3)
    finally:
        del gymnasium.registry["morphogen-tests/Counted-v0"]
    assert (_CountedEnv.made, _CountedEnv.closed) == (2, 2)


def test_train_gym_passes_its_env_kwargs_to_every_env() -> None:
    made: list[dict[str, Any]] = []

    class Configured(MatchTargetEnv):
        def __init__(self, **kwargs: Any) -> None:
            made.append(kwargs)
            super().__init__()

    gymnasium.register(id="morphogen-tests/Configured-v0", entry_point=Configured)
    try:
        train_gym("morphogen-tests/Configured-v0", total_steps=16, n_envs=2, rollout_length=8,
                  env_kwargs={"level": 3})
    finally:
        del gymnasium.registry["morphogen-tests/Configured-v0"]
    assert made == [{"level": 3}, {"level": 3}]


@pytest.mark.parametrize(("env_id", "message"), [("Pendulum-v1", "Discrete"), ("FrozenLake-v1", "Box observation")])
def test_train_gym_rejects_unsupported_spaces(env_id: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        train_gym(env_id, total_steps=10)


@pytest.mark.slow
def test_train_gym_solves_cartpole_far_beyond_random_play() -> None:
    # Random play scores about 22 per episode.
    returns = train_gym("CartPole-v1", total_steps=30_000, seed=0).returns
    assert np.mean(returns[-20:]) > 150


def test_train_gym_progress_bar_reports_rounds_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    train_gym(MATCH_TARGET_ID, total_steps=128, seed=0, rollout_length=16, progress=True)
    captured = capsys.readouterr()
    assert captured.out == "" and "train_gym" in captured.err and "2/2" in captured.err
    train_gym(MATCH_TARGET_ID, total_steps=128, seed=0, rollout_length=16)  # captured stderr: no terminal
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------------------------
# Data-parallel update: K processes holding equal shares of the envs take the one-process update


class ThreadAllReduce:
    """`average` for K threads of one process standing in for K ranks: every thread's tensor becomes the
    mean of all of them, summed in rank order (so every thread gets the same bits, like an all-reduce)."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.barrier = threading.Barrier(ranks, timeout=60)
        self.contributions: list[torch.Tensor | None] = [None] * ranks

    def for_rank(self, rank: int) -> Callable[[torch.Tensor], None]:
        def average(tensor: torch.Tensor) -> None:
            self.contributions[rank] = tensor.detach().clone()
            self.barrier.wait()
            total = self.contributions[0]
            for other in self.contributions[1:]:
                total = total + other  # type: ignore[operator]
            self.barrier.wait()  # nobody overwrites a contribution before everyone has summed
            tensor.copy_(total / self.ranks)  # type: ignore[operator]

        return average


def data_parallel_update(batch: RolloutBatch, config: PPOConfig, ranks: int) -> list[FactoredLSTMPolicy]:
    """`ranks` threads, each with the same initial policy and the envs of its share, updating together."""
    share = batch.n_envs // ranks
    reduce = ThreadAllReduce(ranks)
    policies = [make_policy() for _ in range(ranks)]
    errors: list[BaseException] = []

    def rank_update(rank: int) -> None:
        try:
            local = batch.select_envs(torch.arange(rank * share, (rank + 1) * share))
            ppo_update(policies[rank], build_optimizer(policies[rank], config), local, config, 0.3,
                       generator=torch.Generator().manual_seed(7),
                       processes=RankShare(rank * share, batch.n_envs, reduce.for_rank(rank)))
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)
            reduce.barrier.abort()

    threads = [threading.Thread(target=rank_update, args=(rank,)) for rank in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return policies


#: The data-parallel update equals the one-process update up to float32 summation order (per-rank means
#: weighted and averaged instead of one mean over the group); measured below 1e-7 here.
DATA_PARALLEL_TOLERANCE = 1e-6


@pytest.mark.parametrize("minibatches", [1, 2, 4])
def test_ranks_holding_shares_of_the_envs_take_the_update_of_one_process_with_any_minibatches(
        minibatches: int) -> None:
    """4 envs on 2 ranks: with 2 or 4 minibatches a rank holds 0, 1 or 2 envs of a group, so the weighting
    of its part (and the zero gradient of an empty part) decides whether the update matches."""
    batch = collect_batch(make_policy(), envs=4)
    config = PPOConfig(minibatches=minibatches, target_kl=None, learning_rate=1e-2)
    single = make_policy()
    ppo_update(single, build_optimizer(single, config), batch, config, 0.3, generator=torch.Generator().manual_seed(7))
    rank0, rank1 = data_parallel_update(batch, config, ranks=2)
    expected = torch.cat([p.detach().flatten() for p in single.parameters()])
    moved = (expected - torch.cat([p.detach().flatten() for p in make_policy().parameters()])).abs().max()
    for policy in (rank0, rank1):
        parameters = torch.cat([p.detach().flatten() for p in policy.parameters()])
        assert (parameters - expected).abs().max() <= DATA_PARALLEL_TOLERANCE < moved
    for a, b in zip(rank0.parameters(), rank1.parameters(), strict=True):
        assert torch.equal(a, b)  # bit-identical on every rank


def test_ranks_stop_early_together_on_the_global_kl() -> None:
    batch = collect_batch(make_policy(), envs=4)
    config = PPOConfig(minibatches=2, target_kl=1e-3, epochs=10, learning_rate=1e-2)
    single = make_policy()
    expected = ppo_update(single, build_optimizer(single, config), batch, config, 0.3,
                          generator=torch.Generator().manual_seed(7))
    assert expected.early_stopped
    rank0, rank1 = data_parallel_update(batch, config, ranks=2)
    for policy in (rank0, rank1):
        for a, b in zip(policy.parameters(), single.parameters(), strict=True):
            assert (a - b).abs().max() <= DATA_PARALLEL_TOLERANCE
