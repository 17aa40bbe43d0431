"""Task losses and the validation pass that evaluates the model and its counterfactuals together.

An `Objective` is how a task judges outputs: a training loss and a validation score (higher is better).
The built-in one is cross-entropy and accuracy in percent, computed for all K counterfactual
configurations in one vectorized call; a task's own loss and metric run once per configuration.
Metrics accumulate in device tensors across batches; `validate` synchronizes once, at its end.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from morphogen.core.model import MorphogeneticModel
from morphogen.data import BatchSource, DataError, Task
from morphogen.env.compute import note_batch
from morphogen.env.counterfactual import AlphaConfigurations, CounterfactualResult
from morphogen.inputs import InputSpec

LossFunction = Callable[[Tensor, Tensor], Tensor]

OBJECTIVES = ("classification", "language_model")


def task_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy for classification ([B, C] vs [B]) or language modelling ([B, T, V] vs [B, T])."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@dataclass(frozen=True)
class Objective:
    """The training loss and the validation score of a task; `custom` when either is the task's own."""

    loss: LossFunction
    """`loss(outputs [B, ...], targets [B, ...])` -> the batch's mean loss, a scalar."""
    metric: LossFunction | None
    """`metric(outputs, targets)` -> the batch's mean score, higher is better; None scores by accuracy (built-in)
    or, with a custom loss, by the negative loss."""
    custom: bool

    @classmethod
    def of(cls, task: Task) -> Objective:
        """The task's own loss and metric where it has them, else cross-entropy and accuracy."""
        if task.loss is None and task.metric is None:
            return cls(task_loss, None, custom=False)
        return cls(task.loss or task_loss, task.metric, custom=True)

    def checked_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """`loss(outputs, targets)`, refused with a `DataError` when it is not a scalar tensor (no sync)."""
        value = self.loss(outputs, targets)
        if not isinstance(value, Tensor) or value.dim() != 0:
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise DataError(f"the task's loss must return a scalar tensor (the batch mean), returned {shape}")
        return value

    def shadow_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Sum over K shadow configurations of each one's loss: outputs (K, B, ...), targets (B, ...).

        Summing keeps every seed's gradient that of its own loss (its rows are the only ones it affects).
        """
        k = outputs.shape[0]
        if not self.custom:
            return task_loss(outputs, targets.expand(k, *targets.shape)) * k  # targets (K, B, ...) as a view
        return torch.stack([self.checked_loss(outputs[i], targets) for i in range(k)]).sum()

    def loss_and_score(self, outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, int]:
        """For outputs [K, B, ...]: summed loss [K], summed score [K] and the number of items they sum over."""
        if not self.custom:
            losses, correct = per_config_loss_and_correct(outputs, targets)
            return losses, 100.0 * correct.to(losses.dtype), targets.numel()
        batch = targets.shape[0]
        losses = torch.stack([self.checked_loss(outputs[i], targets) for i in range(outputs.shape[0])])  # (K,)
        if self.metric is None:
            scores = -losses
        else:
            scores = torch.stack([torch.as_tensor(self.metric(outputs[i], targets)).reshape(())
                                  for i in range(outputs.shape[0])]).to(losses.dtype)  # (K,)
        return losses * batch, scores * batch, batch


def per_config_loss_and_correct(outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """For outputs [K, B, ..., C]: summed loss [K] and correct-prediction count [K] over the batch."""
    k = outputs.shape[0]
    logits = outputs.reshape(k, -1, outputs.shape[-1])  # (K, B*T, C)
    flat_targets = targets.reshape(1, -1).expand(k, -1)  # (K, B*T)
    losses = nn.functional.cross_entropy(logits.transpose(1, 2), flat_targets, reduction="none")  # (K, B*T)
    correct = (logits.argmax(dim=-1) == flat_targets).sum(dim=1)  # (K,)
    return losses.sum(dim=1), correct


@torch.inference_mode()
def validate(model: MorphogeneticModel, dataset: BatchSource, configurations: AlphaConfigurations,
             batch_size: int = 512, objective: Objective | None = None,
             reduce: Callable[[Tensor], Tensor] | None = None) -> CounterfactualResult:
    """Score (accuracy points by default) and mean loss of every configuration, in one pass over `dataset`.

    `reduce` sums the [3, K] sums of loss, score and items over processes that each validate their share of the
    data (`Grower(distributed=True)`), so that every process reads the same figures. One host sync at the end.
    """
    objective = objective or Objective(task_loss, None, custom=False)
    was_training = model.training
    model.eval()
    k = configurations.size
    loss_sum = torch.zeros(k, device=dataset.device, dtype=torch.float64)
    score_sum = torch.zeros(k, device=dataset.device, dtype=torch.float64)
    count = 0
    alphas = [list(row) for row in configurations.alphas]
    shapes: Counter[InputSpec] = Counter()
    for inputs, targets in dataset.iterate_batches(batch_size, shuffle=False):
        note_batch(shapes, inputs)
        outputs = model.counterfactual_forward(inputs, alphas)  # (K, B, ...)
        batch_loss, batch_score, items = objective.loss_and_score(outputs, targets)
        loss_sum += batch_loss.to(torch.float64)
        score_sum += batch_score.to(torch.float64)
        count += items
    model.train(was_training)
    sums = torch.stack([loss_sum, score_sum, torch.full_like(loss_sum, count)])
    loss_values, score_values, counts = (sums if reduce is None else reduce(sums)).tolist()  # the one sync
    total = counts[0]
    if total == 0:
        raise DataError("the validation data yielded no batch")
    return CounterfactualResult(configurations, tuple(v / total for v in score_values),
                                tuple(v / total for v in loss_values), tuple(shapes.items()))
