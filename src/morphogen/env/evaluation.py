"""Task losses and the validation pass that evaluates the model and its counterfactuals together.

Metrics accumulate in device tensors across batches; `validate` synchronizes once, at its end.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from morphogen.core.model import MorphogeneticModel
from morphogen.data import DeviceDataset
from morphogen.env.counterfactual import CounterfactualPlan, CounterfactualResult

OBJECTIVES = ("classification", "language_model")


def task_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy for classification ([B, C] vs [B]) or language modelling ([B, T, V] vs [B, T])."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def per_config_loss_and_correct(outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """For outputs [K, B, ..., C]: summed loss [K] and correct-prediction count [K] over the batch."""
    k = outputs.shape[0]
    logits = outputs.reshape(k, -1, outputs.shape[-1])  # (K, B*T, C)
    flat_targets = targets.reshape(1, -1).expand(k, -1)  # (K, B*T)
    losses = nn.functional.cross_entropy(logits.transpose(1, 2), flat_targets, reduction="none")  # (K, B*T)
    correct = (logits.argmax(dim=-1) == flat_targets).sum(dim=1)  # (K,)
    return losses.sum(dim=1), correct


@torch.inference_mode()
def validate(model: MorphogeneticModel, dataset: DeviceDataset, plan: CounterfactualPlan,
             batch_size: int = 512) -> CounterfactualResult:
    """Accuracy (points) and mean loss of every configuration in `plan`, in one pass over `dataset`.

    One host sync at the end (the `.tolist()` of the stacked [2, K] metrics).
    """
    was_training = model.training
    model.eval()
    k = plan.size
    loss_sum = torch.zeros(k, device=dataset.device, dtype=torch.float64)
    correct = torch.zeros(k, device=dataset.device, dtype=torch.int64)
    count = 0
    alphas = [list(row) for row in plan.alphas]
    for inputs, targets in dataset.iterate_batches(batch_size, shuffle=False):
        outputs = model.counterfactual_forward(inputs, alphas)  # (K, B, ...)
        batch_loss, batch_correct = per_config_loss_and_correct(outputs, targets)
        loss_sum += batch_loss.to(torch.float64)
        correct += batch_correct
        count += targets.numel()
    model.train(was_training)
    loss_values, correct_values = torch.stack([loss_sum, correct.to(torch.float64)]).tolist()  # the one sync
    accuracies = tuple(100.0 * c / count for c in correct_values)
    losses = tuple(v / count for v in loss_values)
    return CounterfactualResult(plan, accuracies, losses)
