"""The heuristic's choice between deepening and widening, and where, from constructed growth signals."""

from __future__ import annotations

from test_heuristic import ALL_EMPTY, SLOTS, controller, make_masks, make_slot, make_snapshot

from morphogen.commands.run import RunConfig
from morphogen.config import build_config, read_config_source
from morphogen.control.growth_choice import best_growth, growth_options
from morphogen.control.heuristic import HeuristicConfig, HeuristicController
from morphogen.core.flops import SeedCost
from morphogen.core.lifecycle import Stage
from morphogen.env.actions import Action, ActionSpace, Op
from morphogen.env.growth_signals import MIN_RELATIVE_FLOPS
from morphogen.env.snapshot import SlotSnapshot


def cost(relative_flops: float) -> SeedCost:
    return SeedCost(parameters=100, flops=int(1e6 * relative_flops), relative_parameters=0.1,
                    relative_flops=relative_flops)


def measured(slot_id: str, depth: float, width: float | None, deepening_flops: float = 3.0,
             widening_flops: float = 1.0) -> SlotSnapshot:
    """An empty slot with growth signals, the next deepening blueprint (conv_heavy) and `wider` costed."""
    costs = [("conv_heavy", cost(deepening_flops))]
    if width is not None:
        costs.append(("wider", cost(widening_flops)))
    return make_slot(slot_id, depth_signal=depth, width_signal=width, seed_costs=tuple(costs))


def test_the_best_signal_per_flop_wins_across_kinds_and_slots() -> None:
    slots = [measured("r0c0", depth=0.9, width=1.0), measured("r0c1", depth=0.6, width=0.7, widening_flops=0.5),
             measured("r0c2", depth=0.5, width=None)]
    scores = {(o.slot, o.blueprint): round(o.score, 3) for o in growth_options(slots, SLOTS, "conv_heavy", "wider")}
    assert scores == {("r0c0", "conv_heavy"): 0.3, ("r0c0", "wider"): 1.0, ("r0c1", "conv_heavy"): 0.2,
                      ("r0c1", "wider"): 1.4, ("r0c2", "conv_heavy"): round(0.5 / 3, 3)}
    best = best_growth(slots, SLOTS, "conv_heavy", "wider")
    assert best is not None and (best.slot, best.blueprint) == ("r0c1", "wider")


def test_deepening_wins_where_the_gradient_wants_depth_more_than_width_per_flop() -> None:
    slots = [measured("r0c0", depth=3.0, width=0.2, deepening_flops=2.0, widening_flops=1.0)]
    best = best_growth(slots, SLOTS, "conv_heavy", "wider")
    assert best is not None and (best.slot, best.blueprint) == ("r0c0", "conv_heavy")


def test_only_allowed_slots_with_measured_signals_and_costs_are_candidates() -> None:
    slots = [measured("r0c0", depth=5.0, width=5.0), make_slot("r0c1"),  # r0c1 was not measured
             measured("r0c2", depth=0.1, width=None)]  # no layers to widen at r0c2
    options = growth_options(slots, ["r0c1", "r0c2"], "conv_heavy", "wider")
    assert [(o.slot, o.blueprint) for o in options] == [("r0c2", "conv_heavy")]
    assert best_growth(slots, ["r0c1"], "conv_heavy", "wider") is None
    assert [o.blueprint for o in growth_options(slots, SLOTS, None, "wider")] == ["wider"]  # no deepening left


def test_a_blueprint_that_costs_no_counted_flop_is_not_free() -> None:
    slots = [measured("r0c0", depth=1.0, width=None, deepening_flops=0.0)]
    (option,) = growth_options(slots, SLOTS, "conv_heavy", None)
    assert option.score == 1.0 / MIN_RELATIVE_FLOPS


def test_the_heuristic_germinates_what_the_signals_choose() -> None:
    heuristic, space = controller()
    assert heuristic.growth_candidates(10) == ("conv_heavy", "wider")
    snapshot = make_snapshot(measured("r0c0", depth=0.9, width=1.0), measured("r0c1", depth=2.0, width=0.1),
                             measured("r0c2", depth=0.2, width=0.2))
    assert heuristic.act(snapshot, make_masks(space, ALL_EMPTY)) == Action(Op.GERMINATE, "r0c0", "wider")
    assert heuristic.growth_candidates(10) == ("conv_heavy", "wider")  # widening does not move the rotation
    deeper = make_snapshot(measured("r0c1", depth=9.0, width=0.1), measured("r0c0", depth=0.1, width=0.1))
    assert heuristic.act(deeper, make_masks(space, ALL_EMPTY)) == Action(Op.GERMINATE, "r0c1", "conv_heavy")
    assert heuristic.growth_candidates(10) == ("conv_light", "wider")  # the rotation's next deepening blueprint


def test_no_growth_signals_are_asked_for_where_the_clock_rules_growth_out() -> None:
    # In the warm-up, and when a seed could no longer be judged before the end, the heuristic germinates nothing
    # whatever the signals say: measuring them there only spent FLOPs (4.4% of an 8-epoch digits run).
    heuristic, space = controller(warmup_epochs=3)
    assert heuristic.growth_candidates(1) == ("conv_heavy", "wider")  # no snapshot seen yet: the length is unknown
    heuristic.act(make_snapshot(epoch=0, max_epochs=30), make_masks(space, ALL_EMPTY))
    assert heuristic.growth_candidates(2) == ()
    assert heuristic.growth_candidates(3) == ("conv_heavy", "wider")
    assert heuristic.growth_candidates(23) == ("conv_heavy", "wider")  # 7 epochs left: a first seed reaches the output
    assert heuristic.growth_candidates(24) == ()
    state = heuristic.state_dict()
    resumed, _ = controller(warmup_epochs=3)
    resumed.load_state_dict(state, space)
    assert resumed.growth_candidates(24) == () and resumed.growth_candidates(10) == ("conv_heavy", "wider")


def test_a_heuristic_growing_by_depth_asks_for_no_growth_signals() -> None:
    """GROW grafts one blueprint into every slot: measuring candidates for it would buy nothing."""
    heuristic, _ = controller(depth_blueprint="conv_light")
    assert heuristic.growth_candidates(10) == ()
    heuristic.grows_by_depth = False  # a refused GROW: seed by seed from now on, chosen by the signals again
    assert heuristic.growth_candidates(10) == ("conv_heavy", "wider")


def test_a_pruned_widening_is_held_back_like_any_blueprint() -> None:
    heuristic, space = controller(prune_penalty_epochs=10, min_training_epochs=2, training_patience=0)
    training = make_slot("r0c0", Stage.TRAINING, blueprint="wider", epochs_in_stage=2)
    masks = make_masks(space, {Op.PRUNE: ("r0c0",)})
    assert heuristic.act(make_snapshot(training, epoch=10), masks) == Action(Op.PRUNE, "r0c0")
    assert heuristic.growth_candidates(15) == ("conv_heavy",)
    assert heuristic.growth_candidates(20) == ("conv_heavy", "wider")


def test_rotation_mode_measures_nothing_and_ignores_signals() -> None:
    heuristic, space = controller(choice="rotation")
    assert heuristic.growth_candidates(10) == ()
    snapshot = make_snapshot(measured("r0c1", depth=9.0, width=9.0))
    assert heuristic.act(snapshot, make_masks(space, ALL_EMPTY)) == Action(Op.GERMINATE, "r0c0", "conv_heavy")


def test_an_mlp_host_grows_by_the_rotation_unless_told_to_choose_by_signal() -> None:
    space = ActionSpace(SLOTS, "mlp")
    snapshot = make_snapshot(measured("r0c0", depth=0.1, width=0.1), measured("r0c2", depth=9.0, width=9.0))
    heuristic = HeuristicController(space, "mlp")
    assert heuristic.growth_candidates(10) == ()  # nothing to measure
    assert heuristic.act(snapshot, make_masks(space, ALL_EMPTY, branch_sites=True)) == \
        Action(Op.GERMINATE, "r0c0", "branch_wide")
    by_signal = HeuristicController(space, "mlp", HeuristicConfig(choice="signal", first_seed=""))
    assert by_signal.growth_candidates(10) == ("mlp", "wider")
    costs = (("mlp", cost(3.0)), ("wider", cost(1.0)))
    wants_depth = make_snapshot(make_slot("r0c0", depth_signal=0.1, width_signal=0.1, seed_costs=costs),
                                make_slot("r0c2", depth_signal=9.0, width_signal=0.1, seed_costs=costs))
    assert by_signal.act(wants_depth, make_masks(space, ALL_EMPTY)) == Action(Op.GERMINATE, "r0c2", "mlp")


def test_the_first_seed_is_a_branch_where_a_slot_has_a_site_for_one() -> None:
    """On a 1-D CNN the first seed is `branch_wide` wherever some slot can take it, whatever the signals favour;
    where none can (the built-in hosts), and for every later seed, the signals choose."""
    space = ActionSpace(SLOTS, "cnn1d")
    wants_width = make_snapshot(make_slot("r0c0", depth_signal=0.1, width_signal=9.0,
                                          seed_costs=(("conv_heavy", cost(3.0)), ("wider", cost(1.0)))))
    heuristic = HeuristicController(space, "cnn1d")
    sites = make_masks(space, ALL_EMPTY, branch_sites=True)
    assert heuristic.act(wants_width, sites) == Action(Op.GERMINATE, "r0c0", "branch_wide")
    assert heuristic.growth_candidates(11) == ("conv_heavy", "wider")  # grown once: the signals choose from now
    built_in = HeuristicController(space, "cnn1d")
    assert built_in.act(wants_width, make_masks(space, ALL_EMPTY)) == Action(Op.GERMINATE, "r0c0", "wider")
    told = HeuristicController(space, "cnn1d", HeuristicConfig(first_seed=""))
    assert told.act(wants_width, sites) == Action(Op.GERMINATE, "r0c0", "wider")


def test_a_branch_first_seed_goes_to_a_slot_where_a_branch_has_a_site() -> None:
    """Beside the first block of a model of several inputs (a padding mask) no branch can read its input: the first
    seed goes to the next slot that can take it, not to one the episode would refuse."""
    space = ActionSpace(SLOTS, "cnn1d")
    snapshot = make_snapshot(make_slot("r0c0", can_branch=False), make_slot("r0c1", can_branch=True),
                             make_slot("r0c2", can_branch=True))
    heuristic = HeuristicController(space, "cnn1d")
    assert heuristic.act(snapshot, make_masks(space, ALL_EMPTY, branch_sites=True)) == \
        Action(Op.GERMINATE, "r0c1", "branch_wide")


def test_the_rotation_skips_a_blueprint_no_empty_slot_has_a_site_for() -> None:
    """An MLP whose slots have no measured segment input cannot take the rotation's first blueprint, a branch:
    the rotation germinates the next one, a legal action, instead of one the episode refuses."""
    space = ActionSpace(SLOTS, "mlp")
    heuristic = HeuristicController(space, "mlp")
    assert heuristic.act(make_snapshot(), make_masks(space, ALL_EMPTY)) == Action(Op.GERMINATE, "r0c0", "mlp")


def test_the_lean_config_widens_by_half_where_the_default_widens_by_double() -> None:
    """The `grow_lean` preset, the README's FLOP-lean growth: the heuristic weighs `wider_half` for widening."""
    lean = build_config(RunConfig, read_config_source("grow_lean"))
    heuristic = HeuristicController(ActionSpace(SLOTS, "cnn"), "cnn", lean.heuristic)
    assert heuristic.growth_candidates(10) == ("conv_heavy", "wider_half")
    slot = make_slot("r0c0", depth_signal=0.1, width_signal=1.0,
                     seed_costs=(("conv_heavy", cost(3.0)), ("wider_half", cost(0.5))))
    action = heuristic.act(make_snapshot(slot), make_masks(heuristic.space, ALL_EMPTY))
    assert action == Action(Op.GERMINATE, "r0c0", "wider_half")


def test_a_deepening_blueprint_no_slot_has_a_site_for_is_not_weighed() -> None:
    """A rotation that starts with a branch, on a host where no slot has a branch site (the masks rule it out):
    the signals weigh the next deepening blueprint against the widening one, as if the branch were not listed."""
    heuristic, space = controller(rotation=("branch_wide", "conv_heavy"))
    assert heuristic.growth_candidates(10) == ("branch_wide", "wider")  # no masks seen yet
    masks = make_masks(space, {Op.GERMINATE: ("r0c0",)})
    assert heuristic.act(make_snapshot(epoch=1), masks) == Action()  # warm-up: it waits, and learns the sites
    assert heuristic.growth_candidates(10) == ("conv_heavy", "wider")
    deepening_pays = make_slot("r0c0", depth_signal=9.0, width_signal=0.1,
                               seed_costs=(("conv_heavy", cost(3.0)), ("wider", cost(1.0))))
    assert heuristic.act(make_snapshot(deepening_pays), masks) == Action(Op.GERMINATE, "r0c0", "conv_heavy")
