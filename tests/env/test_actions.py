"""Tests for the factored action space: encode/decode, canonical irrelevant heads, and masks.

The mask property: over random episodes driven by uniformly sampled masked-legal actions (op first,
then the op-conditioned row of every other head), WAIT is always legal, every legal op has a legal
choice in every head, and executing the action never raises; a gate may refuse it, with a reason.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from morphogen.core.alpha import AlphaCurve
from morphogen.core.blend import BlendKind
from morphogen.core.blueprints import blueprint_names
from morphogen.core.hosts import CNNHost
from morphogen.core.lifecycle import GateConfig, GateMode, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.module_host import host_from_module
from morphogen.core.slot import SlotConfig
from morphogen.data import DeviceDataset, Task, load_task
from morphogen.env.actions import (
    ALPHA_CURVES,
    ALPHA_SPEEDS,
    ALPHA_TARGETS,
    BLEND_EPOCHS,
    BLEND_KINDS,
    HEAD_RELEVANCE,
    HEADS,
    MIN_PRUNE_AGE,
    Action,
    ActionSpace,
    Op,
)
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode

SLOTS = ("r0c0", "r0c1", "r0c2")


def space() -> ActionSpace:
    return ActionSpace(SLOTS, "cnn")


def tiny_model(gates: GateConfig | None = None) -> MorphogeneticModel:
    torch.manual_seed(0)
    return MorphogeneticModel(CNNHost(num_classes=3, in_channels=1, n_blocks=3, base_channels=4), SLOTS,
                              SlotConfig(gates=gates or GateConfig()))


# ---------------------------------------------------------------- encoding


def test_sizes_follow_the_head_order() -> None:
    n_blueprints = len(blueprint_names("cnn"))
    assert space().sizes == (len(Op), 3, n_blueprints, len(BLEND_KINDS), len(BLEND_EPOCHS), len(ALPHA_TARGETS),
                             len(ALPHA_SPEEDS), len(ALPHA_CURVES))


@pytest.mark.parametrize(
    "action",
    [
        Action(),
        Action(Op.GERMINATE, "r0c2", "bottleneck", BlendKind.GATE, 8),
        Action(Op.SET_ALPHA_TARGET, "r0c1", alpha_target=0.6, alpha_speed=3, alpha_curve=AlphaCurve.SIGMOID),
        Action(Op.PRUNE, "r0c0"),
        Action(Op.FOSSILIZE, "r0c1"),
        Action(Op.ADVANCE, "r0c2"),
        Action(Op.GROW, blueprint="conv_heavy", blend_epochs=5),
    ],
    ids=lambda action: action.op.name,
)
def test_encode_decode_round_trip(action: Action) -> None:
    indices = space().encode(action)
    assert space().decode(indices) == action
    assert space().encode(space().decode(indices)) == indices


def test_encode_by_hand() -> None:
    blueprint = blueprint_names("cnn").index("bottleneck")
    assert space().encode(Action(Op.GERMINATE, "r0c2", "bottleneck", BlendKind.GATE, 8)) == \
        [1, 2, blueprint, 2, 2, 0, 0, 0]
    assert space().encode(Action(Op.SET_ALPHA_TARGET, "r0c1", alpha_target=0.6, alpha_speed=3,
                                 alpha_curve=AlphaCurve.COSINE)) == [2, 1, 0, 0, 0, 2, 2, 1]


def test_irrelevant_heads_encode_to_zero_and_decode_to_defaults() -> None:
    # A PRUNE carrying stray values in heads PRUNE ignores.
    stray = Action(Op.PRUNE, "r0c2", "norm", BlendKind.MULTIPLY, 8, 1.0, 5, AlphaCurve.COSINE)
    assert space().encode(stray) == [3, 2, 0, 0, 0, 0, 0, 0]
    decoded = space().decode([3, 2, 4, 2, 2, 3, 3, 2])
    assert decoded == Action(Op.PRUNE, "r0c2")
    assert space().decode([0, 2, 4, 2, 2, 3, 3, 2]) == Action()


def test_head_relevance_table() -> None:
    relevant = {op: {head for head, used in zip(HEADS, HEAD_RELEVANCE[op], strict=True) if used} for op in Op}
    assert relevant[Op.WAIT] == {"op"}
    assert relevant[Op.GERMINATE] == {"op", "slot", "blueprint", "blend", "blend_epochs"}
    assert relevant[Op.SET_ALPHA_TARGET] == {"op", "slot", "alpha_target", "alpha_speed", "alpha_curve"}
    for op in (Op.PRUNE, Op.FOSSILIZE, Op.ADVANCE):
        assert relevant[op] == {"op", "slot"}
    assert relevant[Op.GROW] == {"op", "blueprint", "blend_epochs"}  # every empty slot: no slot to choose


def test_encode_rejects_a_value_outside_the_choices() -> None:
    with pytest.raises(ValueError, match="slot='r9c9' is not one of"):
        space().encode(Action(Op.PRUNE, "r9c9"))
    with pytest.raises(ValueError, match="blend_epochs=4"):
        space().encode(Action(Op.GERMINATE, "r0c0", "norm", blend_epochs=4))


def test_an_action_space_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        ActionSpace((), "cnn")


def test_describe_names_the_op_and_slot() -> None:
    assert Action().describe() == "WAIT"
    assert Action(Op.GERMINATE, "r0c1", "norm").describe() == "GERMINATE norm@r0c1 (add, 3 ep)"
    assert Action(Op.PRUNE, "r0c0").describe() == "PRUNE r0c0"
    assert Action(Op.GROW, blueprint="block").describe() == "GROW block in every empty slot (3 ep)"


# ---------------------------------------------------------------- masks by hand


def row(masks: list[np.ndarray], head: str, op: Op) -> list[bool]:
    return masks[HEADS.index(head)][op].tolist()


def test_masks_of_a_fresh_model() -> None:
    masks = space().masks(tiny_model())
    assert masks[0].tolist() == [True, True, False, False, False, False, True]  # WAIT, GERMINATE, GROW
    assert row(masks, "slot", Op.GROW) == [True, False, False]  # GROW picks no slot: the canonical choice
    assert row(masks, "slot", Op.GERMINATE) == [True, True, True]
    assert row(masks, "slot", Op.PRUNE) == [False, False, False]


def test_germinate_masks_out_blueprints_no_empty_slot_has_a_site_for() -> None:
    names = blueprint_names("cnn")
    masks = space().masks(tiny_model())  # a built-in host measures no segment input: no slot takes a branch
    germinate = dict(zip(names, row(masks, "blueprint", Op.GERMINATE), strict=True))
    assert not germinate["branch_wide"] and germinate["wider"] and germinate["conv_light"]
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3, padding=1),
                              torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 3))
    model = MorphogeneticModel(host_from_module(net, ["1", "3"], example_input=torch.randn(2, 1, 8, 8)))
    masks = ActionSpace(model.slot_ids, "cnn").masks(model)
    assert dict(zip(names, row(masks, "blueprint", Op.GERMINATE), strict=True))["branch_wide"]


def test_masks_with_a_training_seed_then_an_old_enough_one() -> None:
    model = tiny_model()
    model.germinate("r0c1", "norm")
    model.slot("r0c1").advance(0)
    assert model.slot("r0c1").stage is Stage.TRAINING
    masks = space().masks(model)
    # No second seed while one trains; the young seed may advance but not yet be pruned.
    assert masks[0].tolist() == [True, False, False, False, False, True, False]  # no GROW either
    assert row(masks, "slot", Op.ADVANCE) == [False, True, False]
    model.slot("r0c1").lifecycle.seed_age = MIN_PRUNE_AGE
    masks = space().masks(model)
    assert masks[0][Op.PRUNE]
    assert row(masks, "slot", Op.PRUNE) == [False, True, False]


def test_masks_of_holding_and_fossilized_seeds() -> None:
    model = tiny_model(GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=0))
    for slot_id in ("r0c0", "r0c2"):
        slot = model.germinate(slot_id, "conv_small", blend_epochs=0)
        slot.advance(0)
        slot.record_signals(gradient_health=1.0)
        while slot.stage is not Stage.HOLDING:
            assert slot.advance(0).passed
        slot.lifecycle.seed_age = MIN_PRUNE_AGE
    model.slot("r0c2").record_signals(contribution=3.0)
    assert model.slot("r0c2").fossilize(0).passed
    masks = space().masks(model)
    assert row(masks, "slot", Op.FOSSILIZE) == [True, False, False]
    assert row(masks, "slot", Op.SET_ALPHA_TARGET) == [True, False, False]
    assert row(masks, "slot", Op.PRUNE) == [True, False, False]  # a fossil is never pruned
    assert row(masks, "slot", Op.ADVANCE) == [False, False, False]  # HOLDING -> FOSSILIZED is FOSSILIZE's job
    assert row(masks, "slot", Op.GERMINATE) == [False, True, False]
    assert masks[0][Op.GROW]  # one slot is still empty: GROW fills it


def test_irrelevant_head_rows_allow_only_the_canonical_choice() -> None:
    masks = space().masks(tiny_model())
    for h, head in enumerate(HEADS[1:], start=1):
        for op in Op:
            if not HEAD_RELEVANCE[op, h]:
                assert masks[h][op].tolist() == [True] + [False] * (masks[h].shape[1] - 1), (head, op.name)


# ---------------------------------------------------------------- random masked-legal episodes


@pytest.fixture(scope="module")
def small_task() -> Task:
    """Digits with 64 training and 64 validation images: each step trains one batch and validates 64.
    A 3-block host, so that its slots are this module's SLOTS (r0c0, r0c1, r0c2)."""
    task = load_task("digits", max_train_samples=64, host={"n_blocks": 3})
    validation = DeviceDataset(task.validation.inputs[:64], task.validation.targets[:64])
    return dataclasses.replace(task, validation=validation)


def sample_masked(masks: list[np.ndarray], rng: np.random.Generator) -> list[int]:
    """Op uniformly among the legal ones, then each head uniformly within that op's legal row."""
    op = int(rng.choice(np.flatnonzero(masks[0])))
    return [op] + [int(rng.choice(np.flatnonzero(mask[op]))) for mask in masks[1:]]


def assert_every_legal_op_is_playable(masks: list[np.ndarray]) -> None:
    assert masks[0][Op.WAIT]
    for op in np.flatnonzero(masks[0]):
        for head, mask in zip(HEADS[1:], masks[1:], strict=True):
            assert mask[op].any(), f"{Op(op).name} is legal but head {head} has no legal choice"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_masked_legal_actions_never_raise(small_task: Task, seed: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=1)
    config = EpisodeConfig(max_epochs=30, slots=SlotConfig(gates=gates, embargo_epochs=2))
    episode = MorphogenesisEpisode(small_task, config, seed=seed, slots=SLOTS)
    episode.reset()
    raised: list[Exception] = []
    execute = episode._execute

    def recording_execute(action: Action) -> tuple[bool, str]:
        # apply_action turns errors into refusals; a masked-legal action must not raise at all.
        try:
            return execute(action)
        except Exception as error:
            raised.append(error)
            raise

    monkeypatch.setattr(episode, "_execute", recording_execute)
    rng = np.random.default_rng(seed)
    batch = next(small_task.train.iterate_batches(32, shuffle=False))
    ops_taken, stages_seen, refusals = set(), set(), 0
    while not episode.done:
        masks = episode.masks()
        assert_every_legal_op_is_playable(masks)
        indices = sample_masked(masks, rng)
        action = episode.action_space.decode(indices)
        assert episode.action_space.encode(action) == indices  # masked samples are already canonical
        succeeded, reason = episode.apply_action(action)
        assert reason
        refusals += not succeeded
        episode.train_epoch([batch])
        episode.finish_epoch(action, succeeded, reason)
        ops_taken.add(action.op)
        assert episode.model is not None
        stages_seen |= {slot.stage for slot in episode.model.slots()}
    assert raised == []
    # The walk must have exercised the lifecycle, not only waited.
    assert {Op.GERMINATE, Op.ADVANCE} <= ops_taken
    assert {Stage.TRAINING, Stage.BLENDING} <= stages_seen
