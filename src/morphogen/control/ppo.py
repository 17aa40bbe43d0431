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

GAE (``generalized_advantage_estimation``) lives next to the buffer that calls it, in ``rollout.py``;
``train_gym``, this agent on any Gymnasium environment, in ``gym_training.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from morphogen.control.policy import FactoredLSTMPolicy
from morphogen.control.rollout import RolloutBatch
from morphogen.limits import MAX_PPO_EPOCHS, check_count

__all__ = [
    "EnvShare",
    "LossTerms",
    "PPOConfig",
    "PPOStatistics",
    "SurrogateResult",
    "annealed_coefficient",
    "build_optimizer",
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
    """Mean of ``(r - 1) - log r`` over samples, r the joint ratio."""


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
        clipped = ((ratio - 1.0).abs() > clip_range) & relevant_heads
        clip_fraction = clipped.sum() / relevant_heads.sum().clamp(min=1)
        joint_log_ratio = log_ratio.sum(dim=-1)  # [N]
        approx_kl = (joint_log_ratio.exp() - 1.0 - joint_log_ratio).mean()
    return SurrogateResult(loss, clip_fraction.to(log_prob_per_head.dtype), approx_kl)


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

    @property
    def total_loss(self) -> float:
        """The minimized loss: policy_loss + value_loss + entropy_loss."""
        return self.policy_loss + self.value_loss + self.entropy_loss


class LossTerms(NamedTuple):
    """Losses and diagnostics of one minibatch, all tensors (``total`` carries gradients)."""

    total: Tensor
    policy_loss: Tensor
    value_loss: Tensor
    """Already multiplied by value_coef."""
    entropy_loss: Tensor
    """Already multiplied by minus the entropy coefficient."""
    approx_kl: Tensor
    clip_fraction: Tensor
    entropy_per_head: Tensor
    """[H], mean over the samples where each head mattered."""
    ratio_extremes: Tensor
    """[2]: largest and smallest joint probability ratio new/old in the minibatch (for anomaly checks)."""
    fraction_counts: Tensor
    """[2 + 2H]: clipped and relevant (sample, head) pairs, then per head the entropy summed over the samples
    where it mattered and their count: what `clip_fraction` and `entropy_per_head` are ratios of."""


# ----------------------------------------------------------------------------------------------
# The update


def build_optimizer(policy: torch.nn.Module, config: PPOConfig) -> torch.optim.Adam:
    """Adam over the policy's parameters with ``config.learning_rate`` and ``config.adam_epsilon``."""
    return torch.optim.Adam(policy.parameters(), lr=config.learning_rate, eps=config.adam_epsilon)


def ppo_losses(
    policy: FactoredLSTMPolicy,
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
        batch.blueprint_ids,
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
        head_entropy = (entropy_per_sample * weight).sum(0) / weight.sum(0).clamp(min=1.0)  # [H]
        counts = torch.cat([torch.stack([surrogate.clip_fraction * weight.sum().clamp(min=1.0), weight.sum()]),
                            (entropy_per_sample * weight).sum(0), weight.sum(0)])  # [2 + 2H]
        ratio = torch.exp(evaluation.log_prob.flatten() - batch.log_probs.flatten())  # [T*B], joint
        ratio_extremes = torch.stack([ratio.max(), ratio.min()])
    return LossTerms(
        total=surrogate.loss + critic + entropy_term,
        policy_loss=surrogate.loss,
        value_loss=critic,
        entropy_loss=entropy_term,
        approx_kl=surrogate.approx_kl,
        clip_fraction=surrogate.clip_fraction,
        entropy_per_head=head_entropy,
        ratio_extremes=ratio_extremes,
        fraction_counts=counts,
    )


@dataclass(frozen=True)
class EnvShare:
    """The env sequences one process of a data-parallel update holds: global envs ``first .. first + n - 1``
    of ``total`` (every process holds as many as the others)."""

    first: int
    total: int


def ppo_update(
    policy: FactoredLSTMPolicy,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    config: PPOConfig,
    progress: float,
    *,
    generator: torch.Generator | None = None,
    average: Callable[[Tensor], None] | None = None,
    share: EnvShare | None = None,
) -> PPOStatistics:
    """Run up to ``config.epochs`` epochs of PPO on ``batch``; ``progress`` in [0, 1] anneals the entropy.

    Each epoch shuffles the env sequences (with ``generator``, a CPU generator) into
    ``config.minibatches`` groups. Syncs: see the module docstring.

    ``average``, when given, replaces a tensor in place by its mean over every process taking part in
    one update (data-parallel PPO, ``control/distributed.py``); ``share`` says which of the update's
    envs ``batch`` holds. It is applied to the advantage moments, to every minibatch's gradients
    before clipping, and to each epoch's KL, so that all processes take the same optimizer steps and
    the same early-stop decision. None (one process) leaves the update exactly as without it.
    The returned loss terms, clip fraction and head entropies are then this process's share of
    the update's (each minibatch's part weighted by its size over the group's size times the number
    of processes): their mean over the processes is the update's, as `DistributedTrainer` reports it.

    Minibatches are groups of the *global* envs: every process draws the same permutation of all
    ``share.total`` envs and takes, in each group, the envs it holds (possibly none). Its terms are
    means over its part, so its gradient and KL are weighted by its part's size times the number of
    processes over the group's size before the average: the averaged gradient is that of the group's
    mean loss, and the update is the one a single process holding every env takes, up to the
    summation order of floats (tested with ``minibatches > 1``). A process with no env in a group
    still takes part in its all-reduce, with a zero gradient.
    """
    share = share or EnvShare(0, batch.n_envs)
    if share.first < 0 or share.first + batch.n_envs > share.total or share.total % batch.n_envs:
        raise ValueError(f"{share} does not hold the batch's {batch.n_envs} envs as an equal share of the total")
    if config.minibatches > share.total:
        raise ValueError(
            f"PPOConfig.minibatches={config.minibatches} exceeds the {share.total} env sequences in the "
            "update; minibatches are groups of whole sequences, so use at most one per env"
        )
    processes = share.total // batch.n_envs
    head_weights = None
    if config.entropy_head_weights is not None:
        if len(config.entropy_head_weights) != policy.n_heads:
            raise ValueError(
                f"PPOConfig.entropy_head_weights has {len(config.entropy_head_weights)} weights but the "
                f"policy has {policy.n_heads} heads; give one weight per head"
            )
        head_weights = batch.values.new_tensor(config.entropy_head_weights)
    entropy_coef = config.entropy_coef_at(progress)
    if config.normalize_advantages:
        advantages = batch.advantages
        if average is None:
            standardized = (advantages - advantages.mean()) / (advantages.std(correction=0) + 1e-8)
        else:
            standardized = _standardize_across(advantages, average)
        batch = batch._replace(advantages=standardized)

    device = batch.values.device
    # Running sums on the device: policy, value, entropy losses, KL, clip fraction, grad norm.
    sums = torch.zeros(6, device=device)
    entropy_sums = torch.zeros(policy.n_heads, device=device)
    epochs_completed = 0
    early_stopped = False
    epoch_kl = torch.zeros((), device=device)
    ratio_max = torch.full((), -math.inf, device=device)
    ratio_min = torch.full((), math.inf, device=device)
    for _ in range(config.epochs):
        epoch_kl = torch.zeros((), device=device)
        order = torch.randperm(share.total, generator=generator)
        for group in torch.tensor_split(order, config.minibatches):
            mine = group[(group >= share.first) & (group < share.first + batch.n_envs)] - share.first
            weight = mine.numel() * processes / group.numel()  # 1 on one process: no rescaling at all
            terms, grad_norm = _minibatch_step(policy, optimizer, batch, mine.to(device), weight, config,
                                               entropy_coef, head_weights, average)
            sums[5] += grad_norm.to(device)  # of the averaged gradient: the same on every process
            if terms is None:  # none of this process's envs in the group
                continue
            minibatch_values = torch.stack(
                [terms.policy_loss, terms.value_loss, terms.entropy_loss, terms.approx_kl]).detach()
            sums[:4] += minibatch_values if weight == 1 else minibatch_values * weight
            # The clip fraction and head entropies are already the group's (`_minibatch_step`): weighted by the
            # process's share like the rest, their mean over the processes is the group's too.
            sums[4] += terms.clip_fraction if weight == 1 else terms.clip_fraction * weight
            entropy_sums += terms.entropy_per_head if weight == 1 else terms.entropy_per_head * weight
            ratio_max = torch.maximum(ratio_max, terms.ratio_extremes[0])
            ratio_min = torch.minimum(ratio_min, terms.ratio_extremes[1])
            epoch_kl = epoch_kl + (terms.approx_kl if weight == 1 else terms.approx_kl * weight)
        epochs_completed += 1
        epoch_kl = epoch_kl / config.minibatches
        if average is not None:
            average(epoch_kl)  # every process must take the same early-stop decision
        # Host sync, once per epoch: whether to run another epoch is decided on the host.
        if config.target_kl is not None and epoch_kl.item() > config.target_kl:
            early_stopped = epochs_completed < config.epochs
            break
    spreads = torch.stack([ratio_max, ratio_min, batch.values.std(correction=0), batch.returns.std(correction=0)])
    minibatches_run = epochs_completed * config.minibatches
    return _statistics(
        sums / minibatches_run,
        entropy_sums / minibatches_run,
        epoch_kl,
        explained_variance(batch.values.flatten(), batch.returns.flatten()),
        spreads,
        entropy_coef,
        epochs_completed,
        early_stopped,
    )


def _minibatch_step(
    policy: FactoredLSTMPolicy,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    mine: Tensor,
    weight: float,
    config: PPOConfig,
    entropy_coef: float,
    head_weights: Tensor | None,
    average: Callable[[Tensor], None] | None,
) -> tuple[LossTerms | None, Tensor]:
    """One optimizer step on a minibatch of which this process holds the envs ``mine`` (its losses are
    scaled by ``weight``, see ``ppo_update``); the losses (None for an empty part, which still takes
    part in the gradient average with zeros) and the norm of the averaged gradient."""
    optimizer.zero_grad(set_to_none=True)
    terms = None
    if mine.numel() > 0:
        terms = ppo_losses(policy, batch.select_envs(mine), config, entropy_coef, head_weights)
        torch.autograd.backward(terms.total if weight == 1 else terms.total * weight)
    if average is not None:
        counts = terms.fraction_counts if terms is not None else torch.zeros(2 + 2 * policy.n_heads)
        group_counts = _average_gradients(policy, average, counts)
        if terms is not None:  # the group's fractions, from every process's counts (their mean: the same ratios)
            clip_fraction, entropy_per_head = _fractions(group_counts)
            terms = terms._replace(clip_fraction=clip_fraction, entropy_per_head=entropy_per_head)
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
    optimizer.step()
    return terms, grad_norm


def _standardize_across(advantages: Tensor, average: Callable[[Tensor], None]) -> Tensor:
    """Advantages standardized by the mean and (ddof 0) std over all processes' advantages (equal counts)."""
    mean = advantages.mean().reshape(1)
    average(mean)
    variance = (advantages - mean).square().mean().reshape(1)  # second pass: as exact as `std` on one process
    average(variance)
    return (advantages - mean) / (variance.sqrt() + 1e-8)


def _average_gradients(policy: torch.nn.Module, average: Callable[[Tensor], None], extra: Tensor) -> Tensor:
    """Average every parameter's gradient, and `extra`, over the processes through one flat buffer (one
    collective); return the averaged `extra`.

    A parameter without a gradient here contributes zeros, and gets the averaged gradient: another
    process may have one for it, and all processes must step the same parameters.
    """
    parameters = [p for p in policy.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in parameters]
                     + [extra.to(parameters[0])])
    average(flat)
    offset = 0
    for parameter in parameters:
        size = parameter.numel()
        parameter.grad = flat[offset:offset + size].view_as(parameter).clone()
        offset += size
    return flat[offset:]


def _fractions(counts: Tensor) -> tuple[Tensor, Tensor]:
    """Clip fraction and per-head entropy from `LossTerms.fraction_counts` (0 where nothing counted)."""
    heads = (counts.numel() - 2) // 2
    numerators = torch.cat([counts[:1], counts[2:2 + heads]])
    denominators = torch.cat([counts[1:2], counts[2 + heads:]])
    ratios = torch.where(denominators > 0, numerators / denominators.clamp(min=1e-30), torch.zeros_like(numerators))
    return ratios[0], ratios[1:]


def _statistics(
    means: Tensor,
    entropy_means: Tensor,
    last_epoch_kl: Tensor,
    explained: Tensor,
    spreads: Tensor,
    entropy_coef: float,
    epochs_completed: int,
    early_stopped: bool,
) -> PPOStatistics:
    """Convert the update's device tensors to a PPOStatistics."""
    # Host sync: the one transfer of all diagnostics at the end of the update.
    numbers = torch.cat(
        [means, last_epoch_kl.reshape(1), explained.reshape(1).to(means), spreads.to(means), entropy_means]
    ).tolist()
    policy_loss, value_term, entropy_term, _, clip_fraction, grad_norm, approx_kl, variance = numbers[:8]
    ratio_max, ratio_min, value_std, return_std = numbers[8:12]
    return PPOStatistics(
        policy_loss=policy_loss,
        value_loss=value_term,
        entropy_loss=entropy_term,
        approx_kl=approx_kl,
        clip_fraction=clip_fraction,
        explained_variance=variance,
        entropy_per_head=tuple(numbers[12:]),
        ratio_max=ratio_max,
        ratio_min=ratio_min,
        value_std=value_std,
        return_std=return_std,
        grad_norm=grad_norm,
        entropy_coef=entropy_coef,
        epochs_completed=epochs_completed,
        early_stopped=early_stopped,
    )

