"""Which alpha configurations to evaluate alongside the real model, and what their results mean.

Configurations (docs/architecture.md#counterfactuals): `main` (every alpha as it is), `without:<slot>` for each seed
blended in with alpha > 0, and `all_off` when 2..4 seeds are live (with one seed it equals that
seed's `without`, with more it grows costly). A seed's contribution is acc(main) - acc(without it),
in accuracy points, and its loss contribution loss(without it) - loss(main), in nats per token for a
language model (positive: the seed lowers the loss). `with:<slot>` blends a TRAINING seed in at alpha 1:
its shadow contribution acc(with it) - acc(main) says what blending it would bring, which the model's own
accuracy cannot show while the seed's output is not added.

Every configuration but `main` costs a forward pass over the validation data from its slot on. When only
a controller's decisions need them (`CounterfactualSchedule.FOR_DECISIONS`), the episode plans a seed's
configuration only in the epochs whose measurement a gate or the heuristic reads next: a TRAINING seed's
shadow once it has trained nearly long enough to blend, the ablation of a HOLDING seed and of a BLENDING
one whose ramp ends this epoch; never a fossilized seed's, never `all_off`. A learned policy observes
every measurement every epoch (`EVERY_EPOCH`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from morphogen.inputs import InputSpec

MAIN = "main"
ALL_OFF = "all_off"
ALL_OFF_MIN_SEEDS, ALL_OFF_MAX_SEEDS = 2, 4


class CounterfactualSchedule(enum.Enum):
    """Which counterfactual configurations an episode evaluates each epoch."""

    EVERY_EPOCH = "every_epoch"
    """Every seed's configuration every epoch, and `all_off`: what a learned policy observes."""
    FOR_DECISIONS = "for_decisions"
    """Only the configurations whose measurement a gate or the heuristic reads next (module docstring)."""


def without_seed(slot_id: str) -> str:
    return f"without:{slot_id}"


def with_seed(slot_id: str) -> str:
    return f"with:{slot_id}"


@dataclass(frozen=True)
class AlphaConfigurations:
    """K named alpha configurations: `alphas[k][j]` is slot j's alpha in configuration k."""

    slot_ids: tuple[str, ...]
    names: tuple[str, ...]
    alphas: tuple[tuple[float, ...], ...]
    #: Slots whose seed is ablated by a `without:` configuration, in order.
    ablated: tuple[str, ...]
    #: TRAINING slots whose seed a `with:` configuration blends in at alpha 1 (its shadow), in order.
    shadowed: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class CounterfactualResult:
    """Validation accuracy (points) and mean loss per configuration of `configurations`."""

    configurations: AlphaConfigurations
    accuracies: tuple[float, ...]
    losses: tuple[float, ...]
    #: (input spec, batches) of the validation pass that measured them: what its FLOPs are charged for.
    batch_shapes: tuple[tuple[InputSpec, int], ...] = ()

    def accuracy(self, name: str) -> float:
        return self.accuracies[self.configurations.names.index(name)]

    def loss(self, name: str) -> float:
        return self.losses[self.configurations.names.index(name)]

    @property
    def contributions(self) -> dict[str, float]:
        """Slot -> accuracy points its seed adds: acc(main) - acc(without it) for a blended seed, and
        acc(with it at alpha 1) - acc(main) for a TRAINING seed (its shadow contribution)."""
        main = self.accuracy(MAIN)
        configurations = self.configurations
        measured = {slot_id: main - self.accuracy(without_seed(slot_id)) for slot_id in configurations.ablated}
        measured.update({slot_id: self.accuracy(with_seed(slot_id)) - main for slot_id in configurations.shadowed})
        return measured

    @property
    def loss_contributions(self) -> dict[str, float]:
        """Slot -> validation loss its seed removes (nats per token for a language model): loss(without it) -
        loss(main) for a blended seed, and loss(main) - loss(with it at alpha 1) for a TRAINING seed."""
        main = self.loss(MAIN)
        configurations = self.configurations
        measured = {slot_id: self.loss(without_seed(slot_id)) - main for slot_id in configurations.ablated}
        measured.update({slot_id: main - self.loss(with_seed(slot_id)) for slot_id in configurations.shadowed})
        return measured

    @property
    def accuracy_all_off(self) -> float | None:
        return self.accuracy(ALL_OFF) if ALL_OFF in self.configurations.names else None


def alpha_configurations(slot_ids: Sequence[str], alphas: Mapping[str, float],
                         training: Sequence[str] = (), *, ablate: Sequence[str] | None = None,
                         all_off: bool = True) -> AlphaConfigurations:
    """Plan the configurations for blended seeds `alphas` (slot -> current alpha; absent = no seed) and
    for the shadows of the TRAINING seeds in `training`.

    `ablate` names the blended seeds that get a `without:` configuration (None: every one with alpha > 0);
    `all_off=False` leaves out the configuration without any seed.
    """
    current = tuple(float(alphas.get(slot_id, 0.0)) for slot_id in slot_ids)
    live = [slot_id for slot_id in slot_ids if alphas.get(slot_id, 0.0) > 0.0]
    ablated = live if ablate is None else [slot_id for slot_id in live if slot_id in ablate]
    names, rows = [MAIN], [current]
    for slot_id in ablated:
        j = list(slot_ids).index(slot_id)
        names.append(without_seed(slot_id))
        rows.append((*current[:j], 0.0, *current[j + 1 :]))
    if all_off and ALL_OFF_MIN_SEEDS <= len(live) <= ALL_OFF_MAX_SEEDS:
        names.append(ALL_OFF)
        rows.append(tuple(0.0 for _ in slot_ids))
    for slot_id in training:
        j = list(slot_ids).index(slot_id)
        names.append(with_seed(slot_id))
        rows.append((*current[:j], 1.0, *current[j + 1 :]))
    return AlphaConfigurations(tuple(slot_ids), tuple(names), tuple(rows), tuple(ablated), tuple(training))
