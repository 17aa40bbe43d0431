"""`train_gym` on envs that give action masks: what the masks forbid is never sampled, and acting and the update
score actions under the same masks; an env without masks trains as it did."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
import torch

from morphogen.control.gym_training import _GymCollector, train_gym
from morphogen.control.policy import FactoredLSTMPolicy
from morphogen.control.ppo import PPOConfig
from morphogen.control.rollout import RolloutBuffer


class ForbiddingEnv(gymnasium.Env[np.ndarray, Any]):
    """Every step forbids about half of each head's choices, drawn from the env's seed (one at least is left), and
    tells so in `info["action_mask"]` where `masks` is "info"; "all allowed" tells masks that allow everything,
    "none" tells nothing. Each action it is given goes into `log` with whether it was forbidden.

    The action space is `MultiDiscrete([3, 4], start=[1, -2])`, or with `discrete` a `Discrete(5, start=2)`: the
    starts exercise the trainer's offsets. The reward is 1 for the highest choice of the first head, so there is a
    gradient; an episode is truncated after 6 steps.
    """

    def __init__(self, log: list[tuple[tuple[int, ...], bool]], masks: str = "info", discrete: bool = False) -> None:
        self.log, self.masks, self.discrete = log, masks, discrete
        self.observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), dtype=np.float32)
        multi = gymnasium.spaces.MultiDiscrete([3, 4], start=[1, -2])
        self.action_space: gymnasium.spaces.Space[Any] = gymnasium.spaces.Discrete(5, start=2) if discrete else multi
        self.sizes, self.starts = ((5,), np.array([2])) if discrete else ((3, 4), np.array([1, -2]))
        self.allowed: list[np.ndarray] = []
        self.steps = 0

    def _draw(self) -> tuple[np.ndarray, dict[str, Any]]:
        self.allowed = []
        for size in self.sizes:
            allowed = self.np_random.random(size) < 0.5
            allowed[self.np_random.integers(size)] = True
            self.allowed.append(allowed)
        info: dict[str, Any] = {}
        if self.masks in ("info", "all allowed"):
            told = [np.ones(size, dtype=np.int8) if self.masks == "all allowed" else allowed.astype(np.int8)
                    for size, allowed in zip(self.sizes, self.allowed, strict=True)]
            info["action_mask"] = told[0] if self.discrete else tuple(told)
        return self.np_random.uniform(-1.0, 1.0, 4).astype(np.float32), info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.steps = 0
        return self._draw()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        chosen = np.atleast_1d(np.asarray(action)) - self.starts
        forbidden = not all(allowed[choice] for allowed, choice in zip(self.allowed, chosen, strict=True))
        self.log.append((tuple(int(choice) for choice in chosen), forbidden))
        self.steps += 1
        observation, info = self._draw()
        return observation, float(chosen[0] == self.sizes[0] - 1), False, self.steps >= 6, info


class ForbiddingByMethodEnv(ForbiddingEnv):
    """A `ForbiddingEnv` that tells its masks by `action_masks()` (sb3-contrib's convention), not in its infos."""

    def __init__(self, log: list[tuple[tuple[int, ...], bool]], discrete: bool = False) -> None:
        super().__init__(log, "none", discrete)

    def action_masks(self) -> np.ndarray:
        """The heads' masks one after the other, as bools."""
        return np.concatenate(self.allowed)


FORBIDDING_ID, BY_METHOD_ID = "morphogen-tests/Forbidding-v0", "morphogen-tests/ForbiddingByMethod-v0"
for env_id, entry_point in ((FORBIDDING_ID, ForbiddingEnv), (BY_METHOD_ID, ForbiddingByMethodEnv)):
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point=entry_point)


def _train(env_id: str, **env_kwargs: Any) -> tuple[list[tuple[tuple[int, ...], bool]], FactoredLSTMPolicy]:
    """The env's log of (action, forbidden) and the policy after 384 steps of `train_gym` on 2 envs, seed 0."""
    log: list[tuple[tuple[int, ...], bool]] = []
    config = PPOConfig(learning_rate=3e-3, minibatches=2)
    training = train_gym(env_id, total_steps=384, seed=0, config=config, n_envs=2, rollout_length=32,
                         hidden_size=16, env_kwargs={"log": log, **env_kwargs})
    return log, training.policy


@pytest.mark.parametrize("discrete", [False, True], ids=["multidiscrete", "discrete"])
@pytest.mark.parametrize("env_id", [FORBIDDING_ID, BY_METHOD_ID], ids=["info", "method"])
def test_train_gym_never_plays_an_action_the_envs_masks_forbid(env_id: str, discrete: bool) -> None:
    log, _ = _train(env_id, discrete=discrete)
    assert len(log) == 384 and not any(forbidden for _, forbidden in log)
    unmasked, _ = _train(FORBIDDING_ID, masks="none", discrete=discrete)
    assert sum(forbidden for _, forbidden in unmasked) > 100  # the same env untold: half the choices are forbidden


def test_masks_that_allow_everything_leave_train_gym_as_an_env_without_masks() -> None:
    """The same seed plays the same actions and ends with the same weights, told all-True masks or none."""
    told, told_policy = _train(FORBIDDING_ID, masks="all allowed")
    untold, untold_policy = _train(FORBIDDING_ID, masks="none")
    assert told == untold
    for a, b in zip(told_policy.parameters(), untold_policy.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_rollout_stores_the_masks_it_acted_under_so_the_update_scores_actions_as_acting_did() -> None:
    """Re-evaluating the collected rollout with its stored masks gives the log-probabilities of acting (the
    ratio of the PPO update's first step is 1); without them it would not."""
    envs = [gymnasium.make(FORBIDDING_ID, log=[], masks="info") for _ in range(2)]
    torch.manual_seed(0)
    policy = FactoredLSTMPolicy(4, (3, 4), hidden_size=16)
    collector = _GymCollector(envs, policy, np.array([1, -2]), PPOConfig(), seed=0, env_id=FORBIDDING_ID)
    buffer = RolloutBuffer(16, 2, 4, 2, 16, mask_shapes=collector.mask_shapes)
    batch = collector.collect(buffer, torch.Generator().manual_seed(0))
    assert batch.action_masks is not None and not all(bool(mask.all()) for mask in batch.action_masks)
    masked = policy.evaluate_sequence(batch.observations, batch.initial_state, batch.episode_starts, batch.actions,
                                      batch.action_masks)
    torch.testing.assert_close(masked.log_prob_per_head, batch.log_prob_per_head, rtol=0, atol=1e-5)
    unmasked = policy.evaluate_sequence(batch.observations, batch.initial_state, batch.episode_starts, batch.actions)
    assert not torch.allclose(unmasked.log_prob_per_head, batch.log_prob_per_head, atol=1e-3)


class _WrongSizesEnv(ForbiddingEnv):
    """Masks of sizes (3, 3) for heads of (3, 4)."""

    def _draw(self) -> tuple[np.ndarray, dict[str, Any]]:
        observation, _ = super()._draw()
        return observation, {"action_mask": (np.ones(3, dtype=np.int8), np.ones(3, dtype=np.int8))}


class _MasksAtResetOnlyEnv(ForbiddingEnv):
    """Masks in the reset's info, none in the steps'."""

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, _ = super().step(action)
        return observation, reward, terminated, truncated, {}


@pytest.mark.parametrize(("entry_point", "message"), [
    (_WrongSizesEnv, r"one array per head of sizes \(3, 4\), got shapes \(\(3,\), \(3,\)\)"),
    (_MasksAtResetOnlyEnv, r"gave info\['action_mask'\] at reset but not after a step"),
])
def test_masks_an_env_gives_wrong_are_refused_saying_what_is_wrong(entry_point: type[ForbiddingEnv],
                                                                   message: str) -> None:
    env_id = f"morphogen-tests/{entry_point.__name__}-v0"
    if env_id not in gymnasium.registry:
        gymnasium.register(id=env_id, entry_point=entry_point)
    with pytest.raises(ValueError, match=message):
        train_gym(env_id, total_steps=8, n_envs=1, rollout_length=8, env_kwargs={"log": []})
