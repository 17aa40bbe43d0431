"""The compute an episode spends, in FLOPs, by what it buys: training, shadow passes, validation, counterfactuals.

The episode charges each epoch once, after it trained and when it validates: the batches it trained (how
many of each `InputSpec`, the shapes and dtypes of a batch's inputs, noted by `HostAndSeedTrainer`) times
the cached count of one batch in the model's plan (`morphogen.core.flops.FlopCounter`), and the validation
batches times the count of one batch under the epoch's counterfactual configurations. Nothing is counted per step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from morphogen.core.flops import FlopCounter
from morphogen.core.model import MorphogeneticModel, shadow_rows
from morphogen.inputs import Inputs, InputSpec

#: Input spec (shapes and dtypes of the batch's inputs) -> batches of that spec: what an epoch trained or validated on.
BatchShapes = Mapping[InputSpec, int]


@dataclass
class ComputeAccount:
    """FLOPs spent so far in an episode; `total` is what `morphogen run` reports as its training FLOPs."""

    training: int = 0
    """Forward and backward of the host and the blended seeds on the training batches."""
    shadow: int = 0
    """The TRAINING seeds' shadow passes on the training batches (forward, and backward into the seeds)."""
    validation: int = 0
    """The model's own forward on the validation data, once per epoch (and once before training)."""
    counterfactual: int = 0
    """The counterfactual configurations evaluated next to it (each seed ablated, each TRAINING seed blended in)."""
    probe: int = 0
    """Growth signals measured for a controller that chooses where and how to grow by them."""

    @property
    def total(self) -> int:
        return self.training + self.shadow + self.validation + self.counterfactual + self.probe

    @property
    def measurement(self) -> int:
        """What measuring the seeds costs: shadow passes, counterfactual configurations and growth signals."""
        return self.shadow + self.counterfactual + self.probe

    def as_dict(self) -> dict[str, int]:
        """The figures as summary.json records them (`total` first)."""
        return {"total": self.total, "training": self.training, "shadow": self.shadow,
                "validation": self.validation, "counterfactual": self.counterfactual, "probe": self.probe}

    def charge_training(self, counter: FlopCounter, model: MorphogeneticModel, shapes: BatchShapes,
                        shadow_fraction: float = 1.0) -> None:
        """Add the training batches `shapes` of one epoch, trained in the model's present plan with the shadow
        pass on `shadow_fraction` of each batch."""
        for spec, batches in shapes.items():
            step = counter.training_step(model, spec, shadow_rows(spec.rows, shadow_fraction))
            self.training += step.main * batches
            self.shadow += step.shadow * batches

    def charge_validation(self, counter: FlopCounter, model: MorphogeneticModel,
                          alphas: Sequence[Sequence[float]], shapes: BatchShapes) -> None:
        """Add one validation pass over batches `shapes` under the configurations `alphas` (row 0: the model's own)."""
        for spec, batches in shapes.items():
            batch = counter.validation_batch(model, alphas, spec)
            self.validation += batch.main * batches
            self.counterfactual += batch.counterfactual * batches


def note_batch(shapes: Counter[InputSpec], inputs: Inputs) -> None:
    """Count one batch of `inputs`'s spec in `shapes` (a dictionary update: no sync, no FLOP counting)."""
    shapes[InputSpec.of(inputs)] += 1

