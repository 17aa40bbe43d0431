"""Task losses and the validation pass that evaluates the model and its counterfactuals together.

An `Objective` is how a task judges outputs: a training loss and a validation score (higher is better).
The built-in one is cross-entropy and accuracy in percent, computed for all K counterfactual
configurations in one vectorized call; a task's own loss and metric run once per configuration.
Metrics accumulate in device tensors across batches; `validate` synchronizes once, at its end.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from morphogen.core.model import MorphogeneticModel
from morphogen.data import BatchSource, DataError, Task
from morphogen.data.datasets import DeviceDataset
from morphogen.data.user import IGNORE_INDEX, check_class_indices
from morphogen.env.compute import note_batch
from morphogen.env.counterfactual import AlphaConfigurations, CounterfactualResult
from morphogen.inputs import InputSpec, to_device

LossFunction = Callable[[Tensor, Tensor], Tensor]

OBJECTIVES = ("classification", "language_model")

NO_BATCH_CAUSES = ("(an empty split, batches larger than the split with drop_last=True, or a generator, which runs "
                   "once: give a list, a Dataset or a DataLoader)")
"""What can leave a split without a batch, for the `DataError` that says it did."""


_ELEMENTWISE_LOSS_FUNCTIONS = (nn.functional.mse_loss, nn.functional.l1_loss, nn.functional.smooth_l1_loss,
                               nn.functional.huber_loss)
_ELEMENTWISE_LOSS_MODULES = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss)


def _broadcasts_silently(loss: LossFunction) -> bool:
    """Whether `loss` is one of torch's element-wise regression losses (a function, a `functools.partial` of one, or
    its module), which broadcast outputs and targets of different shapes with a warning rather than an error."""
    function = loss.func if isinstance(loss, functools.partial) else loss
    return isinstance(function, _ELEMENTWISE_LOSS_MODULES) or any(function is f for f in _ELEMENTWISE_LOSS_FUNCTIONS)


def _broadcast_shape(first: torch.Size, second: torch.Size) -> tuple[int, ...] | None:
    """The shape `first` and `second` broadcast to, by torch's rules (trailing dimensions equal or 1); None where
    they do not."""
    shape = []
    for one, other in itertools.zip_longest(reversed(first), reversed(second), fillvalue=1):
        if one != other and 1 not in (one, other):
            return None
        shape.append(other if one == 1 else one)
    return tuple(reversed(shape))


def task_loss(logits: Tensor, targets: Tensor, class_dim: int = -1) -> Tensor:
    """Mean cross-entropy for classification ([B, C] vs [B]) or language modelling ([B, T, V] vs [B, T]), or
    with the classes on dimension 1 ([B, C, ...] vs [B, ...], `class_dim=1`) over every position."""
    if class_dim == 1:
        return nn.functional.cross_entropy(logits, targets)  # torch's own layout: no copy
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def class_dim_of(outputs: torch.Size, targets: torch.Size, class_dim: int | None) -> int:
    """Where one batch's `outputs` [B, ...] hold the classes for `targets` [B, ...]: `class_dim` when set, else
    whichever of dimension 1 and the last lines the other dimensions up with the targets'. Raises `DataError`
    when neither does, or both do on outputs of three or more dimensions (say which with `class_dim`)."""
    if class_dim is not None:
        return class_dim
    if len(outputs) != len(targets) + 1 or len(outputs) < 2:
        raise DataError(f"outputs {tuple(outputs)} against targets {tuple(targets)}: cross-entropy needs one "
                        "dimension of class scores more than the targets have (or pass a loss of your own)")
    last, first = outputs[1:-1] == targets[1:], outputs[2:] == targets[1:]
    if len(outputs) == 2 or (last and not first):
        return -1
    if first and not last:
        return 1
    if first:
        raise DataError(f"outputs {tuple(outputs)} against targets {tuple(targets)} could hold the classes on "
                        "dimension 1 or on the last: say which with task_from_data(..., class_dim=1 or -1)")
    raise DataError(f"outputs {tuple(outputs)} do not line up with targets {tuple(targets)}: cross-entropy needs "
                    "the targets' shape with the class scores added on dimension 1 or last")


def class_count_problem(outputs: torch.Size, targets: torch.Size, class_dim: int | None, num_classes: int) -> str:
    """Why outputs of shape `outputs` cannot be the default cross-entropy's scores of `num_classes` classes for
    `targets`: "" when they can, or when the shapes do not line up at all (the loss itself says why then)."""
    try:
        dim = class_dim_of(outputs, targets, class_dim)
    except DataError:
        return ""
    scores = outputs[dim]
    if scores == num_classes:
        return ""
    where = "on dimension 1" if dim == 1 else "on the last dimension"
    return (f"the model's outputs have shape {tuple(outputs)} for targets {tuple(targets)}: {scores} class scores "
            f"{where}, but the task has num_classes={num_classes} (give the model {num_classes} outputs there, or "
            f"the task num_classes={scores})")


def refuse_other_class_count(task: Task, model: nn.Module) -> None:
    """A `DataError` where `task` is a classification with `num_classes`, scored by the default cross-entropy, and
    `model` gives another number of class scores on its first validation rows: such a model trains, but its
    accuracy and the task's chance level would mean nothing. A task's own loss or metric is never checked."""
    if task.loss is not None or (task.num_classes is not None and task.metric is not None):
        return
    first = next(iter(task.validation.iterate_batches(2, shuffle=False)), None)
    if first is None:
        return  # no validation batch: the first validation says so
    inputs, targets = first
    weight = next(model.parameters(), None)
    device = "cpu" if weight is None else weight.device
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outputs = model(to_device(inputs, device))
    except (RuntimeError, ValueError, TypeError, IndexError, KeyError):
        return  # the first validation reports what the model cannot take, with its own hints
    finally:
        model.train(training)
    if not isinstance(outputs, Tensor):
        return
    if task.num_classes is None:
        _refuse_targets_beyond_the_scores(task, outputs.shape, targets.shape)
        return
    problem = class_count_problem(outputs.shape, targets.shape, task.class_dim, task.num_classes)
    if problem:
        raise DataError(f"task {task.name!r}: {problem}")


def refuse_first_batch_classes(objective: Objective, num_classes: int | None, targets: Tensor, where: str,
                               outputs: Tensor | None = None) -> None:
    """A `DataError` where a run's first training batch, under the default cross-entropy, names a class outside
    `num_classes` (None: outside the class scores of `outputs`, where given): on a GPU the loss meets one as a
    device-side assert that ends the CUDA context. One host sync: call it on the first batch that trains only."""
    if objective.custom:
        return
    scores = None
    if outputs is not None:
        try:
            scores = outputs.shape[class_dim_of(outputs.shape, targets.shape, objective.class_dim)]
        except DataError:
            return  # outputs and targets that do not line up: the loss says why
    if num_classes is not None:
        check_class_indices(targets, num_classes, where, f"num_classes={num_classes}")
    elif scores is not None:
        check_class_indices(targets, scores, where, f"the model's {scores} class scores")


def _refuse_targets_beyond_the_scores(task: Task, outputs: torch.Size, targets: torch.Size) -> None:
    """For a task without `num_classes`, a `DataError` where the targets it holds as tensors name a class the model
    has no score for (labels counted from 1): caught here, before a GPU's cross-entropy asserts on it."""
    try:
        scores = outputs[class_dim_of(outputs, targets, task.class_dim)]
    except DataError:
        return  # the shapes do not line up: the first validation says why
    for split, source in (("validation", task.validation), ("train", task.train)):
        if isinstance(source, DeviceDataset):
            try:
                check_class_indices(source.targets, scores, split, f"the model's {scores} class scores")
            except DataError as error:
                raise DataError(f"task {task.name!r}: {error}") from None


@dataclass(frozen=True)
class Objective:
    """The training loss and the validation score of a task; `custom` when either is the task's own."""

    loss: LossFunction
    """`loss(outputs [B, ...], targets [B, ...])` -> the batch's mean loss, a scalar."""
    metric: LossFunction | None
    """`metric(outputs, targets)` -> the batch's mean score, higher is better; None scores by accuracy (built-in)
    or, with a custom loss, by the negative loss."""
    custom: bool
    class_dim: int | None = -1
    """The built-in loss and accuracy: where the outputs hold the class scores, 1 or -1 (`Task.class_dim`), or None
    for whichever the shapes of each batch say (`class_dim_of`). `loss` scores them on the last dimension; on
    dimension 1 they are scored by torch's cross-entropy in its own layout."""

    @classmethod
    def of(cls, task: Task) -> Objective:
        """The task's own loss and metric where it has them, else cross-entropy and accuracy."""
        if task.loss is None and task.metric is None:
            return cls(task_loss, None, custom=False, class_dim=task.class_dim)
        return cls(task.loss or task_loss, task.metric, custom=True)

    def checked_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """`loss(outputs, targets)`, refused with a `DataError` when it is not a scalar tensor (no sync)."""
        if not self.custom and class_dim_of(outputs.shape, targets.shape, self.class_dim) == 1:
            return task_loss(outputs, targets, 1)
        if self.custom and outputs.shape != targets.shape and _broadcasts_silently(self.loss):
            broadcast = _broadcast_shape(outputs.shape, targets.shape)
            if broadcast is not None:  # shapes that do not broadcast: torch's own error says so
                raise DataError(f"the task's loss compares outputs {tuple(outputs.shape)} with targets "
                                f"{tuple(targets.shape)} element by element: torch broadcasts them to {broadcast}, "
                                "pairing outputs with other samples' targets; give targets of the outputs' shape "
                                "(y.unsqueeze(1) for one output per sample)")
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
            if class_dim_of(outputs.shape[1:], targets.shape, self.class_dim) == 1:  # (K * B, C, ...)
                return task_loss(outputs.flatten(0, 1), targets.expand(k, *targets.shape).flatten(0, 1), 1) * k
            return task_loss(outputs, targets.expand(k, *targets.shape)) * k  # targets (K, B, ...) as a view
        return torch.stack([self.checked_loss(outputs[i], targets) for i in range(k)]).sum()

    def loss_and_score(self, outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, int | Tensor]:
        """For outputs [K, B, ...]: summed loss [K], summed score [K] and the number of items they sum over (for the
        built-in loss, the targets not at `IGNORE_INDEX`, a 0-dim device tensor: no sync)."""
        if not self.custom:
            class_dim = class_dim_of(outputs.shape[1:], targets.shape, self.class_dim)
            losses, correct = per_config_loss_and_correct(outputs, targets, class_dim)
            return losses, 100.0 * correct.to(losses.dtype), (targets != IGNORE_INDEX).sum()
        batch = targets.shape[0]
        losses = summable(torch.stack([self.checked_loss(outputs[i], targets) for i in range(outputs.shape[0])]))
        if self.metric is None:
            scores = -losses
        else:
            scores = torch.stack([torch.as_tensor(self.metric(outputs[i], targets)).reshape(())
                                  for i in range(outputs.shape[0])]).to(losses.dtype)  # (K,)
        return losses * batch, scores * batch, batch


def summable(values: Tensor) -> Tensor:
    """`values` in float32 at least, to be summed or scaled: in a bfloat16 model's own dtype a batch's summed loss
    keeps 3 digits, and 100 times a count of right answers (6,100) rounds to another (6,112)."""
    return values.to(torch.promote_types(values.dtype, torch.float32))


def per_config_loss_and_correct(outputs: Tensor, targets: Tensor, class_dim: int = -1) -> tuple[Tensor, Tensor]:
    """For outputs [K, B, ..., C] (or [K, B, C, ...] with `class_dim=1`) against targets [B, ...]: summed loss [K]
    and correct-prediction count [K] over the batch. Targets at `IGNORE_INDEX` count in neither, as the training
    loss (torch's cross-entropy) leaves them out. The losses are summed in float32 at least (`summable`)."""
    k = outputs.shape[0]
    if class_dim == 1:
        scores, flat_targets = outputs.flatten(0, 1), targets.expand(k, *targets.shape).flatten(0, 1)  # (K * B, ...)
        losses = nn.functional.cross_entropy(scores, flat_targets, reduction="none")  # (K * B, ...); 0 where ignored
        correct = scores.argmax(dim=1) == flat_targets  # never at IGNORE_INDEX, which no class index equals
        return summable(losses).reshape(k, -1).sum(dim=1), correct.reshape(k, -1).sum(dim=1)
    logits = outputs.reshape(k, -1, outputs.shape[-1])  # (K, B*T, C)
    flat_targets = targets.reshape(1, -1).expand(k, -1)  # (K, B*T)
    losses = nn.functional.cross_entropy(logits.transpose(1, 2), flat_targets, reduction="none")  # (K, B*T)
    correct = (logits.argmax(dim=-1) == flat_targets).sum(dim=1)  # (K,)
    return summable(losses).sum(dim=1), correct


@torch.inference_mode()
def validate(model: MorphogeneticModel, dataset: BatchSource, configurations: AlphaConfigurations,
             batch_size: int = 512, objective: Objective | None = None,
             reduce: Callable[[Tensor], Tensor] | None = None,
             check_first_targets: Callable[[Tensor], None] | None = None) -> CounterfactualResult:
    """Score (accuracy points by default) and mean loss of every configuration, in one pass over `dataset`.

    `check_first_targets` reads the first batch's targets before its loss (a run's first validation only: it may
    wait for the device).

    `reduce` sums the [3, K] sums of loss, score and items over processes that each validate their share of the
    data (`Grower(distributed=True)`), so that every process reads the same figures. One host sync at the end.
    """
    objective = objective or Objective(task_loss, None, custom=False)
    was_training = model.training
    model.eval()
    k = configurations.size
    loss_sum = torch.zeros(k, device=dataset.device, dtype=torch.float64)
    score_sum = torch.zeros(k, device=dataset.device, dtype=torch.float64)
    count: int | Tensor = 0
    alphas = [list(row) for row in configurations.alphas]
    shapes: Counter[InputSpec] = Counter()
    for index, (inputs, targets) in enumerate(dataset.iterate_batches(batch_size, shuffle=False)):
        if index == 0 and check_first_targets is not None:
            check_first_targets(targets)
        note_batch(shapes, inputs)
        outputs = model.counterfactual_forward(inputs, alphas)  # (K, B, ...)
        batch_loss, batch_score, items = objective.loss_and_score(outputs, targets)
        loss_sum += batch_loss.to(torch.float64)
        score_sum += batch_score.to(torch.float64)
        count += items
    model.train(was_training)
    sums = torch.stack([loss_sum, score_sum, torch.zeros_like(loss_sum) + count])
    loss_values, score_values, counts = (sums if reduce is None else reduce(sums)).tolist()  # the one sync
    total = counts[0]
    if total == 0:
        raise DataError(f"the validation data yielded no batch {NO_BATCH_CAUSES}")
    return CounterfactualResult(configurations, tuple(v / total for v in score_values),
                                tuple(v / total for v in loss_values), tuple(shapes.items()))
