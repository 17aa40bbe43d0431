"""Tests for the Gymnasium wrapper: Gymnasium's own checker, spaces and masks, seeding, rewards, errors."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from morphogen.control.advice import HeuristicAdvisor
from morphogen.control.heuristic import HeuristicController
from morphogen.core.blueprints import blueprint_names
from morphogen.core.hosts import UnknownSlotError
from morphogen.data import DeviceDataset, Task, load_task
from morphogen.env.actions import HEADS, Action, Op
from morphogen.env.episode import EpisodeConfig
from morphogen.env.gym import ENV_ID, MorphogenesisEnv, flat_action_masks
from morphogen.env.observation import (
    BLUEPRINT_FEATURES,
    BLUEPRINT_SIZE,
    GLOBAL_FEATURES,
    SLOT_FEATURES,
    SLOT_SIZE,
    encode_observation,
)
from morphogen.env.play import run_episode
from morphogen.env.snapshot import EpisodeSnapshot

MAX_EPOCHS = 4
CONFIG = EpisodeConfig(max_epochs=MAX_EPOCHS, batch_size=100)


@pytest.fixture(scope="module")
def task() -> Task:
    """Digits with 200 training and 120 validation images: an epoch is two batches."""
    full = load_task("digits", max_train_samples=200)
    validation = DeviceDataset(full.validation.inputs[:120], full.validation.targets[:120])
    return dataclasses.replace(full, validation=validation)


@pytest.fixture
def env(task: Task) -> MorphogenesisEnv:
    return MorphogenesisEnv(task, episode_config=CONFIG)


def germinate_first_slot(env: MorphogenesisEnv) -> np.ndarray:
    """GERMINATE a conv_heavy seed (its first conv is randomly initialised) in the first slot."""
    indices = np.zeros(len(HEADS), dtype=np.int64)
    indices[HEADS.index("op")] = Op.GERMINATE
    indices[HEADS.index("blueprint")] = env.action_codec.blueprints.index("conv_heavy")
    return indices


# ---------------------------------------------------------------- the pure mask function
def test_flat_action_masks_allows_a_choice_when_any_allowed_op_allows_it() -> None:
    op_mask = np.array([True, False, True])
    # Rows are ops; op 1 is not allowed, so its row (which alone allows choice 2) must not count.
    slot_mask = np.array([[True, False, False],
                          [False, False, True],
                          [False, True, False]])
    pinned_mask = np.array([[True, False], [True, False], [True, False]])

    op, slot, pinned = flat_action_masks([op_mask, slot_mask, pinned_mask])

    np.testing.assert_array_equal(op, np.array([1, 0, 1], dtype=np.int8))
    np.testing.assert_array_equal(slot, np.array([1, 1, 0], dtype=np.int8))
    np.testing.assert_array_equal(pinned, np.array([1, 0], dtype=np.int8))
    assert all(mask.dtype == np.int8 for mask in (op, slot, pinned))


# ---------------------------------------------------------------- Gymnasium's checker
def test_gymnasium_env_checker_passes_with_only_the_unbounded_feature_warnings(task: Task) -> None:
    # Made through the registry so the env has a spec and the checker runs its seeding checks too.
    made = gymnasium.make("morphogen.env.gym:" + ENV_ID, task=task, episode_config=CONFIG)
    assert isinstance(made.unwrapped, MorphogenesisEnv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(made.unwrapped, skip_render_check=True)
    unexpected = [str(w.message) for w in caught if "infinity" not in str(w.message)]
    assert unexpected == []


# ---------------------------------------------------------------- spaces, observation layout, masks
def test_reset_observation_and_masks_match_the_spaces(env: MorphogenesisEnv) -> None:
    observation, info = env.reset(seed=0)

    assert observation.dtype == np.float32
    assert observation in env.observation_space
    assert len(env.observation_names()) == observation.shape[0]
    nvec = env.action_space.nvec
    assert [mask.shape for mask in info["action_mask"]] == [(int(size),) for size in nvec]
    assert all(mask.dtype == np.int8 for mask in info["action_mask"])
    by_op = info["action_mask_by_op"]
    assert by_op[0].shape == (len(Op),)
    assert [mask.shape for mask in by_op[1:]] == [(len(Op), int(size)) for size in nvec[1:]]
    # Untrained host, empty slots: only WAIT, GERMINATE (on every slot) and GROW are legal.
    np.testing.assert_array_equal(info["action_mask"][0], [1, 1, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(info["action_mask"][1], np.ones(len(env.slot_ids), dtype=np.int8))
    assert info["epoch"] == 0


def test_observation_space_bounds_the_features_that_have_a_range(env: MorphogenesisEnv) -> None:
    space = env.observation_space
    bounds = dict(zip(env.observation_names(), zip(space.low.tolist(), space.high.tolist(), strict=True), strict=True))
    slot, blueprint = env.slot_ids[0], env.action_codec.blueprints[0]
    assert bounds["epoch_fraction"] == bounds[f"slot/{slot}/alpha"] == bounds[f"slot/{slot}/stage/dormant"] == (0, 1)
    assert bounds[f"blueprint/{slot}/{blueprint}/growth_signal_measured"] == (0, 1)
    assert bounds["loss_ratio"] == (-10.0, 10.0)
    assert bounds[f"slot/{slot}/gradient_norm"] == pytest.approx((-1.0, math.log1p(1e6)))
    assert bounds["score"] == (-math.inf, math.inf)  # a task's own metric has no range
    # The observations of an episode lie inside (test_random_masked_episode_... checks every step).
    observation, _ = env.reset(seed=0)
    assert observation in env.observation_space


def test_split_observation_gives_back_the_encoder_output(env: MorphogenesisEnv) -> None:
    env.reset(seed=0)
    observation, *_ = env.step(germinate_first_slot(env))
    assert env.episode is not None
    expected = encode_observation(env.episode.snapshot)

    split = env.split_observation(observation)

    for part, expected_part in zip(split, expected, strict=True):
        np.testing.assert_array_equal(part, expected_part)
    names = env.observation_names()
    assert len(names) == len(set(names)) == observation.shape[0]
    # The seed germinated in the first slot is a "deepen" kind; the other slots are empty.
    kind = SLOT_FEATURES.index("seed_kind/deepen")
    assert split.slots[0, kind] == 1.0 and (split.slots[1:, kind] == 0.0).all()
    assert observation[names.index(f"slot/{env.slot_ids[0]}/seed_kind/deepen")] == 1.0
    batch = env.split_observation(np.stack([observation, observation]))  # (2, size)
    assert batch.slots.shape == (2, len(env.slot_ids), SLOT_SIZE)
    assert batch.blueprints.shape == (2, len(env.slot_ids), len(env.action_codec.blueprints), BLUEPRINT_SIZE)
    with pytest.raises(ValueError, match="expected"):
        env.split_observation(observation[:-1])


# ---------------------------------------------------------------- a whole episode
def test_random_masked_episode_runs_to_truncation_with_rewards_that_sum(env: MorphogenesisEnv) -> None:
    _, info = env.reset(seed=1)
    env.action_space.seed(1)
    for step in range(1, MAX_EPOCHS + 1):
        action = env.action_space.sample(mask=info["action_mask"])
        observation, reward, terminated, truncated, info = env.step(action)

        assert observation in env.observation_space
        assert terminated is False
        assert truncated is (step == MAX_EPOCHS)
        assert reward == pytest.approx(math.fsum(info["reward_components"].values()), abs=1e-12)
        assert isinstance(info["action_succeeded"], bool) and isinstance(info["reason"], str)
        assert info["epoch"] == step
        assert 0.0 <= info["val_accuracy"] <= 100.0
        assert info["parameters"] >= env.episode.model.host_param_count()  # type: ignore[union-attr]
    # Terminal accuracy is paid at the last step (default contribution mode).
    assert info["reward_components"]["terminal"] == pytest.approx(info["val_accuracy"] / 100.0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.action_space.sample())


def test_actions_the_masks_forbid_are_refused_not_raised(env: MorphogenesisEnv) -> None:
    _, info = env.reset(seed=0)
    prune = np.zeros(len(HEADS), dtype=np.int64)
    prune[HEADS.index("op")] = Op.PRUNE
    assert info["action_mask"][0][Op.PRUNE] == 0

    *_, info = env.step(prune)

    assert info["action_succeeded"] is False
    assert "DORMANT" in info["reason"]
    assert info["reward_components"]["action_cost"] < 0.0


# ---------------------------------------------------------------- seeding
def run_actions(env: MorphogenesisEnv, seed: int, actions: list[np.ndarray]) -> tuple[list[np.ndarray], list[float]]:
    observation, _ = env.reset(seed=seed)
    observations, rewards = [observation], []
    for action in actions:
        observation, reward, *_ = env.step(action)
        observations.append(observation)
        rewards.append(reward)
    return observations, rewards


def test_same_seed_and_actions_give_identical_trajectories_whatever_the_global_rng(
        env: MorphogenesisEnv, task: Task) -> None:
    wait = np.zeros(len(HEADS), dtype=np.int64)
    actions = [germinate_first_slot(env), wait]  # the seed's initialization must be seeded too
    torch.manual_seed(100)
    first = run_actions(env, 7, actions)
    torch.manual_seed(200)
    second = run_actions(MorphogenesisEnv(task, episode_config=CONFIG), 7, actions)

    for observation_a, observation_b in zip(first[0], second[0], strict=True):
        np.testing.assert_array_equal(observation_a, observation_b)
    assert first[1] == second[1]
    other_seed, _ = env.reset(seed=8)
    assert not np.array_equal(other_seed, first[0][0])  # the seed picks the host initialization


def test_steps_leave_the_callers_global_torch_rng_alone(env: MorphogenesisEnv) -> None:
    env.reset(seed=0)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    env.step(germinate_first_slot(env))
    assert torch.equal(torch.get_rng_state(), before)


def test_reset_uses_the_given_seed_or_draws_one_from_np_random(env: MorphogenesisEnv) -> None:
    env.reset(seed=3)
    assert env.episode is not None and env.episode.seed == 3
    env.reset()
    drawn = env.episode.seed
    env.reset()
    assert env.episode.seed != drawn
    env.reset(seed=3)
    env.reset()
    assert env.episode.seed == drawn


# ---------------------------------------------------------------- errors
def test_malformed_actions_and_calls_raise_with_the_fix(env: MorphogenesisEnv) -> None:
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(len(HEADS), dtype=np.int64))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="one per head"):
        env.step(np.zeros(len(HEADS) - 1, dtype=np.int64))
    with pytest.raises(ValueError, match="one per head"):
        env.step(np.zeros(len(HEADS)))  # floats
    out_of_range = np.zeros(len(HEADS), dtype=np.int64)
    out_of_range[HEADS.index("slot")] = -1  # would silently wrap to the last slot
    with pytest.raises(ValueError, match="outside the head sizes"):
        env.step(out_of_range)
    with pytest.raises(ValueError, match="no options"):
        env.reset(options={"max_epochs": 3})
    with pytest.raises(ValueError, match="seed"):
        env.reset(seed=2**64)


def test_constructor_rejects_arguments_that_cannot_apply(task: Task) -> None:
    with pytest.raises(ValueError, match="already loaded"):
        MorphogenesisEnv(task, max_train_samples=100)
    with pytest.raises(ValueError, match="device"):
        MorphogenesisEnv(task, device="meta")
    with pytest.raises(TypeError, match="task"):
        MorphogenesisEnv(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="render"):
        MorphogenesisEnv(task, render_mode="human")
    with pytest.raises(UnknownSlotError):
        MorphogenesisEnv(task, slots=["no_such_slot"])


def test_slot_subset_shrinks_both_spaces(task: Task) -> None:
    full = MorphogenesisEnv(task, episode_config=CONFIG)
    one = MorphogenesisEnv(task, episode_config=CONFIG, slots=[full.slot_ids[1]])

    assert one.slot_ids == (full.slot_ids[1],)
    assert one.action_space.nvec[HEADS.index("slot")] == 1
    per_slot = SLOT_SIZE + len(full.action_codec.blueprints) * BLUEPRINT_SIZE
    assert one.observation_space.shape[0] == full.observation_space.shape[0] - (len(full.slot_ids) - 1) * per_slot


def test_a_users_task_with_a_function_building_its_host_plays_and_leaves_the_global_rng_alone(task: Task) -> None:
    """`task_from_data(..., host=make_host)`, as a task function returns it: the env builds a host to read its
    topology, under a generator of its own."""
    import morphogen

    def make_host() -> morphogen.SegmentedHost:
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
        return morphogen.host_from_module(net, slots=["2"], example_input=torch.zeros(2, 1, 8, 8))

    users = morphogen.task_from_data("users", (task.train.inputs, task.train.targets),
                                     (task.validation.inputs, task.validation.targets), num_classes=10, host=make_host)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    env = MorphogenesisEnv(users, episode_config=CONFIG)
    assert torch.equal(torch.get_rng_state(), before)
    assert env.slot_ids == ("2",)
    env.reset(seed=0)
    _, _, _, truncated, info = env.step(np.zeros(len(HEADS), dtype=np.int64))
    assert not truncated and 0.0 <= info["val_accuracy"] <= 100.0
    without_host = morphogen.task_from_data("bare", (task.train.inputs, task.train.targets),
                                            (task.validation.inputs, task.validation.targets), num_classes=10)
    with pytest.raises(ValueError, match=r"task 'bare' has no host: pass one \(morphogen.host_from_module\)"):
        MorphogenesisEnv(without_host, episode_config=CONFIG)


def test_host_table_sizes_the_host_of_a_named_task() -> None:
    env = MorphogenesisEnv("mnist1d", episode_config=CONFIG, max_train_samples=100,
                           host={"base_channels": 4, "n_blocks": 2})
    assert env.task.topology == "cnn1d"
    assert env.task.host_kwargs["base_channels"] == 4
    assert env.slot_ids == ("r0c0", "r0c1")
    assert env.action_space.nvec[HEADS.index("blueprint")] == len(blueprint_names("cnn1d"))
    observation, info = env.reset(seed=0)
    assert env.observation_space.contains(observation)
    assert env.episode is not None and env.episode.model is not None
    assert env.episode.model.host.injection_points == {"r0c0": 4, "r0c1": 8}
    _, _, _, _, info = env.step(germinate_first_slot(env))
    assert info["action_succeeded"], info["reason"]


def test_host_table_errors_name_the_argument(task: Task) -> None:
    with pytest.raises(ValueError, match="base_channels: must be >= 1, got 0"):
        MorphogenesisEnv("digits", host={"base_channels": 0})
    with pytest.raises(ValueError, match="kernel_size: must be odd and >= 1, got 2"):
        MorphogenesisEnv("digits", host={"kernel_size": 2})
    with pytest.raises(ValueError, match=r"host\.d_model: unknown key; accepted: n_blocks, base_channels, kernel_size"):
        MorphogenesisEnv("digits", host={"d_model": 8})
    with pytest.raises(ValueError, match=r"host.*already loaded"):
        MorphogenesisEnv(task, host={"base_channels": 4})


# ---------------------------------------------------------------- registration, rendering, MaskablePPO
def test_plain_gymnasium_make_after_import_morphogen(task: Task) -> None:
    import morphogen  # noqa: F401  # registers the id

    made = gymnasium.make(ENV_ID, task=task, episode_config=CONFIG, render_mode="ansi")
    assert isinstance(made.unwrapped, MorphogenesisEnv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(made.unwrapped)  # the render check included
    # Scores and parameter counts are unbounded, so the Box keeps infinite bounds there; nothing else is warned.
    assert [str(w.message) for w in caught if "infinity" not in str(w.message)] == []


def test_ansi_render_shows_epoch_and_every_slot(env: MorphogenesisEnv, task: Task) -> None:
    assert env.render() is None  # no render mode: nothing to render
    text_env = MorphogenesisEnv(task, episode_config=CONFIG, render_mode="ansi")
    text_env.reset(seed=0)
    text_env.step(germinate_first_slot(text_env))
    text = text_env.render()
    assert text is not None
    lines = text.splitlines()
    assert lines[0].startswith(f"epoch 1/{MAX_EPOCHS}  val acc ")
    assert lines[1].split()[:3] == [text_env.slot_ids[0], "conv_heavy", "training"]
    assert len(lines) == 1 + len(text_env.slot_ids)


def test_action_masks_are_the_flat_masks_concatenated(env: MorphogenesisEnv) -> None:
    with pytest.raises(RuntimeError, match="reset"):
        env.action_masks()
    _, info = env.reset(seed=0)
    masks = env.action_masks()
    assert masks.dtype == bool and masks.shape == (int(np.sum(env.action_space.nvec)),)
    np.testing.assert_array_equal(masks, np.concatenate(info["action_mask"]).astype(bool))


def test_maskable_ppo_trains_on_the_env_without_a_wrapper(task: Task) -> None:
    sb3_contrib = pytest.importorskip("sb3_contrib", reason="sb3-contrib is a dev extra")
    from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported

    env = MorphogenesisEnv(task, episode_config=EpisodeConfig(max_epochs=2, batch_size=100))
    assert is_masking_supported(env)
    model = sb3_contrib.MaskablePPO("MlpPolicy", env, n_steps=4, batch_size=4, n_epochs=1, seed=0, device="cpu")
    model.learn(total_timesteps=4)
    observation, _ = env.reset(seed=1)
    action, _ = model.predict(observation, action_masks=get_action_masks(env))
    assert env.action_space.contains(action)
    offsets = np.concatenate([[0], np.cumsum(env.action_space.nvec)[:-1]])
    assert env.action_masks()[offsets + action].all(), "every head's choice is allowed by the masks"


def test_an_advised_env_marks_the_advice_and_following_it_plays_the_heuristics_episode(task: Task) -> None:
    config = dataclasses.replace(CONFIG, max_epochs=12)  # room for the first seed to reach the output
    env = MorphogenesisEnv(task, episode_config=config, advisor=HeuristicAdvisor())
    observation, _ = env.reset(seed=3)
    played = []
    for _ in range(config.max_epochs):
        features = env.split_observation(observation)
        globals_ = dict(zip(GLOBAL_FEATURES, features.globals.tolist(), strict=True))
        assert globals_["advice_given"] == 1.0
        advised_op = next(op for op in Op if globals_[f"advice/{op.name}"] == 1.0)
        advised_slots = [slot for slot, row in zip(env.slot_ids, features.slots, strict=True)
                         if row[SLOT_FEATURES.index("advised")] == 1.0]
        # What the advice says, as the action to take: the op, and the slot and blueprint it marks.
        action = Action(advised_op, advised_slots[0] if advised_slots else None)
        if advised_op is Op.GERMINATE:
            row = env.slot_ids.index(advised_slots[0])
            marked = features.blueprints[row, :, BLUEPRINT_FEATURES.index("advised")]
            action = dataclasses.replace(action, blueprint=env.action_codec.blueprints[int(np.argmax(marked))])
        played.append(action)
        observation, *_ = env.step(np.asarray(env.action_codec.encode(action), dtype=np.int64))
    assert any(action.op is Op.GERMINATE for action in played), "the heuristic grew in this episode"
    # The same episode played by the heuristic itself takes the same actions.
    heuristic_actions: list[Action] = []

    class Recorded(HeuristicController):
        def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
            heuristic_actions.append(super().act(snapshot, masks))
            return heuristic_actions[-1]

    episode = env._new_episode(3)
    run_episode(episode, Recorded(env.action_codec, task.topology))
    assert heuristic_actions == played
    plain = MorphogenesisEnv(task, episode_config=config).reset(seed=3)[0]
    assert plain[GLOBAL_FEATURES.index("advice_given")] == 0.0
