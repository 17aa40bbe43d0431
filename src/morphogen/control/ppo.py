"""PPO (Schulman et al. 2017) for the factored LSTM policy: loss functions and the update.

Per-head clipping: each head h that matters for a sample has its own ratio
``r_h = exp(log pi_h - log pi_old_h)``, clipped to ``[1 - clip, 1 + clip]``, and the surrogate is the
sum over heads of ``min(r_h A, clip(r_h) A)``. Its gradient at ``r = 1`` is that of the joint-ratio
surrogate (``sum_h grad log pi_h = grad log pi``), but the trust region holds per factor: a head whose
probability already moved far stops being pushed while the others still learn. Heads that do not
matter for the sample's op carry no ratio at all. The approximate KL is the joint one, estimated with
``(r - 1) - log r`` on ``r = prod_h r_h`` (always >= 0; Schulman's "k3" estimator).

Host syncs in ``ppo_update``: one per epoch for the KL early-stop check (none when ``target_kl`` is
None), one per minibatch inside ``evaluate_sequence`` (where episodes start), and one at the end to
convert all diagnostics to Python numbers. Nothing else leaves the device.

Advantages come with the batch (``rollout.py`` computes them with GAE when a rollout finishes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from morphogen.control.policy import RecurrentActorCritic
from morphogen.control.rollout import RolloutBatch
from morphogen.limits import MAX_PPO_EPOCHS, check_count

__all__ = [
    "LossTerms",
    "MinibatchPart",
    "OneProcess",
    "PPOConfig",
    "PPOStatistics",
    "SurrogateResult",
    "UpdateProcesses",
    "annealed_coefficient",
    "build_optimizer",
    "check_minibatches",
    "clipped_surrogate_loss",
    "entropy_bonus",
    "explained_variance",
    "ppo_losses",
    "ppo_update",
    "value_loss",
]


# ----------------------------------------------------------------------------------------------
# Pure maths


class SurrogateResult(NamedTuple):
    """The clipped surrogate loss of a minibatch and two diagnostics, all scalar tensors."""

    loss: Tensor
    clip_fraction: Tensor
    """Fraction of (sample, relevant head) pairs whose ratio left ``[1 - clip, 1 + clip]``."""
    approx_kl: Tensor
    """Mean of ``(r - 1) - log r`` over samples, r the joint ratio; never below 0."""
    clipped: Tensor
    """Number of (sample, relevant head) pairs whose ratio left ``[1 - clip, 1 + clip]``."""


def clipped_surrogate_loss(
    log_prob_per_head: Tensor,
    old_log_prob_per_head: Tensor,
    advantages: Tensor,
    relevant_heads: Tensor,
    clip_range: float,
) -> SurrogateResult:
    """Per-head clipped PPO surrogate, to be minimized (see the module docstring).

    ``log_prob_per_head``, ``old_log_prob_per_head``, ``relevant_heads`` (bool) are ``[N, H]`` and
    ``advantages`` is ``[N]``. The loss is ``-mean_n sum_{h relevant} min(r_h A_n, clip(r_h) A_n)``.
    """
    weight = relevant_heads.to(log_prob_per_head.dtype)
    log_ratio = (log_prob_per_head - old_log_prob_per_head) * weight  # [N, H]; 0 where irrelevant
    ratio = log_ratio.exp()
    advantage = advantages.unsqueeze(-1)  # [N, 1]
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1.0 - clip_range, 1.0 + clip_range) * advantage)
    loss = -(surrogate * weight).sum(dim=-1).mean()
    with torch.no_grad():
        clipped = (((ratio - 1.0).abs() > clip_range) & relevant_heads).sum()
        clip_fraction = clipped / relevant_heads.sum().clamp(min=1)
        joint_log_ratio = log_ratio.sum(dim=-1)  # [N]
        # expm1: `exp(x) - 1` rounds to a value below x for a log ratio near 0 (-1e-7 gave -2e-8 in float32, printed
        # as an approximate KL of -0.0000); each term is >= 0 in exact arithmetic, so what rounding leaves below 0 is
        # clamped.
        approx_kl = (torch.expm1(joint_log_ratio) - joint_log_ratio).mean().clamp(min=0.0)
    dtype = log_prob_per_head.dtype
    return SurrogateResult(loss, clip_fraction.to(dtype), approx_kl, clipped.to(dtype))


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip_range: float | None = None) -> Tensor:
    """Mean squared error of ``values`` against ``returns`` (all ``[N]``).

    With ``clip_range``, the PPO2 clipped form: the larger of the errors of ``values`` and of
    ``old_values + clamp(values - old_values, -clip, clip)``.
    """
    squared_error = (values - returns).square()
    if clip_range is None:
        return squared_error.mean()
    clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
    return torch.maximum(squared_error, (clipped_values - returns).square()).mean()


def entropy_bonus(entropy_per_head: Tensor, head_weights: Tensor | None = None) -> Tensor:
    """``mean_n sum_h w_h H_h`` of ``entropy_per_head [N, H]`` (0 where a head did not matter).

    With unit weights this is an estimate of the joint policy entropy, since
    ``H(op, rest) = H(op) + E_op[H(rest | op)]`` and the heads are independent given the op.
    """
    if head_weights is None:
        return entropy_per_head.sum(dim=-1).mean()
    return (entropy_per_head * head_weights).sum(dim=-1).mean()


def annealed_coefficient(start: float, end: float | None, progress: float) -> float:
    """Linear from ``start`` (progress 0) to ``end`` (progress 1); constant ``start`` if ``end`` is None."""
    if end is None:
        return start
    fraction = min(max(progress, 0.0), 1.0)
    return start + (end - start) * fraction


def explained_variance(values: Tensor, returns: Tensor) -> Tensor:
    """``1 - Var(returns - values) / Var(returns)``: 1 is a perfect critic, <= 0 no better than a constant.

    NaN when the returns have zero variance (nothing to explain).
    """
    returns_variance = returns.var(correction=0)
    ratio = (returns - values).var(correction=0) / returns_variance
    return torch.where(returns_variance > 0, 1.0 - ratio, torch.full_like(ratio, math.nan))


# ----------------------------------------------------------------------------------------------
# Configuration and statistics


@dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of the PPO update (docs/architecture.md#controller)."""

    learning_rate: float = 3e-4
    """Adam step size (read by ``build_optimizer``)."""
    adam_epsilon: float = 1e-5
    """Adam epsilon; larger than torch's 1e-8, as common in PPO, to damp steps on tiny second moments."""
    gamma: float = 0.995
    """Discount factor, in [0, 1]."""
    gae_lambda: float = 0.98
    """GAE lambda, in [0, 1]: 0 is one-step TD, 1 is Monte Carlo."""
    clip_range: float = 0.2
    """Each head's probability ratio is clipped to [1 - clip_range, 1 + clip_range]; > 0."""
    value_coef: float = 0.5
    """Weight of the value loss in the total loss; >= 0."""
    value_clip_range: float | None = None
    """If set (> 0), the value prediction may move at most this far from its rollout value per update."""
    entropy_coef: float = 0.05
    """Weight of the entropy bonus at the start of training; >= 0."""
    entropy_head_weights: tuple[float, ...] | None = None
    """One non-negative weight per head for the entropy bonus; None weighs every head 1."""
    entropy_anneal_to: float | None = None
    """If set, the entropy coefficient goes linearly from entropy_coef to this as progress goes 0 -> 1."""
    max_grad_norm: float = 5.0
    """Global L2 norm the gradients are clipped to before each optimizer step; > 0."""
    target_kl: float | None = 0.015
    """Stop the update's epochs once an epoch's mean approximate KL exceeds this; None never stops early."""
    epochs: int = 4
    """Passes over the rollout per update; >= 1."""
    minibatches: int = 1
    """Minibatches per epoch, each a group of whole env sequences; between 1 and the number of envs."""
    normalize_advantages: bool = True
    """Standardize the advantages of the whole rollout (mean 0, std 1) before the update."""

    def __post_init__(self) -> None:
        if self.entropy_head_weights is not None:
            # Accept lists from config files; keep the frozen dataclass hashable.
            object.__setattr__(self, "entropy_head_weights", tuple(float(w) for w in self.entropy_head_weights))
        _check_number("learning_rate", self.learning_rate, "> 0", self.learning_rate > 0)
        _check_number("adam_epsilon", self.adam_epsilon, "> 0", self.adam_epsilon > 0)
        _check_number("gamma", self.gamma, "in [0, 1]", 0 <= self.gamma <= 1)
        _check_number("gae_lambda", self.gae_lambda, "in [0, 1]", 0 <= self.gae_lambda <= 1)
        _check_number("clip_range", self.clip_range, "> 0", self.clip_range > 0)
        _check_number("value_coef", self.value_coef, ">= 0", self.value_coef >= 0)
        if self.value_clip_range is not None:
            _check_number("value_clip_range", self.value_clip_range, "> 0 or None", self.value_clip_range > 0)
        _check_number("entropy_coef", self.entropy_coef, ">= 0", self.entropy_coef >= 0)
        if self.entropy_head_weights is not None:
            weights = self.entropy_head_weights
            ok = len(weights) > 0 and all(math.isfinite(w) and w >= 0 for w in weights)
            _check_number("entropy_head_weights", weights, "a non-empty tuple of finite weights >= 0 or None", ok)
        if self.entropy_anneal_to is not None:
            _check_number("entropy_anneal_to", self.entropy_anneal_to, ">= 0 or None", self.entropy_anneal_to >= 0)
        _check_number("max_grad_norm", self.max_grad_norm, "> 0", self.max_grad_norm > 0)
        if self.target_kl is not None:
            _check_number("target_kl", self.target_kl, "> 0 or None", self.target_kl > 0)
        _check_integer("epochs", self.epochs)
        check_count("epochs", self.epochs, MAX_PPO_EPOCHS)
        _check_integer("minibatches", self.minibatches)

    def entropy_coef_at(self, progress: float) -> float:
        """The entropy coefficient at training ``progress`` in [0, 1]."""
        return annealed_coefficient(self.entropy_coef, self.entropy_anneal_to, progress)


def _check_number(name: str, value: object, accepted: str, ok: bool) -> None:
    # `not ok` is also True for NaN comparisons, so NaN is rejected too; infinity is no usable setting either
    # (an infinite learning rate turns every policy weight into NaN).
    infinite = isinstance(value, float) and math.isinf(value)
    if isinstance(value, bool) or not ok or infinite:
        raise ValueError(f"PPOConfig.{name} must be {accepted}, got {value!r}")


def _check_integer(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"PPOConfig.{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class PPOStatistics:
    """What one ``ppo_update`` did. The three loss terms, each averaged over the minibatches
    processed, sum to the loss that was minimized; every other field is a detached diagnostic."""

    policy_loss: float
    """Clipped surrogate loss."""
    value_loss: float
    """value_coef times the value loss."""
    entropy_loss: float
    """Minus the (annealed) entropy coefficient times the weighted entropy."""
    approx_kl: float
    """Mean approximate KL (old -> new) measured over the minibatches of the last epoch run."""
    clip_fraction: float
    """Mean fraction of (sample, relevant head) ratios that were clipped."""
    explained_variance: float
    """Of the returns by the rollout's values (before the update); NaN if the returns are constant."""
    entropy_per_head: tuple[float, ...]
    """Mean entropy of each head over the samples where it mattered (0 if it never did)."""
    grad_norm: float
    """Mean global gradient L2 norm before clipping."""
    entropy_coef: float
    """The entropy coefficient used (after annealing)."""
    epochs_completed: int
    """Epochs run, <= config.epochs."""
    early_stopped: bool
    """True if the KL early stop ended the update before config.epochs."""
    ratio_max: float = math.nan
    """Largest joint probability ratio new/old seen in any minibatch."""
    ratio_min: float = math.nan
    """Smallest joint probability ratio new/old seen in any minibatch."""
    value_std: float = math.nan
    """Standard deviation of the rollout's value predictions."""
    return_std: float = math.nan
    """Standard deviation of the rollout's returns (the value targets)."""


class LossTerms(NamedTuple):
    """Losses and diagnostics of one minibatch, all tensors (``total`` carries gradients)."""

    total: Tensor
    policy_loss: Tensor
    value_loss: Tensor
    """Already multiplied by value_coef."""
    entropy_loss: Tensor
    """Already multiplied by minus the entropy coefficient."""
    approx_kl: Tensor
    ratio_extremes: Tensor
    """[2]: largest and smallest joint probability ratio new/old in the minibatch (for anomaly checks)."""
    counts: Tensor
    """[2 + 2H]: clipped and relevant (sample, head) pairs, then per head the entropy summed over the samples
    where it mattered and their count: the clip fraction and the head entropies are ratios of these, summed
    over the processes of a data-parallel update before they are divided."""


# ----------------------------------------------------------------------------------------------
# The update


def build_optimizer(policy: torch.nn.Module, config: PPOConfig) -> torch.optim.Adam:
    """Adam over the policy's parameters with ``config.learning_rate`` and ``config.adam_epsilon``."""
    return torch.optim.Adam(policy.parameters(), lr=config.learning_rate, eps=config.adam_epsilon)


def ppo_losses(
    policy: RecurrentActorCritic,
    batch: RolloutBatch,
    config: PPOConfig,
    entropy_coef: float,
    head_weights: Tensor | None = None,
) -> LossTerms:
    """PPO losses of ``batch`` (whole sequences, BPTT from their initial state) under the current policy.

    ``batch.advantages`` are used as given: normalize them beforehand if wanted.
    """
    evaluation = policy.evaluate_sequence(
        batch.observations,
        batch.initial_state,
        batch.episode_starts,
        batch.actions,
        batch.action_masks,
    )
    relevant = policy.relevant_heads(batch.actions[..., 0]).flatten(0, 1)  # [T*B, H]
    surrogate = clipped_surrogate_loss(
        evaluation.log_prob_per_head.flatten(0, 1),
        batch.log_prob_per_head.flatten(0, 1),
        batch.advantages.flatten(),
        relevant,
        config.clip_range,
    )
    critic = config.value_coef * value_loss(
        evaluation.value.flatten(), batch.values.flatten(), batch.returns.flatten(), config.value_clip_range
    )
    entropy_per_sample = evaluation.entropy_per_head.flatten(0, 1)  # [T*B, H]
    entropy_term = -entropy_coef * entropy_bonus(entropy_per_sample, head_weights)
    with torch.no_grad():
        weight = relevant.to(entropy_per_sample.dtype)
        counts = torch.cat([torch.stack([surrogate.clipped, weight.sum()]),
                            (entropy_per_sample * weight).sum(0), weight.sum(0)])  # [2 + 2H]
        ratio = torch.exp(evaluation.log_prob.flatten() - batch.log_probs.flatten())  # [T*B], joint
        ratio_extremes = torch.stack([ratio.max(), ratio.min()])
    return LossTerms(
        total=surrogate.loss + critic + entropy_term,
        policy_loss=surrogate.loss,
        value_loss=critic,
        entropy_loss=entropy_term,
        approx_kl=surrogate.approx_kl,
        ratio_extremes=ratio_extremes,
        counts=counts,
    )


class MinibatchPart(NamedTuple):
    """The envs of one minibatch that this process holds, and the weight of its part's mean loss."""

    envs: Tensor
    """Long indices into this process's batch (possibly empty)."""
    weight: float
    """Scales this part's mean loss so that the mean over the processes is the minibatch's mean loss (1 alone)."""


class UpdateProcesses(Protocol):
    """The processes taking part in one PPO update: how they split its minibatches and average tensors.

    `OneProcess` is the whole update in this process; `control/distributed.py` has the data-parallel one.
    """

    def minibatches(self, n_envs: int, count: int, generator: torch.Generator | None) -> list[MinibatchPart]:
        """This process's part of each of `count` minibatches of one epoch (its batch holds `n_envs` envs)."""
        ...

    def average(self, tensor: Tensor) -> None:
        """Replace `tensor` in place by its mean over the processes."""
        ...

    def average_gradients(self, policy: torch.nn.Module, counts: Tensor) -> Tensor:
        """Average the policy's gradients over the processes; return `counts` summed the same way (averaged)."""
        ...


def check_minibatches(count: int, n_envs: int) -> None:
    """Raise ValueError unless `count` minibatches of whole env sequences can be made from `n_envs` envs."""
    if count > n_envs:
        raise ValueError(f"PPOConfig.minibatches={count} exceeds the {n_envs} env sequences in the update; "
                         "minibatches are groups of whole sequences, so use at most one per env")


class OneProcess:
    """The whole update in this process: each epoch's env sequences shuffled into `count` groups, weight 1."""

    def minibatches(self, n_envs: int, count: int, generator: torch.Generator | None) -> list[MinibatchPart]:
        check_minibatches(count, n_envs)
        order = torch.randperm(n_envs, generator=generator)
        return [MinibatchPart(group, 1.0) for group in torch.tensor_split(order, count)]

    def average(self, tensor: Tensor) -> None:
        """Nothing to average with."""

    def average_gradients(self, policy: torch.nn.Module, counts: Tensor) -> Tensor:
        return counts


#: Diagnostics summed over the minibatches of an update, each weighted by this process's part.
_SUMMED = ("policy_loss", "value_loss", "entropy_loss", "clip_fraction", "entropy_per_head")


def ppo_update(
    policy: RecurrentActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    config: PPOConfig,
    progress: float,
    *,
    generator: torch.Generator | None = None,
    processes: UpdateProcesses | None = None,
) -> PPOStatistics:
    """Run up to ``config.epochs`` epochs of PPO on ``batch``; ``progress`` in [0, 1] anneals the entropy.

    Each epoch shuffles the env sequences (with ``generator``, a CPU generator) into
    ``config.minibatches`` groups; each group takes one clipped gradient step on its mean loss. An epoch
    whose mean approximate KL exceeds ``config.target_kl`` is the last. Syncs: see the module docstring.

    ``processes`` (default: `OneProcess`) says how the processes of a data-parallel update split the
    minibatches and average the advantage moments, the gradients and the KL, so that every process takes
    the same steps (`control/distributed.py`). The returned loss terms, clip fraction and head entropies
    are then this process's weighted share of the update's: their mean over the processes is the update's.
    """
    processes = processes or OneProcess()
    head_weights = _entropy_head_weights(policy, config, batch.values)
    entropy_coef = config.entropy_coef_at(progress)
    if config.normalize_advantages:
        batch = batch._replace(advantages=_standardized(batch.advantages, processes.average))

    device = batch.values.device
    totals = _Totals(policy.n_heads, device)
    grad_norm_sum = torch.zeros((), device=device)
    epoch_kl = torch.zeros((), device=device)
    epochs_completed, early_stopped = 0, False
    for _ in range(config.epochs):
        epoch_kl = torch.zeros((), device=device)
        for part in processes.minibatches(batch.n_envs, config.minibatches, generator):
            optimizer.zero_grad(set_to_none=True)
            terms = None
            if part.envs.numel() > 0:
                terms = ppo_losses(policy, batch.select_envs(part.envs.to(device)), config, entropy_coef, head_weights)
                torch.autograd.backward(terms.total * part.weight)
            # The minibatch's clip fraction and head entropies, from every process's counts.
            fractions = _fractions(processes.average_gradients(policy, totals.counts_of(terms)))
            grad_norm_sum += torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm).to(device)
            optimizer.step()
            if terms is None:  # none of this process's envs in the group
                continue
            totals.add(terms, *fractions, part.weight)
            epoch_kl = epoch_kl + terms.approx_kl * part.weight
        epochs_completed += 1
        epoch_kl = epoch_kl / config.minibatches
        processes.average(epoch_kl)  # every process must take the same early-stop decision
        # Host sync, once per epoch: whether to run another epoch is decided on the host.
        if config.target_kl is not None and epoch_kl.item() > config.target_kl:
            early_stopped = epochs_completed < config.epochs
            break
    minibatches_run = epochs_completed * config.minibatches
    numbers = _to_python({  # host sync: the one transfer of all diagnostics at the end of the update
        **{name: total / minibatches_run for name, total in totals.sums.items()},
        "grad_norm": grad_norm_sum / minibatches_run,  # of the averaged gradient: the same on every process
        "approx_kl": epoch_kl,
        "explained_variance": explained_variance(batch.values.flatten(), batch.returns.flatten()),
        "ratio_max": totals.ratio_max, "ratio_min": totals.ratio_min,
        "value_std": batch.values.std(correction=0), "return_std": batch.returns.std(correction=0),
    })
    return PPOStatistics(
        **{name: values[0] for name, values in numbers.items() if name != "entropy_per_head"},
        entropy_per_head=tuple(numbers["entropy_per_head"]),
        entropy_coef=entropy_coef,
        epochs_completed=epochs_completed,
        early_stopped=early_stopped,
    )


def _entropy_head_weights(policy: RecurrentActorCritic, config: PPOConfig, like: Tensor) -> Tensor | None:
    """`config.entropy_head_weights` as a tensor beside `like`, one per head of `policy` (None: every head 1)."""
    if config.entropy_head_weights is None:
        return None
    if len(config.entropy_head_weights) != policy.n_heads:
        raise ValueError(f"PPOConfig.entropy_head_weights has {len(config.entropy_head_weights)} weights but the "
                         f"policy has {policy.n_heads} heads; give one weight per head")
    return like.new_tensor(config.entropy_head_weights)


class _Totals:
    """The update's weighted sums of its minibatches' loss terms, and the extremes of their probability ratios,
    kept on the device until the one transfer at the end."""

    def __init__(self, n_heads: int, device: torch.device) -> None:
        self.n_heads, self.device = n_heads, device
        self.sums = {name: torch.zeros(n_heads if name == "entropy_per_head" else (), device=device)
                     for name in _SUMMED}
        self.ratio_max = torch.full((), -math.inf, device=device)
        self.ratio_min = torch.full((), math.inf, device=device)

    def counts_of(self, terms: LossTerms | None) -> Tensor:
        """The minibatch's clip and entropy counts; zeros where this process had none of its envs."""
        return terms.counts if terms is not None else torch.zeros(2 + 2 * self.n_heads, device=self.device)

    def add(self, terms: LossTerms, clip_fraction: Tensor, entropy_per_head: Tensor, weight: float) -> None:
        minibatch = {"policy_loss": terms.policy_loss, "value_loss": terms.value_loss,
                     "entropy_loss": terms.entropy_loss, "clip_fraction": clip_fraction,
                     "entropy_per_head": entropy_per_head}
        for name, value in minibatch.items():
            self.sums[name] += value.detach() * weight
        self.ratio_max = torch.maximum(self.ratio_max, terms.ratio_extremes[0])
        self.ratio_min = torch.minimum(self.ratio_min, terms.ratio_extremes[1])


def _standardized(advantages: Tensor, average: Callable[[Tensor], None]) -> Tensor:
    """Advantages standardized by the mean and (ddof 0) std over all processes' advantages (equal counts)."""
    mean = advantages.mean().reshape(1)
    average(mean)
    variance = (advantages - mean).square().mean().reshape(1)  # second pass: as exact as `std`
    average(variance)
    return (advantages - mean) / (variance.sqrt() + 1e-8)


def _fractions(counts: Tensor) -> tuple[Tensor, Tensor]:
    """Clip fraction and per-head entropy from `LossTerms.counts` (0 where nothing counted)."""
    heads = (counts.numel() - 2) // 2
    numerators = torch.cat([counts[:1], counts[2:2 + heads]])
    denominators = torch.cat([counts[1:2], counts[2 + heads:]])
    ratios = torch.where(denominators > 0, numerators / denominators.clamp(min=1e-30), torch.zeros_like(numerators))
    return ratios[0], ratios[1:]


def _to_python(tensors: dict[str, Tensor]) -> dict[str, list[float]]:
    """Each tensor as a list of Python floats, through one host sync for all of them."""
    flat = torch.cat([tensor.detach().reshape(-1).float() for tensor in tensors.values()]).tolist()
    numbers, offset = {}, 0
    for name, tensor in tensors.items():
        numbers[name] = flat[offset:offset + tensor.numel()]
        offset += tensor.numel()
    return numbers
