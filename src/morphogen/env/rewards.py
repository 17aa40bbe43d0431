"""Reward modes (docs/architecture.md#rewards): pure functions from two snapshots and an action to named components.

The four modes and the components they sum (every mode reports the same components at every step,
zeros included, so telemetry columns are stable):

- ``contribution`` (default): contribution + shaping + rent + action_cost + terminal + rollback.
- ``simplified``: shaping + action_cost + terminal + rollback.
- ``sparse``: terminal + rent + rollback; terminal and rent are non-zero only at the last step.
- ``loss``: loss_delta + rent + action_cost + terminal + rollback.

Decisions worth knowing:

- Rent. ``parameter_rent`` is ``-min(w ln(1 + added / max(host, floor)), cap)``.
  Dense modes charge it per step divided by ``max_epochs`` (a seed held all episode pays the formula
  once in total), and at the last step charge it once more in full for the size of the final model.
  Sparse mode charges only that final full formula.
- Shaping is potential-based (Ng, Harada & Russell, 1999): ``F = gamma Phi(s') - Phi(s)`` with
  ``Phi`` the sum of the slots' stage potentials. At the last step ``Phi(s')`` is taken as 0 (the
  terminal state's potential), so over an episode shaping only moves credit in time and cannot
  change which policy is optimal: growing seeds merely to collect potential does not pay.
- Contribution (anti-gaming). A seed is credited only while BLENDING/HOLDING/FOSSILIZED with
  alpha > 0 and a measured contribution. Its contribution is clipped to ±``contribution_clip``
  points; when the all-seeds-off accuracy was measured, the positive contributions together are
  scaled down to at most the accuracy gained over it (synergistic seeds cannot each claim the same
  gain); finally a positive credit is multiplied by alpha, so parking a seed at a tiny alpha (small
  rent, measurable contribution) earns little. A harmful seed's negative contribution is charged in
  full, whatever its alpha.
- Action costs are charged when an op is attempted, plus ``failed_action_cost`` when it did not
  take effect (a refused gate), so spamming refused moves is not free. WAIT costs nothing.
- A governor rollback during the epoch costs ``rollback_penalty`` in every mode.
- A task judged by relative loss (its own loss, on a scale only its author knows) is rewarded in log-loss
  points: the terminal reads ``-relative_loss_points * ln(loss)``, a seed's contribution is
  ``relative_loss_points * ln(loss without it / loss with it)`` (no all-seeds-off cap: that configuration
  is measured in the task's score), and the loss mode's delta is ``ln(previous / current)``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass

from morphogen.core.lifecycle import BLENDED_STAGES, Criterion, Stage
from morphogen.env.actions import Action, Op
from morphogen.env.snapshot import EpisodeSnapshot

__all__ = [
    "RewardBreakdown",
    "RewardConfig",
    "RewardMode",
    "action_cost",
    "compute_reward",
    "contribution_reward",
    "episode_potential",
    "loss_delta_reward",
    "parameter_rent",
    "shaping_reward",
    "stage_potential",
    "step_rent",
    "terminal_reward",
]


class RewardMode(enum.Enum):
    """Which reward formula an episode uses."""

    CONTRIBUTION = "contribution"
    SIMPLIFIED = "simplified"
    SPARSE = "sparse"
    LOSS = "loss"


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the reward components; accuracies are in points (0..100) unless said otherwise."""

    #: Weight w of the rent formula -min(w ln(1 + added / max(host, floor)), cap).
    rent_weight: float = 0.5
    #: Largest rent the formula charges (before the per-step division by max_epochs).
    rent_cap: float = 1.5
    #: Host size below which rent is computed as if the host had this many parameters (tiny hosts).
    rent_floor_parameters: int = 200
    #: Reward per accuracy point of credited counterfactual contribution, per step.
    contribution_scale: float = 0.1
    #: A seed's contribution is clipped to ±this many points before it is credited.
    contribution_clip: float = 10.0
    #: Multiplies every stage potential (the shaping reward's scale).
    shaping_scale: float = 0.05
    #: Stage potentials (before `shaping_scale`); DORMANT, PRUNED, EMBARGOED and RESETTING have 0.
    potential_germinated: float = 1.0
    #: Potential of a TRAINING seed.
    potential_training: float = 2.0
    #: Potential of a BLENDING seed.
    potential_blending: float = 3.5
    #: Potential of a HOLDING seed.
    potential_holding: float = 5.5
    #: Potential of a FOSSILIZED seed.
    potential_fossilized: float = 6.0
    #: Cost of attempting GERMINATE or GROW (WAIT is free).
    germinate_cost: float = 0.02
    #: Cost of attempting SET_ALPHA_TARGET.
    set_alpha_target_cost: float = 0.005
    #: Cost of attempting PRUNE.
    prune_cost: float = 0.01
    #: Cost of attempting FOSSILIZE.
    fossilize_cost: float = 0.01
    #: Cost of attempting ADVANCE.
    advance_cost: float = 0.005
    #: Extra cost when a non-WAIT action did not take effect (e.g. a gate refused it).
    failed_action_cost: float = 0.01
    #: Reward at the last step per unit of final accuracy fraction (final accuracy / 100).
    terminal_accuracy_weight: float = 1.0
    #: For a task judged by relative loss (its own loss, any scale), the final score in points the terminal
    #: reward reads: this times -ln(validation loss), so that a loss 10% lower is worth about one accuracy
    #: point (on mnist1d from 2x8, growth's +3 points came with a loss 35% lower: ln ratio 0.42, 4.2 such points).
    relative_loss_points: float = 10.0
    #: Penalty of a step during which the governor rolled the model back.
    rollback_penalty: float = 1.0
    #: Loss mode: reward per unit of validation-loss decrease.
    loss_delta_scale: float = 1.0
    #: Loss mode: the scaled loss delta is clipped to ±this (a diverged loss counts as -this).
    loss_delta_clip: float = 1.0

    def __post_init__(self) -> None:
        for config_field in dataclasses.fields(self):
            value = getattr(self, config_field.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"RewardConfig.{config_field.name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"RewardConfig.{config_field.name} must be finite, got {value}")
            if not config_field.name.startswith("potential_") and value < 0:
                raise ValueError(f"RewardConfig.{config_field.name} must be >= 0, got {value}")
        if not isinstance(self.rent_floor_parameters, int) or self.rent_floor_parameters < 1:
            raise ValueError(f"RewardConfig.rent_floor_parameters must be an integer >= 1, "
                             f"got {self.rent_floor_parameters!r}")
        for name in ("contribution_clip", "loss_delta_clip"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RewardConfig.{name} must be > 0, got {getattr(self, name)}")

    def potential(self, stage: Stage) -> float:
        """The unscaled potential of a slot in `stage`."""
        potentials = {
            Stage.GERMINATED: self.potential_germinated,
            Stage.TRAINING: self.potential_training,
            Stage.BLENDING: self.potential_blending,
            Stage.HOLDING: self.potential_holding,
            Stage.FOSSILIZED: self.potential_fossilized,
        }
        return potentials.get(stage, 0.0)

    def cost(self, op: Op) -> float:
        """The cost (>= 0) of attempting `op`."""
        costs = {
            Op.WAIT: 0.0,
            Op.GERMINATE: self.germinate_cost,
            Op.GROW: self.germinate_cost,
            Op.SET_ALPHA_TARGET: self.set_alpha_target_cost,
            Op.PRUNE: self.prune_cost,
            Op.FOSSILIZE: self.fossilize_cost,
            Op.ADVANCE: self.advance_cost,
        }
        return costs[op]


@dataclass(frozen=True)
class RewardBreakdown:
    """A step's reward and its named components; `total` is their sum."""

    total: float
    components: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        expected = math.fsum(value for _, value in self.components)
        if not math.isclose(self.total, expected, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(f"total {self.total} is not the sum of the components ({expected}); "
                             "build breakdowns with RewardBreakdown.from_components")

    @classmethod
    def from_components(cls, components: Iterable[tuple[str, float]]) -> RewardBreakdown:
        """Breakdown whose total is the (exactly rounded) sum of `components`; all must be finite."""
        items = tuple((name, float(value)) for name, value in components)
        bad = [name for name, value in items if not math.isfinite(value)]
        if bad:
            raise ValueError(f"non-finite reward components {bad}: {dict(items)}")
        return cls(math.fsum(value for _, value in items), items)


# ---------------------------------------------------------------- the formulas
def parameter_rent(added: int, host: int, config: RewardConfig) -> float:
    """Rent as a reward (<= 0): ``-min(w ln(1 + added / max(host, floor)), cap)``."""
    if added < 0 or host < 0:
        raise ValueError(f"parameter counts must be >= 0, got added={added}, host={host}")
    ratio = added / max(host, config.rent_floor_parameters)
    return -min(config.rent_weight * math.log1p(ratio), config.rent_cap)


def step_rent(current: EpisodeSnapshot, done: bool, config: RewardConfig) -> float:
    """Dense modes' rent: the formula / max_epochs each step, plus the full formula at the last step."""
    rent = parameter_rent(current.added_parameters, current.host_parameters, config)
    per_step = rent / max(current.max_epochs, 1)
    return per_step + rent if done else per_step


def stage_potential(stage: Stage, config: RewardConfig) -> float:
    """Phi of one slot in `stage`: its potential times `shaping_scale`."""
    return config.shaping_scale * config.potential(stage)


def episode_potential(snapshot: EpisodeSnapshot, config: RewardConfig) -> float:
    """Phi(s): the sum of the slots' stage potentials."""
    return math.fsum(stage_potential(slot.stage, config) for slot in snapshot.slots)


def shaping_reward(previous: EpisodeSnapshot, current: EpisodeSnapshot, done: bool, config: RewardConfig,
                   gamma: float) -> float:
    """``gamma Phi(current) - Phi(previous)``, with Phi(current) = 0 when the episode ends here."""
    next_potential = 0.0 if done else episode_potential(current, config)
    return gamma * next_potential - episode_potential(previous, config)


def contribution_reward(snapshot: EpisodeSnapshot, config: RewardConfig) -> float:
    """Credited counterfactual contributions (clipped, share-capped, alpha-scaled) times the scale."""
    relative = snapshot.criterion is Criterion.RELATIVE_LOSS
    credited: list[tuple[float, float]] = []  # (alpha, clipped contribution in points)
    for slot in snapshot.slots:
        points = _relative_points(slot.loss_contribution, snapshot.val_loss, config) if relative else \
            slot.contribution
        if slot.stage in BLENDED_STAGES and slot.alpha > 0.0 and points is not None:
            clipped = min(max(points, -config.contribution_clip), config.contribution_clip)
            credited.append((slot.alpha, clipped))
    claimed = math.fsum(points for _, points in credited if points > 0.0)
    share = 1.0
    # The all-seeds-off configuration is measured in the task's score, which relative points are not.
    if snapshot.accuracy_all_off is not None and claimed > 0.0 and not relative:
        gained = max(snapshot.val_accuracy - snapshot.accuracy_all_off, 0.0)
        share = min(gained / claimed, 1.0)
    total = math.fsum(alpha * points * share if points > 0.0 else points for alpha, points in credited)
    return config.contribution_scale * total


def _relative_points(loss_removed: float | None, loss: float, config: RewardConfig) -> float | None:
    """A seed's contribution in the points of a task judged by relative loss: `relative_loss_points` times
    ln(loss without it / loss with it), as the terminal reward counts them (None: not measured, or no log)."""
    if loss_removed is None or not 0.0 < loss < math.inf or not loss + loss_removed > 0.0:
        return None
    return config.relative_loss_points * math.log1p(loss_removed / loss)


def action_cost(op: Op, succeeded: bool, config: RewardConfig) -> float:
    """Cost (as a reward <= 0) of attempting `op`, plus `failed_action_cost` if it did not take effect."""
    cost = config.cost(op)
    if op is not Op.WAIT and not succeeded:
        cost += config.failed_action_cost
    return -cost


def terminal_reward(snapshot: EpisodeSnapshot, config: RewardConfig) -> float:
    """``terminal_accuracy_weight * final score / 100``: the score is the accuracy in points, or, for a task
    judged by relative loss, ``-relative_loss_points * ln(loss)`` (its score, the metric or the negated loss,
    is on a scale only its author knows: judged by it, growth that lowered a regression's loss by a fifth was
    worth a hundredth of the rent of its parameters)."""
    points = snapshot.val_accuracy
    if snapshot.criterion is Criterion.RELATIVE_LOSS and 0.0 < snapshot.val_loss < math.inf:
        points = -config.relative_loss_points * math.log(snapshot.val_loss)
    return config.terminal_accuracy_weight * points / 100.0


def loss_delta_reward(previous: EpisodeSnapshot, current: EpisodeSnapshot, config: RewardConfig) -> float:
    """``(previous loss - current loss) * loss_delta_scale``, clipped to ±loss_delta_clip; for a task judged by
    relative loss, ``ln(previous loss / current loss)`` in place of the difference.

    A non-finite current loss counts as the worst case; a non-finite previous loss leaves no baseline
    to compare with, so the step gets 0.
    """
    if not math.isfinite(current.val_loss):
        return -config.loss_delta_clip
    if not math.isfinite(previous.val_loss):
        return 0.0
    delta = (previous.val_loss - current.val_loss) * config.loss_delta_scale
    if current.criterion is Criterion.RELATIVE_LOSS and previous.val_loss > 0.0 and current.val_loss > 0.0:
        delta = math.log(previous.val_loss / current.val_loss) * config.loss_delta_scale  # the loss's unit cancels
    return min(max(delta, -config.loss_delta_clip), config.loss_delta_clip)


# ---------------------------------------------------------------- the modes
def compute_reward(mode: RewardMode, previous: EpisodeSnapshot, current: EpisodeSnapshot, action: Action,
                   action_succeeded: bool, done: bool, config: RewardConfig,
                   gamma: float = 0.995) -> RewardBreakdown:
    """The reward of the transition `previous` -> `current` caused by `action`, in named components.

    `gamma` is the discount of potential-based shaping; pass the PPO gamma.
    """
    if not isinstance(mode, RewardMode):
        raise TypeError(f"mode must be a RewardMode ({', '.join(m.name for m in RewardMode)}), got {mode!r}")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    _check_same_episode(previous, current)
    rollback = -config.rollback_penalty if current.rolled_back else 0.0
    if mode is RewardMode.SPARSE:
        final_rent = parameter_rent(current.added_parameters, current.host_parameters, config)
        return RewardBreakdown.from_components((
            ("terminal", terminal_reward(current, config) if done else 0.0),
            ("rent", final_rent if done else 0.0),
            ("rollback", rollback),
        ))
    shared = (
        ("action_cost", action_cost(action.op, action_succeeded, config)),
        ("terminal", terminal_reward(current, config) if done else 0.0),
        ("rollback", rollback),
    )
    if mode is RewardMode.SIMPLIFIED:
        return RewardBreakdown.from_components((
            ("shaping", shaping_reward(previous, current, done, config, gamma)), *shared,
        ))
    rent = ("rent", step_rent(current, done, config))
    if mode is RewardMode.LOSS:
        return RewardBreakdown.from_components((
            ("loss_delta", loss_delta_reward(previous, current, config)), rent, *shared,
        ))
    return RewardBreakdown.from_components((
        ("contribution", contribution_reward(current, config)),
        ("shaping", shaping_reward(previous, current, done, config, gamma)),
        rent, *shared,
    ))


def _check_same_episode(previous: EpisodeSnapshot, current: EpisodeSnapshot) -> None:
    previous_ids = [slot.slot_id for slot in previous.slots]
    current_ids = [slot.slot_id for slot in current.slots]
    if previous_ids != current_ids or previous.max_epochs != current.max_epochs:
        raise ValueError(f"previous and current snapshots are from different episodes (slots "
                         f"{previous_ids} vs {current_ids}, max_epochs {previous.max_epochs} vs "
                         f"{current.max_epochs}): pass consecutive snapshots of one episode")
