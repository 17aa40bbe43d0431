"""The grown architecture as a plain module: the host's segments with every kept seed folded in.

`grown_network(model)` copies a `MorphogeneticModel` into a `GrownNetwork`, an ordinary feed-forward
`nn.Module` in eval mode: segment 0, the seed folded in at the first slot, segment 1, ... No lifecycle, alpha
buffer, shadow pass or counterfactual is left, so `torch.export` and ONNX see a plain graph.

Which seeds go in (the model's output decides):
- HOLDING and FOSSILIZED seeds are folded in at their alpha, which is 1 for both (a seed enters HOLDING
  only once its ramp reached 1). A HOLDING seed is not judged yet, but it is part of every accuracy the run
  reported, so leaving it out would export another model than the one measured.
- A BLENDING seed is folded in at the alpha its ramp has reached, for the same reason: a run that ends while a
  seed blends reports the model with the seed at that alpha. `leave_out_blending=True` drops it instead (the
  output then differs from the grown model's).
- GERMINATED and TRAINING seeds are left out: they learn behind the host and are not part of its output,
  so the network without them computes exactly what the grown model computes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from torch import Tensor, nn

from morphogen.core.blend import Blend
from morphogen.core.hosts import CarriedValues, SideInputs
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.width import WidthSite, run_cut_segment
from morphogen.inputs import Inputs

#: Stages whose seed is kept for good or on trial: folded into the plain network whatever it is asked.
KEPT_STAGES = frozenset({Stage.HOLDING, Stage.FOSSILIZED})


def exported_stages(leave_out_blending: bool) -> frozenset[Stage]:
    """The stages whose seeds a plain network holds: those in the model's output, BLENDING ones unless left out."""
    return KEPT_STAGES if leave_out_blending else KEPT_STAGES | {Stage.BLENDING}


class ExportError(ValueError):
    """A grown model that cannot be written as a plain network (the message says why and what to do)."""


class FoldedSeed(nn.Module):
    """A kept seed with its blend at a fixed alpha: `blend(h, seed(h), alpha)`."""

    def __init__(self, seed: nn.Module, blend: Blend, alpha: float) -> None:
        super().__init__()
        self.seed, self.blend, self.alpha = seed, blend, alpha

    def forward(self, h: Tensor) -> Tensor:
        output: Tensor = self.blend(h, self.seed(h), self.alpha)
        return output


class FoldedWidening(nn.Module):
    """A kept widening seed at a fixed alpha: what its new channels add to the consumer's output, times alpha."""

    def __init__(self, seed: nn.Module, alpha: float) -> None:
        super().__init__()
        self.seed, self.alpha = seed, alpha

    def forward(self, consumer_output: Tensor, tap: Tensor) -> Tensor:
        added: Tensor = self.seed(tap)
        return consumer_output + self.alpha * added


class FoldedBranch(nn.Module):
    """A kept branch seed at a fixed alpha: `blend(h, h + branch(x), alpha)` with `x` the input of the segment
    before its point and `h` that segment's output."""

    def __init__(self, seed: nn.Module, blend: Blend, alpha: float) -> None:
        super().__init__()
        self.seed, self.blend, self.alpha = seed, blend, alpha

    def forward(self, h: Tensor, entering: Tensor) -> Tensor:
        added: Tensor = self.seed(entering)
        output: Tensor = self.blend(h, h + added, self.alpha)
        return output


class GrownNetwork(nn.Module):
    """`segments[0] -> seeds[0] -> segments[1] -> ... -> segments[-1]`; an empty point holds an `nn.Identity`.

    A kept widening seed (`widenings`, by point) reads its producer's input inside the segment before its point
    and adds to its consumer's output inside the segment after it (`morphogen.core.width`); a kept branch seed
    (`branches`, by point) reads the input of the segment before its point and adds at the point
    (`morphogen.core.branch`). The points of both hold an `nn.Identity`.
    """

    def __init__(self, segments: Sequence[nn.Module], seeds: Sequence[nn.Module],
                 widenings: Mapping[int, tuple[WidthSite, FoldedWidening]] | None = None,
                 branches: Mapping[int, FoldedBranch] | None = None) -> None:
        super().__init__()
        if len(segments) != len(seeds) + 1:
            raise ValueError(f"a network of {len(seeds)} points needs {len(seeds) + 1} segments, got {len(segments)}")
        self.segments = nn.ModuleList(segments)
        self.seeds = nn.ModuleList(seeds)
        self.branches = nn.ModuleDict({str(point): folded for point, folded in (branches or {}).items()})
        widenings = dict(widenings or {})
        self.widenings = nn.ModuleDict({str(point): folded for point, (_, folded) in widenings.items()})
        #: Where each widening cuts the segments (plain numbers: the site's layers are the segments' own).
        self._sites = [(point, site) for point, (site, _) in sorted(widenings.items())]
        #: Where the segments after the first read the inputs of a model of several inputs (its segments' own).
        self._side_inputs = [module for module in self.segments.modules() if isinstance(module, SideInputs)]
        #: Where the segments hand values across the points (a U-Net's skips: the host's `CarriedValues`).
        self._carried = [module for module in self.segments.modules() if isinstance(module, CarriedValues)]

    def forward(self, x: Inputs) -> Tensor:
        """The network's output for a batch of the host's inputs (a tensor, or a tuple or dict of tensors)."""
        taps: dict[int, Tensor] = {}

        def inject(point: int, consumer_output: Tensor, tap: Tensor | None) -> Tensor:
            assert tap is not None
            widened: Tensor = self.widenings[str(point)](consumer_output, tap)
            return widened

        for index, segment in enumerate(self.segments):
            entering = x
            h = run_cut_segment(segment, index, x, self._sites, inject, taps)
            if str(index) in self.branches:
                assert isinstance(entering, Tensor)  # a branch reads a tensor (no branch beside several inputs)
                h = self.branches[str(index)](h, entering)
            x = self.seeds[index](h) if index < len(self.seeds) else h
        for side_inputs in self._side_inputs:  # the pass is over: nothing keeps the batch's inputs
            side_inputs.release()
        for carried in self._carried:  # ... nor its activations
            carried.release()
        assert isinstance(x, Tensor)
        return x


def refuse_other_than_a_grown_model(model: object, function: str) -> None:
    """`ExportError` where `model`, given to `function`, is not a `MorphogeneticModel` (the user's network, a host)."""
    if not isinstance(model, MorphogeneticModel):
        raise ExportError(f"{function} takes the grown model (a MorphogeneticModel: `result.model` of "
                          f"morphogen.grow, `grower.model`), not a {type(model).__name__}")


def grown_network(model: MorphogeneticModel, *, leave_out_blending: bool = False) -> GrownNetwork:
    """A copy of `model` as a `GrownNetwork` in eval mode (see the module docstring for which seeds go in;
    `leave_out_blending` drops BLENDING seeds).

    The copy shares nothing with `model`: training or moving one leaves the other as it was.
    """
    refuse_other_than_a_grown_model(model, "grown_network")
    kept = exported_stages(leave_out_blending)
    host = model.host
    folded: list[nn.Module] = []
    widenings: dict[int, tuple[WidthSite, FoldedWidening]] = {}
    branches: dict[int, FoldedBranch] = {}
    for point, slot_id in enumerate(host.injection_points):
        slot = model.slot(slot_id) if slot_id in model.seed_slots else None
        if slot is None or slot.stage not in kept:
            folded.append(nn.Identity())
            continue
        assert slot.seed is not None and slot.blend is not None
        if slot.widens:
            assert slot.width_site is not None
            widenings[point] = (slot.width_site, FoldedWidening(slot.seed, float(slot.alpha.alpha)))
            folded.append(nn.Identity())
            continue
        if slot.branches:
            branches[point] = FoldedBranch(slot.seed, slot.blend, float(slot.alpha.alpha))
            folded.append(nn.Identity())
            continue
        folded.append(FoldedSeed(slot.seed, slot.blend, float(slot.alpha.alpha)))
    segments = [host.segments[index] for index in range(len(folded) + 1)]
    # One deepcopy of everything at once, so that modules shared between segments stay shared in the copy (the
    # sites refer to layers of the segments: copied with them).
    network = GrownNetwork(*copy.deepcopy((segments, folded, widenings, branches)))
    return network.eval()
