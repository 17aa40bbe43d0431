"""Multi-process PPO on `torch.distributed` (docs/architecture.md#distributed): decentralized distributed
PPO (Wijmans et al. 2020).

`torchrun --nproc-per-node N -m morphogen train --distributed ...` starts N ranks. The run's
`n_envs` envs are split into N equal shares: rank r owns global envs `r*L .. r*L + L - 1`
(L = n_envs / N), which get the seeds and env ids they would have in one process. Gloo is the
backend on CPU, NCCL on CUDA (`choose_backend`), unless `--dist-backend` says otherwise.

Rules every rank follows in lockstep (a rank that skips or reorders one collective deadlocks the
others, so every collective of a run is issued from this module, in this order):

1. Start: every rank builds the same policy from the same seed; rank 0's parameters are then
   broadcast so that all ranks start bit-identical even if a build differed.
2. Each env step: the ranks all-gather their envs' raw features, blueprint ids and action masks,
   and every rank runs the one batched policy call on all `n_envs` envs with the round's generator
   (seeded by (seed, round) alone). So every rank draws the same actions a single process with
   `n_envs` envs draws, the observation normalizer sees the same global batch on every rank, and
   the LSTM state of every env is kept on every rank; each rank applies its own envs' actions and
   stores only its own envs' rows in its rollout buffer. (The policy call on all envs is cheap
   next to an env step, which is an epoch of host training: see docs/scaling.md.)
3. Reward and value normalizers merge their statistics across ranks by parallel moments (Chan et
   al. 1979): each rank's batch (count, mean, variance) is all-gathered and combined in rank order,
   then merged into the running statistics, so every rank holds the same statistics.
4. Update: `ppo_update(processes=RankShare(...))` all-reduces the advantage moments once, every minibatch's
   flattened gradients (one all-reduce, then the mean), and each epoch's KL. All ranks then clip
   the same gradients and take the same Adam step: parameters stay bit-identical (tested).
   Minibatches are groups of the global envs, drawn the same way one process draws them; each
   rank takes its envs of a group and weights its gradient by their share of it (`RankShare`), so
   the update equals one process's update over all envs up to the summation order of floats, with
   any `ppo.minibatches` (at most the envs of one rank). The price: a rank computes only its part of
   each group, and the parts differ in size, so a minibatch lasts as long as its largest part.
5. Round summary, after the update: one all-gather of each rank's means (return, accuracy, ...),
   times (collect, the part of it spent waiting in collectives, update, all-reduce), PPO statistics
   and the moments of its rollout's values and returns. The means are averaged; the PPO statistics
   become those of the whole update (`combine_statistics`: the loss terms, clip fraction and head
   entropies are averaged from each rank's share, the ratio extremes taken over the ranks, explained
   variance and spreads computed from the merged moments), so the round line, the events and the
   anomaly checks read the same numbers on every rank, and the numbers one process with all envs
   reports, up to the summation order of floats (tested). Rank 0 prints the slowest rank and writes
   every rank's times (`RankTimes`).
6. Only rank 0 holds the run directory: it prints (anomaly lines included: the other ranks log only
   errors), writes telemetry and the checkpoint. The
   checkpoint is the one a single process with `n_envs` envs writes (global config, reward
   normalizer returns of shape [n_envs]), so it resumes on any number of ranks that divides
   `n_envs`, or without `--distributed`.

A rank that dies makes every collective of the others fail: a killed rank closes its sockets and
the others fail at their next collective, within one env step; a rank that hangs is given up on
after `timeout_s` (`--dist-timeout`). Either way `PeerLostError` ends the run with one line; the
last checkpoint was written atomically after the last completed round and is resumable.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from morphogen.control.advice import HeuristicAdvisor
from morphogen.control.growth_policy import GrowthInputs
from morphogen.control.learned import PolicyInputs
from morphogen.control.normalization import RunningMeanStd, merge_moments
from morphogen.control.policy import ActionOutput, LSTMState, map_observation
from morphogen.control.ppo import MinibatchPart, PPOStatistics, check_minibatches
from morphogen.control.trainer import EnvGroup, PPOTrainer, Rollout, RoundSummary, TrainConfig, _config_dict
from morphogen.data import Task
from morphogen.env.actions import Action
from morphogen.env.play import Controller
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.limits import MAX_TIMEOUT_SECONDS
from morphogen.telemetry import events
from morphogen.telemetry.sinks import Telemetry

#: Environment variables torchrun sets for every rank; `--distributed` needs all of them.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: Default seconds a rank waits in a collective for the others before giving up on them.
DEFAULT_TIMEOUT_S = 600.0
BACKENDS = ("gloo", "nccl")


class DistributedSetupError(ValueError):
    """`--distributed` cannot start: not launched by torchrun, or envs that do not split evenly."""


class PeerLostError(RuntimeError):
    """A collective failed: another rank died, hung past the timeout, or stopped on an error."""


@dataclass
class CollectiveTime:
    """Wall seconds this rank spent inside collectives, by kind (benchmarks/distributed.py reads them).

    The time includes waiting for slower ranks to arrive, which is what a round loses to them.
    """

    seconds: dict[str, float] = field(default_factory=dict)
    #: Seconds of each kind already returned by `take`.
    taken: dict[str, float] = field(default_factory=dict)

    def add(self, what: str, seconds: float) -> None:
        self.seconds[what] = self.seconds.get(what, 0.0) + seconds

    def take(self, what: str) -> float:
        """Seconds inside collectives of kind `what` since the last `take` of that kind (or since the start)."""
        total = self.seconds.get(what, 0.0)
        taken, self.taken[what] = self.taken.get(what, 0.0), total
        return max(total - taken, 0.0)

    def total(self) -> float:
        """Seconds inside collectives of every kind so far."""
        return sum(self.seconds.values())


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the run: its rank, the number of ranks, the backend and the timeout."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    timeout_s: float
    time: CollectiveTime = field(default_factory=CollectiveTime, compare=False)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one rank that prints, writes telemetry and checkpoints."""
        return self.rank == 0


def choose_backend(device: str, override: str | None = None) -> str:
    """NCCL for CUDA devices, gloo otherwise; `override` (gloo or nccl) wins.

    `device` is where the policy lives (`TrainConfig.policy_device`: the first of `--devices`, else
    `--device`): every collective runs on the policy's tensors, so its device decides. `auto` counts as
    CUDA where CUDA is available, as it resolves to it.
    """
    if override is not None:
        if override not in BACKENDS:
            raise DistributedSetupError(f"--dist-backend must be one of {', '.join(BACKENDS)}, got {override!r}")
        return override
    if device == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return "nccl" if device.startswith("cuda") else "gloo"


def rank_device(device: str, local_rank: int) -> str:
    """The device of a rank: `cuda` becomes `cuda:<local rank>` (one GPU per rank); others are kept."""
    return f"cuda:{local_rank}" if device == "cuda" else device


def nccl_device_index(device: str, local_rank: int) -> int:
    """The CUDA device NCCL uses on this rank: the policy's (`cuda:N`, where the collectives' tensors
    live), else the local rank's (`cuda`, `auto`, or a non-CUDA device with `--dist-backend nccl`)."""
    parsed = torch.device(rank_device("cuda" if device == "auto" else device, local_rank))
    return parsed.index if parsed.type == "cuda" and parsed.index is not None else local_rank


def init_distributed(device: str, *, backend: str | None = None,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> DistributedContext:
    """Join the process group torchrun described in the environment (`TORCHRUN_VARIABLES`)."""
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        raise DistributedSetupError(f"--distributed needs the environment torchrun sets ({', '.join(missing)} "
                                    "missing): launch with torchrun --nproc-per-node N -m morphogen train "
                                    "--distributed ...")
    if not 0 < timeout_s <= MAX_TIMEOUT_SECONDS:  # NaN fails too
        raise DistributedSetupError(f"--dist-timeout must be > 0 and <= {MAX_TIMEOUT_SECONDS:,} seconds, "
                                    f"got {timeout_s}")
    chosen = choose_backend(device, backend)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if not dist.is_initialized():
        if chosen == "nccl":
            torch.cuda.set_device(nccl_device_index(device, local_rank))
        dist.init_process_group(chosen, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    if rank != 0:  # rank 0 alone prints (rule 6); the others' anomaly lines would repeat its own
        logging.getLogger("morphogen.telemetry").setLevel(logging.ERROR)
    _stop_on_termination(rank, world_size)
    return DistributedContext(rank, world_size, local_rank, chosen, timeout_s)


def _ignore_termination() -> None:
    """This rank is stopping with `PeerLostError`: a SIGTERM from the launcher now (during the exit, when
    Python no longer runs handlers) must not turn exit status 4 into a death by signal."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _stop_on_termination(rank: int, world_size: int) -> None:
    """Turn SIGTERM into `PeerLostError` (one line, exit 4): when a rank dies, torchrun ends the others
    with SIGTERM before their next collective would have noticed."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set there; the collectives then report the lost rank

    def stop(signal_number: int, frame: object) -> None:
        _ignore_termination()
        raise PeerLostError(f"rank {rank} of {world_size} was stopped by its launcher (SIGTERM), which happens when "
                            "another rank died or failed; the last checkpoint resumes with --resume")

    signal.signal(signal.SIGTERM, stop)


def shutdown() -> None:
    """Leave the process group (no-op when none was joined).

    The barrier first: with gloo, a rank that tears down while its peer is still sending makes the peer's
    connection thread abort the process ("terminate called without an active exception"). The collection
    after: gloo work objects left in reference cycles would otherwise be freed during interpreter shutdown,
    where freeing the tensors they hold aborts the process the same way.
    """
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
        gc.collect()


def split_envs(n_envs: int, world_size: int, rank: int) -> tuple[int, int]:
    """(first global env, envs) of `rank`; `n_envs` must be a multiple of `world_size`.

    Equal shares keep every rank's loss a mean over the same number of samples, so the mean of the
    ranks' gradients is the gradient of the mean over all envs.
    """
    if n_envs % world_size:
        raise DistributedSetupError(f"envs ({n_envs}) must be a multiple of the number of ranks ({world_size}); "
                                    f"use --envs {max(world_size, n_envs - n_envs % world_size)} or another "
                                    "--nproc-per-node")
    share = n_envs // world_size
    return rank * share, share


@contextmanager
def collective(what: str, context: DistributedContext) -> Iterator[None]:
    """Time the collective (`context.time`); turn its failure into `PeerLostError` with one line."""
    started = time.perf_counter()
    try:
        yield
        context.time.add(what, time.perf_counter() - started)
    except (RuntimeError, dist.DistError) as error:
        if isinstance(error, PeerLostError):
            raise
        _ignore_termination()
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PeerLostError(f"rank {context.rank} of {context.world_size} lost the other ranks during the {what} "
                            f"(a rank died, hung past --dist-timeout {context.timeout_s:g}s, or stopped on an "
                            f"error): {first[:200]}") from None


def average_(tensor: Tensor, context: DistributedContext) -> None:
    """Replace `tensor` in place by its mean over the ranks (one all-reduce)."""
    with collective("all-reduce", context):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    tensor.div_(context.world_size)


def all_gather_rows(tensor: Tensor, context: DistributedContext) -> Tensor:
    """The ranks' `tensor`s (equal shapes) concatenated along dim 0, in rank order."""
    parts = [torch.empty_like(tensor) for _ in range(context.world_size)]
    with collective("all-gather", context):
        dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


@dataclass(frozen=True)
class RankShare:
    """The `UpdateProcesses` of a data-parallel PPO update: this process holds global envs `first ..
    first + n - 1` of `total` (every process as many), and `average` averages a tensor over the processes.

    Minibatches are groups of the *global* envs: every process draws the same permutation of all `total`
    envs and takes, in each group, the envs it holds (possibly none). Its loss is a mean over its part, so it
    is weighted by its part's size times the number of processes over the group's size: the averaged
    gradient is then that of the group's mean loss, and the update the one a single process holding every
    env takes, up to the summation order of floats (tested with `minibatches > 1`). A process with no env in
    a group still takes part in its all-reduce, with a zero gradient.
    """

    first: int
    total: int
    average: Callable[[Tensor], None]

    def minibatches(self, n_envs: int, count: int, generator: torch.Generator | None) -> list[MinibatchPart]:
        if self.first < 0 or self.first + n_envs > self.total or self.total % n_envs:
            raise ValueError(f"envs {self.first}..{self.first + n_envs - 1} of {self.total} are not an equal share "
                             "of the update's envs")
        check_minibatches(count, self.total)
        processes = self.total // n_envs
        order = torch.randperm(self.total, generator=generator)
        parts = []
        for group in torch.tensor_split(order, count):
            mine = group[(group >= self.first) & (group < self.first + n_envs)] - self.first
            parts.append(MinibatchPart(mine, mine.numel() * processes / group.numel()))
        return parts

    def average_gradients(self, policy: torch.nn.Module, counts: Tensor) -> Tensor:
        """Average every parameter's gradient, and `counts`, over the processes through one flat buffer (one
        collective); return the averaged `counts`.

        A parameter without a gradient here contributes zeros, and gets the averaged gradient: another
        process may have one for it, and all processes must step the same parameters.
        """
        parameters = [p for p in policy.parameters() if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in parameters]
                         + [counts.to(parameters[0])])
        self.average(flat)
        offset = 0
        for parameter in parameters:
            size = parameter.numel()
            parameter.grad = flat[offset:offset + size].view_as(parameter).clone()
            offset += size
        return flat[offset:]


def combine_moments(counts: Tensor, means: Tensor, variances: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Count, mean and ddof-0 variance of the union of K batches given as `counts [K]`, `means [K, ...]`,
    `variances [K, ...]` (Chan et al. 1979, merged left to right)."""
    count, mean, var = counts[0], means[0], variances[0]
    for k in range(1, counts.shape[0]):
        total = count + counts[k]
        mean, var = merge_moments(mean, var, means[k], variances[k], counts[k] / total)
        count = total
    return count, mean, var


class SharedRunningMeanStd(RunningMeanStd):
    """A `RunningMeanStd` whose every `update` merges the batches of all ranks (rule 3).

    Its state is that of `RunningMeanStd` (same buffers), so checkpoints do not depend on it.
    """

    def __init__(self, template: RunningMeanStd, context: DistributedContext) -> None:
        super().__init__(template.shape, epsilon=template.epsilon, clip=template.clip, momentum=template.momentum,
                         strict_device=template.strict_device, device=template.mean.device, dtype=template.mean.dtype)
        self.load_state_dict(template.state_dict())
        self.context = context

    def update(self, batch: Tensor) -> None:
        self._check_device(batch, self.mean)
        self._check_shape(batch, "update")
        with torch.no_grad():
            samples = batch.reshape(-1, *self.shape).to(self.mean.dtype)  # (N, *shape)
            var, mean = torch.var_mean(samples, dim=0, correction=0)
            count = torch.full((1,), float(samples.shape[0]), dtype=self.mean.dtype, device=self.mean.device)
            row = torch.cat([count, mean.reshape(-1), var.reshape(-1)]).unsqueeze(0)  # (1, 1 + 2*size)
            rows = all_gather_rows(row, self.context)  # (ranks, 1 + 2*size)
            size = mean.numel()
            counts, means, variances = rows[:, 0], rows[:, 1:1 + size], rows[:, 1 + size:]
            total, merged_mean, merged_var = combine_moments(counts, means, variances)
            self.merge_batch(merged_mean.reshape(self.shape), merged_var.reshape(self.shape), total)


VALUE_MOMENTS = 7
"""Length of `value_moments`: a count, then mean and variance of values, returns and returns - values."""
_AVERAGED = ("policy_loss", "value_loss", "entropy_loss", "clip_fraction", "grad_norm")
"""PPO statistics whose mean over the ranks' shares is the update's (see `ppo_update`)."""


def value_moments(values: Tensor, returns: Tensor) -> Tensor:
    """[count, mean and ddof-0 variance of values, of returns, of returns - values] of a rollout, float64."""
    values, returns = values.detach().flatten().double(), returns.detach().flatten().double()
    parts = [torch.tensor([float(values.numel())], dtype=torch.float64, device=values.device)]
    for series in (values, returns, returns - values):
        variance, mean = torch.var_mean(series, correction=0)
        parts.append(torch.stack([mean, variance]))
    return torch.cat(parts)


def statistics_row(statistics: PPOStatistics) -> Tensor:
    """The PPO statistics a rank contributes to the round's all-gather: `_AVERAGED`, the ratio extremes and
    the head entropies, float64 on the CPU."""
    numbers = [*(getattr(statistics, name) for name in _AVERAGED), statistics.ratio_max, statistics.ratio_min,
               *statistics.entropy_per_head]
    return torch.tensor(numbers, dtype=torch.float64)


def combine_statistics(statistics: PPOStatistics, rows: Tensor) -> PPOStatistics:
    """The whole update's statistics from every rank's `statistics_row` + `value_moments` (`rows`, one per
    rank): shares averaged, extremes over the ranks, explained variance and spreads from merged moments."""
    averaged = rows[:, :len(_AVERAGED)].mean(0).tolist()
    extremes = len(_AVERAGED)
    heads = len(statistics.entropy_per_head)
    entropy = rows[:, extremes + 2:extremes + 2 + heads].mean(0).tolist()
    moments = rows[:, extremes + 2 + heads:]  # (ranks, 7)
    _, _, variance = combine_moments(moments[:, 0], moments[:, 1::2], moments[:, 2::2])
    values_variance, returns_variance, residual_variance = variance.tolist()
    explained = 1.0 - residual_variance / returns_variance if returns_variance > 0 else math.nan
    return dataclasses.replace(
        statistics, **dict(zip(_AVERAGED, averaged, strict=True)), entropy_per_head=tuple(entropy),
        ratio_max=float(rows[:, extremes].max()), ratio_min=float(rows[:, extremes + 1].min()),
        explained_variance=explained, value_std=math.sqrt(values_variance), return_std=math.sqrt(returns_variance))


def format_rank_times(times: events.RankTimes) -> str:
    """The line printed under a distributed round: the spread of the ranks' own collect work (collect time
    less the time waiting for the others in collectives), the slowest rank, and the all-reduce times."""
    work = [collect - wait for collect, wait in zip(times.collect_seconds, times.collect_wait_seconds, strict=True)]
    slowest = max(range(len(work)), key=work.__getitem__)
    return (f"          ranks: collect work {min(work):.2f}..{work[slowest]:.2f}s, slowest rank {slowest}; waiting "
            f"{min(times.collect_wait_seconds):.2f}..{max(times.collect_wait_seconds):.2f}s; all-reduce "
            f"{min(times.all_reduce_seconds):.2f}..{max(times.all_reduce_seconds):.2f}s")


def send_run_directory(context: DistributedContext, run_dir: str) -> None:
    """Rank 0: the run directory is ready; tell the other ranks where it is (they start the rounds)."""
    with collective("start-up broadcast", context):
        dist.broadcast_object_list([None, run_dir], src=0)


@contextmanager
def announce_failure(context: DistributedContext | None) -> Iterator[None]:
    """Rank 0: if the block raises, send its one-line message to the other ranks before re-raising."""
    try:
        yield
    except Exception as error:
        if context is not None and context.world_size > 1:
            with collective("start-up broadcast", context):
                dist.broadcast_object_list([f"{type(error).__name__}: {error}", None], src=0)
        raise


def receive_run_directory(context: DistributedContext) -> str:
    """Ranks > 0: wait for rank 0 to set up the run directory; its set-up error is raised here too."""
    message: list[str | None] = [None, None]
    with collective("start-up broadcast", context):
        dist.broadcast_object_list(message, src=0)
    error, run_dir = message
    if error is not None:
        raise DistributedSetupError(f"rank 0 could not set up the run: {error}")
    assert run_dir is not None
    return run_dir


def _rows(output: ActionOutput, rows: slice) -> ActionOutput:
    """The rows `rows` of every per-env field of `output`; the LSTM state is [1, B, hidden]."""
    h, c = output.state
    return ActionOutput(output.actions[rows], output.log_prob[rows], output.value[rows],
                        output.entropy_per_head[rows], output.log_prob_per_head[rows], (h[:, rows], c[:, rows]))


class DistributedTrainer(PPOTrainer):
    """A `PPOTrainer` for one rank: its share of the envs, collectives in the order of the module docstring."""

    def __init__(self, config: TrainConfig, tasks: Task | Sequence[Task], context: DistributedContext,
                 telemetry: Telemetry | None = None, *, devices: list[str] | None = None) -> None:
        """`devices` spreads this rank's envs over them as in `PPOTrainer` (None: `config.devices`)."""
        first, share = split_envs(config.n_envs, context.world_size, context.rank)
        if config.ppo.minibatches > share:
            raise DistributedSetupError(f"ppo.minibatches ({config.ppo.minibatches}) cannot exceed the envs of one "
                                        f"rank ({share} = {config.n_envs} envs / {context.world_size} ranks)")
        super().__init__(dataclasses.replace(config, n_envs=share), tasks, telemetry, first_env=first, devices=devices)
        self.global_config, self.context = config, context
        self.rows = slice(first, first + share)
        self.processes = RankShare(first, config.n_envs, lambda tensor: average_(tensor, context))
        self.state.reward_normalizer.stats = SharedRunningMeanStd(self.state.reward_normalizer.stats, context)
        self.state.value_normalizer.stats = SharedRunningMeanStd(self.state.value_normalizer.stats, context)
        self._global_state: LSTMState | None = None
        self.broadcast_policy()

    def broadcast_policy(self) -> None:
        """Rank 0's policy parameters (and observation statistics) to every rank (rule 1)."""
        tensors = [*self.state.agent.policy.state_dict().values(),
                   *self.state.agent.observation_normalizer.state_dict().values()]
        with collective("start-up broadcast", self.context):
            for tensor in tensors:
                dist.broadcast(tensor, src=0)

    # ---------------------------------------------------------------- checkpoints (rule 6)
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        config = self.global_config
        state["config"] = json.dumps(_config_dict(config))
        rewards = dict(state["reward_normalizer"])
        # Every episode ends with `done` at the round's last step, so the running returns are zero here.
        rewards["returns"] = rewards["returns"].new_zeros(config.n_envs)
        state["reward_normalizer"] = rewards
        return state

    def load_state_dict(self, state: dict[str, Any], source: str | Path) -> None:
        rewards = dict(state["reward_normalizer"])
        rewards["returns"] = rewards["returns"].new_zeros(self.config.n_envs)  # this rank's share, restarted
        super().load_state_dict({**state, "reward_normalizer": rewards}, source)
        self.broadcast_policy()

    def save(self, run_dir: Path) -> None:
        if self.context.is_main:
            super().save(run_dir)

    # ---------------------------------------------------------------- one round
    def act_step(self, group: EnvGroup, snapshots: list[EpisodeSnapshot], state: LSTMState,
                 generator: torch.Generator, starts: Tensor, advisors: Sequence[HeuristicAdvisor],
                 ) -> tuple[PolicyInputs, GrowthInputs, ActionOutput, list[Action]]:
        """Rule 2: gather every rank's inputs, act for all envs, keep this rank's rows. Every rank plays the same
        mix entry in a round, so every rank's inputs have the same numbers of slots and blueprints. Each of this
        rank's envs is advised by its own advisor."""
        agent = self.state.agent
        local = agent.inputs(snapshots, group.vector.masks(), advisors)
        gathered = PolicyInputs(map_observation(local.raw, lambda tensor: all_gather_rows(tensor, self.context)),
                                [all_gather_rows(mask, self.context) for mask in local.masks])
        # `collect` starts every env at a round's first step and none later; one sync on L bools per step.
        first_step = bool(starts.all())
        if first_step or self._global_state is None:
            self._global_state = agent.policy.initial_state(self.global_config.n_envs)
        all_starts = starts.new_full((self.global_config.n_envs,), first_step)
        observations, output = agent.act(gathered, self._global_state, generator=generator,
                                         episode_starts=all_starts, update_normalizer=True)
        self._global_state = output.state
        mine = _rows(output, self.rows)
        return (local, map_observation(observations, lambda tensor: tensor[self.rows]), mine,
                agent.decode(mine.actions, snapshots))

    def collect(self, round_index: int, demonstrators: Sequence[Controller] | None = None) -> Rollout:
        """This rank's episodes, with the seconds spent inside collectives meanwhile (waiting for other ranks).

        Imitation (`demonstrators`) is refused before a distributed run starts (`train_command`)."""
        if demonstrators is not None:
            raise ValueError("the imitation warm start runs in one process, not on distributed ranks")
        before = self.context.time.total()
        rollout = super().collect(round_index)
        return rollout._replace(waiting_seconds=self.context.time.total() - before)

    def combine_ranks(self, summary: RoundSummary, rollout: Rollout) -> RoundSummary:
        """Rule 5: one all-gather of every rank's round means and times; the means are averaged over the
        ranks (in rank order, the same on every rank) and rank 0 reports each rank's times."""
        all_reduce_seconds = self.context.time.take("all-reduce")  # the update's: collecting makes none
        means = ("mean_return", "mean_final_accuracy", "mean_parameters_added", "fossilized", "pruned")
        numbers = [*(getattr(summary, name) for name in means), summary.collect_seconds, rollout.waiting_seconds,
                   summary.update_seconds, all_reduce_seconds]
        moments = value_moments(rollout.batch.values, rollout.batch.returns)
        row = torch.cat([torch.tensor(numbers, dtype=torch.float64), statistics_row(summary.statistics),
                         moments.double().cpu()]).unsqueeze(0).to(self.state.agent.device)
        rows = all_gather_rows(row, self.context).cpu()  # (ranks, 9 + S + 7); one sync per round, for the log line
        averaged = rows[:, :len(means)].mean(0).tolist()
        times = rows[:, len(means):len(numbers)].T.tolist()  # (4, ranks)
        statistics = combine_statistics(summary.statistics, rows[:, len(numbers):])
        rank_times = events.RankTimes(epoch=summary.round * self.longest_episode, env_id=events.ALL_ENVS,
                                      round=summary.round, collect_seconds=tuple(times[0]),
                                      collect_wait_seconds=tuple(times[1]), update_seconds=tuple(times[2]),
                                      all_reduce_seconds=tuple(times[3]))
        return dataclasses.replace(summary, **dict(zip(means, averaged, strict=True)), rank_times=rank_times,
                                   statistics=statistics)

