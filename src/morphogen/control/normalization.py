"""Running statistics for observations, value targets and rewards.

Rules that hold for every class here:

- State lives in buffers (``mean``, ``var``, ``count``; ``returns`` for rewards), so ``state_dict``,
  ``load_state_dict`` and ``.to(device)`` work as for any ``nn.Module``. Configuration (epsilon,
  clip, momentum, gamma) is given to ``__init__`` and is not part of the state.
- Statistics are kept in float64 by default: a float32 count stops growing exactly past 2**24
  samples and long streams lose digits in the merge. Pass ``dtype=torch.float32`` on devices
  without float64 (MPS). Outputs always have the dtype of the input.
- ``epsilon`` plays two parts. The statistics start from a prior of ``epsilon`` pseudo-samples with
  mean 0 and variance 1, so after a stream of n samples with mean m and variance v (ddof 0):
  ``count = epsilon + n``, ``mean = n*m / count`` and
  ``var = (epsilon + n*v + m**2 * epsilon*n / count) / count``. It is also added to the variance
  before the square root when normalizing, so a constant stream never divides by zero.
- Nothing synchronizes with the host: no ``.item()``, no Python ``if`` on a tensor value.
- ``normalize`` is branch-free maths (``normalize_with``) behind a device check that compares
  ``x.device`` with the buffers' device in Python. On matching devices that check is a constant
  for ``torch.compile``, so ``torch.compile(fullgraph=True)`` traces straight through it.
- Device rule: an input on another device moves the statistics there (with one ``UserWarning``
  per instance, since a compiled graph specialized on the old device would recompile or break),
  or, with ``strict_device=True``, raises ``ValueError`` and moves nothing.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor, nn

__all__ = [
    "RewardNormalizer",
    "RunningMeanStd",
    "ValueNormalizer",
    "denormalize_with",
    "merge_moments",
    "normalize_with",
    "scale_with",
]


def merge_moments(
    mean: Tensor, var: Tensor, batch_mean: Tensor, batch_var: Tensor, weight: Tensor | float
) -> tuple[Tensor, Tensor]:
    """Mean and variance of a mixture of the running distribution and a batch, the batch weighing ``weight``.

    With ``weight = n_batch / (n_running + n_batch)`` this is the parallel Welford merge of Chan et
    al. (1979) written with fractions instead of counts; with ``weight = momentum`` it is an
    exponential moving average that also accounts for the shift of the mean.
    """
    delta = batch_mean - mean
    merged_mean = mean + weight * delta
    merged_var = (1 - weight) * var + weight * batch_var + weight * (1 - weight) * delta.square()
    return merged_mean, merged_var


def scale_with(var: Tensor, epsilon: float, clip: float, x: Tensor) -> Tensor:
    """``clamp(x / sqrt(var + epsilon), -clip, clip)`` in the dtype of ``x``."""
    std = torch.sqrt(var + epsilon).to(x.dtype)
    return torch.clamp(x / std, -clip, clip)


def normalize_with(mean: Tensor, var: Tensor, epsilon: float, clip: float, x: Tensor) -> Tensor:
    """``clamp((x - mean) / sqrt(var + epsilon), -clip, clip)`` in the dtype of ``x``; branch-free."""
    return scale_with(var, epsilon, clip, x - mean.to(x.dtype))


def denormalize_with(mean: Tensor, var: Tensor, epsilon: float, x: Tensor) -> Tensor:
    """Inverse of ``normalize_with`` for values inside the clip range: ``x * sqrt(var + epsilon) + mean``."""
    std = torch.sqrt(var + epsilon).to(x.dtype)
    return x * std + mean.to(x.dtype)


def _validate_config(epsilon: float, clip: float, momentum: float | None) -> None:
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0 (prior pseudo-count and variance floor), got {epsilon}")
    if not clip > 0:
        raise ValueError(f"clip must be > 0 (use math.inf for no clipping), got {clip}")
    if momentum is not None and not 0 < momentum <= 1:
        raise ValueError(f"momentum must be in (0, 1] or None for an exact running average, got {momentum}")


def _stats_dtype(dtype: torch.dtype | None) -> torch.dtype:
    resolved = torch.float64 if dtype is None else dtype
    if not resolved.is_floating_point:
        raise TypeError(f"dtype must be a floating point dtype such as torch.float64, got {resolved}")
    return resolved


class _FollowsInputDevice(nn.Module):
    """Base of the normalizers: applies the device rule of the module docstring."""

    def __init__(self, strict_device: bool) -> None:
        super().__init__()
        self.strict_device = strict_device
        self._warned_device = False

    def _check_device(self, x: Tensor, reference: Tensor) -> None:
        """Move this module to ``x.device`` if it differs from ``reference.device`` (warn once), or raise."""
        if x.device == reference.device:
            return
        name = type(self).__name__
        if self.strict_device:
            raise ValueError(
                f"{name} holds its statistics on {reference.device} but got a tensor on {x.device}; "
                f"move it with .to({str(x.device)!r}) first, or pass strict_device=False to let it follow"
            )
        if not self._warned_device:
            warnings.warn(
                f"{name} moved its statistics from {reference.device} to {x.device} to follow its input; "
                "move the normalizer with .to(device) before compiling; "
                "pass strict_device=True to make this an error",
                UserWarning,
                stacklevel=3,
            )
            self._warned_device = True
        self.to(x.device)


class RunningMeanStd(_FollowsInputDevice):
    """Running mean and variance of samples of shape ``shape``, with clipped standardization.

    ``momentum=None`` gives the exact mean and (ddof 0) variance of everything seen, merged batch by
    batch. With a momentum, a batch weighs ``max(momentum, its share of all samples so far)``: early
    batches are averaged exactly (so the prior fades at once), and once a batch's share drops below
    ``momentum`` the statistics become an exponential moving average with that momentum.
    """

    mean: Tensor
    var: Tensor
    count: Tensor

    def __init__(
        self,
        shape: tuple[int, ...] = (),
        *,
        epsilon: float = 1e-4,
        clip: float = 10.0,
        momentum: float | None = None,
        strict_device: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(strict_device)
        _validate_config(epsilon, clip, momentum)
        self.shape = tuple(shape)
        if any(size < 0 for size in self.shape):
            raise ValueError(f"shape must hold non-negative sizes, got {self.shape}")
        self.epsilon = epsilon
        self.clip = clip
        self.momentum = momentum
        stats_dtype = _stats_dtype(dtype)
        self.register_buffer("mean", torch.zeros(self.shape, device=device, dtype=stats_dtype))
        self.register_buffer("var", torch.ones(self.shape, device=device, dtype=stats_dtype))
        self.register_buffer("count", torch.tensor(epsilon, device=device, dtype=stats_dtype))

    @property
    def std(self) -> Tensor:
        """The divisor ``normalize`` uses: ``sqrt(var + epsilon)``."""
        return torch.sqrt(self.var + self.epsilon)

    def update(self, batch: Tensor) -> None:
        """Merge a batch ``[..., *shape]`` (all leading dimensions are samples) into the statistics."""
        self._check_device(batch, self.mean)
        self._check_shape(batch, "update")
        with torch.no_grad():
            samples = batch.reshape(-1, *self.shape)  # (N, *shape)
            n_samples = samples.shape[0]
            if n_samples == 0:  # a shape, not a value: no sync
                return
            batch_var, batch_mean = torch.var_mean(samples.to(self.mean.dtype), dim=0, correction=0)
            self.merge_batch(batch_mean, batch_var, n_samples)

    def merge_batch(self, batch_mean: Tensor, batch_var: Tensor, n_samples: Tensor | int) -> None:
        """Merge the moments (mean, ddof-0 variance, count) of a batch into the statistics.

        `update` calls this with one batch's moments; a distributed run calls it with the moments of
        every rank's batch combined (`control/distributed.py`), so all ranks keep the same statistics.
        """
        with torch.no_grad():
            weight = n_samples / (self.count + n_samples)
            if self.momentum is not None:
                weight = torch.clamp(weight, min=self.momentum)
            mean, var = merge_moments(self.mean, self.var, batch_mean, batch_var, weight)
            self.mean.copy_(mean)
            self.var.copy_(var)
            self.count.add_(n_samples)

    def normalize(self, x: Tensor) -> Tensor:
        """``clamp((x - mean) / sqrt(var + epsilon), -clip, clip)`` for ``x`` of shape ``[..., *shape]``."""
        self._check_device(x, self.mean)
        self._check_shape(x, "normalize")
        return normalize_with(self.mean, self.var, self.epsilon, self.clip, x)

    def denormalize(self, x: Tensor) -> Tensor:
        """``x * sqrt(var + epsilon) + mean``: undoes ``normalize`` wherever it did not clip."""
        self._check_device(x, self.mean)
        self._check_shape(x, "denormalize")
        return denormalize_with(self.mean, self.var, self.epsilon, x)

    def _check_shape(self, x: Tensor, method: str) -> None:
        # Broadcasting would otherwise silently pair e.g. a (3, 1) input with shape (3,).
        trailing = tuple(x.shape[x.dim() - len(self.shape) :]) if len(self.shape) <= x.dim() else None
        if trailing != self.shape:
            raise ValueError(
                f"RunningMeanStd.{method} expects a tensor of shape [..., {', '.join(map(str, self.shape))}] "
                f"(trailing dimensions equal to shape={self.shape}), got {tuple(x.shape)}"
            )

    def extra_repr(self) -> str:
        return f"shape={self.shape}, epsilon={self.epsilon}, clip={self.clip}, momentum={self.momentum}"


class ValueNormalizer(_FollowsInputDevice):
    """Running statistics of value targets: the critic learns ``normalize(targets)``, and its outputs
    are mapped back with ``denormalize`` before they enter GAE. No clipping, so the round trip is exact.

    ``center=False`` only divides by the running std (the mean is still tracked, for the variance).
    """

    def __init__(
        self,
        *,
        center: bool = True,
        epsilon: float = 1e-4,
        momentum: float | None = None,
        strict_device: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(strict_device)
        self.center = center
        self.stats = RunningMeanStd(
            (),
            epsilon=epsilon,
            clip=math.inf,
            momentum=momentum,
            strict_device=strict_device,
            device=device,
            dtype=dtype,
        )

    def update(self, targets: Tensor) -> None:
        """Merge value targets of any shape into the statistics."""
        self._check_device(targets, self.stats.mean)
        self.stats.update(targets)

    def normalize(self, values: Tensor) -> Tensor:
        """Values in units of the running std (minus the running mean when ``center``)."""
        self._check_device(values, self.stats.mean)
        if self.center:
            return self.stats.normalize(values)
        return scale_with(self.stats.var, self.stats.epsilon, math.inf, values)

    def denormalize(self, normalized: Tensor) -> Tensor:
        """Inverse of ``normalize``."""
        self._check_device(normalized, self.stats.mean)
        if self.center:
            return self.stats.denormalize(normalized)
        return normalized * self.stats.std.to(normalized.dtype)

    def extra_repr(self) -> str:
        return f"center={self.center}"


class RewardNormalizer(_FollowsInputDevice):
    """Divides rewards by the running std of the discounted return, per env, and clips the result.

    Each env carries ``returns = gamma * returns + reward``; the std of those returns is the scale
    (Engstrom et al., 2020, "Implementation Matters in Deep Policy Gradients"). A return is zeroed
    after its env reports done, so the return at a terminal step still includes that episode's past.
    """

    returns: Tensor

    def __init__(
        self,
        n_envs: int,
        *,
        gamma: float = 0.995,
        epsilon: float = 1e-4,
        clip: float = 10.0,
        momentum: float | None = None,
        strict_device: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(strict_device)
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        if not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.n_envs = n_envs
        self.gamma = gamma
        self.stats = RunningMeanStd(
            (),
            epsilon=epsilon,
            clip=clip,
            momentum=momentum,
            strict_device=strict_device,
            device=device,
            dtype=dtype,
        )
        self.register_buffer("returns", torch.zeros(n_envs, device=device, dtype=self.stats.mean.dtype))

    def update(self, rewards: Tensor, dones: Tensor) -> Tensor:
        """Fold one step's ``rewards [n_envs]`` into the returns and statistics; return the scaled rewards.

        ``dones [n_envs]`` (bool or 0/1) marks envs whose episode ended at this step; their returns
        restart from zero at the next step.
        """
        self._check_device(rewards, self.returns)
        for name, tensor in (("rewards", rewards), ("dones", dones)):
            if tuple(tensor.shape) != (self.n_envs,):
                raise ValueError(
                    f"RewardNormalizer.update expects {name} of shape [n_envs] = [{self.n_envs}], "
                    f"got {tuple(tensor.shape)}"
                )
        with torch.no_grad():
            self.returns.mul_(self.gamma).add_(rewards.to(self.returns.dtype))
            self.stats.update(self.returns)
            self.returns.masked_fill_(dones.to(device=self.returns.device, dtype=torch.bool), 0.0)
        return self.normalize(rewards)

    def normalize(self, rewards: Tensor) -> Tensor:
        """Scale rewards by the current statistics without updating them (for evaluation)."""
        self._check_device(rewards, self.returns)
        return scale_with(self.stats.var, self.stats.epsilon, self.stats.clip, rewards)

    def reset(self) -> None:
        """Zero every env's running return (statistics are kept), e.g. when all episodes restart."""
        self.returns.zero_()

    def extra_repr(self) -> str:
        return f"n_envs={self.n_envs}, gamma={self.gamma}"
