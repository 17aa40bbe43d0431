"""Where to grow, and whether deeper or wider, from measured growth signals per FLOP.

At every empty slot the episode measured (`env/growth_signals.py`) what the loss could gain at the slot's
activation, where a deepening seed adds its output (`depth_signal`), and at the next layer's output, where a
widening seed adds its new channels' contribution (`width_signal`), together with what each candidate blueprint
would add in FLOPs relative to the host. A candidate's score is its signal over its relative FLOPs: the
first-order gain the measurement promises for each unit of compute it costs, the trade-off width-growth methods
make when they pick where to add neurons (GradMax, TINY) with the cost of a seed made explicit. The best score
wins, among the allowed slots and the blueprints that are not held back.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

from morphogen.env.growth_signals import MIN_RELATIVE_FLOPS
from morphogen.env.snapshot import SlotSnapshot


class GrowthOption(NamedTuple):
    """A candidate: germinate `blueprint` in `slot`, scored by measured signal per relative FLOP."""

    score: float
    slot: str
    blueprint: str


def growth_options(slots: Collection[SlotSnapshot], allowed: Collection[str], deepening: str | None,
                   widening: str | None) -> list[GrowthOption]:
    """Every scored candidate: `deepening` by each allowed slot's depth signal, `widening` by its width signal.

    A slot without measured signals, or a blueprint without a measured cost there (a widening one where the
    slot has no layers to widen), gives no candidate.
    """
    options = []
    for slot in slots:
        if slot.slot_id not in allowed or slot.depth_signal is None:
            continue
        costs = dict(slot.seed_costs)
        for blueprint, signal in ((deepening, slot.depth_signal), (widening, slot.width_signal)):
            if blueprint is None or signal is None or blueprint not in costs:
                continue
            options.append(GrowthOption(signal / max(costs[blueprint].relative_flops, MIN_RELATIVE_FLOPS),
                                        slot.slot_id, blueprint))
    return options


def best_growth(slots: Collection[SlotSnapshot], allowed: Collection[str], deepening: str | None,
                widening: str | None) -> GrowthOption | None:
    """The candidate with the best signal per FLOP (ties: the slot first in execution order), or None."""
    options = growth_options(slots, allowed, deepening, widening)
    order = {slot.slot_id: index for index, slot in enumerate(slots)}
    return max(options, key=lambda option: (option.score, -order[option.slot]), default=None)
