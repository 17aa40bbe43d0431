"""`morphogen.grow_over_seeds`: `grow` once per seed, then means over the seeds and differences paired by seed.

One run of a small network can swing by points from one epoch to the next, so one run's lead proves little. The
project's own claims are means over seeds with their spread; this gives a user's claims the same footing:

    result = morphogen.grow_over_seeds(task, make_host, seeds=5, run_dir="runs/mine", epochs=30)
    result.differences["no growth"]  # (mean, standard error) of grown minus no growth, by seed

Each seed is a whole `grow` (its own run directory, `RUN_DIR/seed_<s>`) and prints one line; the closing table
compares the grown model with each comparison every seed trained. The seeds are independent, so `jobs=N` plays
them in N worker processes side by side.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import math
import multiprocessing
import pickle
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from morphogen.commands.run import RunConfig, RunResult, run_command, run_name, settings_from
from morphogen.config import ConfigError
from morphogen.data import Task
from morphogen.env.play import EpisodeOutcome
from morphogen.growing import grow
from morphogen.limits import MAX_JOBS, check_count, short_repr
from morphogen.run_directory import SEEDS_FILENAME, make_run_dir, write_atomic
from morphogen.telemetry.story import NEGATIVE_LOSS
from morphogen.ui.terminal_text import cut, printable
from morphogen.ui.units import format_difference, format_flops, format_score

#: Most seeds one call plays (each is a whole `grow`).
MAX_SEEDS = 100


@dataclass(frozen=True)
class SeedsResult:
    """What `grow_over_seeds` produced: each seed's `RunResult`, and the grown model's score minus each
    comparison's, paired by seed, as (mean, standard error)."""

    runs: dict[int, RunResult]
    differences: dict[str, tuple[float, float]]
    """By comparison ("no growth", "from scratch", or a `compare_with` name) present in every seed's run."""
    run_dir: Path
    """Where the seeds' runs (`seed_<s>/`) and `seeds.json` are."""


def paired_difference(first: Sequence[float], second: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of `first[i] - second[i]` (the error is 0 for one pair)."""
    differences = [a - b for a, b in zip(first, second, strict=True)]
    spread = statistics.stdev(differences) if len(differences) > 1 else 0.0
    return statistics.fmean(differences), spread / math.sqrt(len(differences))


def grow_over_seeds(task: Task, host: object = None, *, seeds: int | Sequence[int] = 5, run_dir: str | None = None,
                    out: TextIO | None = None, jobs: int = 1, threads: int | None = None,
                    **grow_options: Any) -> SeedsResult:
    """`morphogen.grow` once for each of `seeds` (a count from 0, or the seeds themselves), with `grow_options`
    (`epochs`, `config`, `compare_with`, ...), each run into `run_dir/seed_<s>` (`run_dir` None: a new
    `runs_root/<time>-<task>-seeds`); prints a line per seed, then each model's mean ± std over the seeds and the
    grown model's differences from each comparison, paired by seed (mean ± standard error, seeds ahead and behind),
    which also go to `run_dir/seeds.json`.

    Give `host` as a function building it, so that each seed starts from its own initial weights; a module is
    copied for each seed, so every seed starts from its weights (their batches still differ), and it is left as it
    was (each seed's grown model is in `runs[seed].model`).

    `jobs` > 1 plays the seeds in that many worker processes (spawned), each with `threads` torch threads (None:
    this process's count shared among them, at least 1); the figures are those of `jobs=1` at the same thread
    count. The workers receive `task`, `host` and `grow_options` pickled, so functions among them must be
    defined at a module's top level (not lambdas).
    """
    for option in ("seed", "run_dir", "out", "resume"):
        if option in grow_options:
            raise ConfigError(f"grow_over_seeds: {option} is chosen per seed; to go on with a stopped seed, call "
                              "morphogen.grow(..., seed=s, run_dir=RUN_DIR/seed_<s>, resume=True)")
    settings = settings_from(grow_options.get("config"), task.name, task.topology)
    from_scratch = grow_options.get("from_scratch")
    return play_over_seeds(
        GrowSeed(task, host, grow_options), seeds, run_dir, grow_options.get("runs_root") or settings.runs_root,
        task.name, settings.from_scratch if from_scratch is None else bool(from_scratch), out, jobs=jobs,
        threads=threads)


@dataclass(frozen=True)
class GrowSeed:
    """`grow` for one seed of `grow_over_seeds`: a picklable callable, so a worker process can play it."""

    task: Task
    host: object
    grow_options: Mapping[str, Any]

    def __call__(self, seed: int, directory: str) -> RunResult:
        # A copy of a host module: `grow` loads the grown weights back into the host it is given, and the next
        # seed would start from them.
        host = copy.deepcopy(self.host) if isinstance(self.host, torch.nn.Module) else self.host
        return grow(self.task, host, seed=seed, run_dir=directory, out=io.StringIO(), **self.grow_options)


@dataclass
class RunSeed:
    """`morphogen run` for one seed of `--seeds`: the run's config at its first seed, and the task already loaded
    (or None, to load it per seed as `run` does). Worker processes are sent `for_workers()`: without the task,
    which may hold a user's local functions, and each loads that task itself, once (`load_task`)."""

    config: RunConfig
    policy: str | None
    task: Task | None
    load_task: bool = False

    def for_workers(self) -> RunSeed:
        """The same runs, for worker processes: the task left for each to load."""
        return dataclasses.replace(self, task=None, load_task=self.task is not None or self.load_task)

    def __call__(self, seed: int, directory: str) -> RunResult:
        from morphogen.devices import resolve_device
        from morphogen.session import load_session_task

        device = resolve_device(self.config.device)
        if self.load_task and self.task is None:  # in a worker: the task the parent loaded, at the first seed
            self.task = load_session_task(self.config.with_resolved_host(), device)
        factory = None
        if self.policy is not None:
            from morphogen.commands.evaluate import policy_controller_factory

            factory = policy_controller_factory(self.policy, device, self.config.compile_settings)
        return run_command(dataclasses.replace(self.config, seed=seed, run_dir=directory), factory, io.StringIO(),
                           self.task)


def play_over_seeds(play: Callable[[int, str], RunResult], seeds: int | Sequence[int], run_dir: str | None,
                    runs_root: str, task_name: str, from_scratch: bool, out: TextIO | None, *, jobs: int = 1,
                    threads: int | None = None) -> SeedsResult:
    """`play(seed, its run directory)` for each seed, into `run_dir` (None: a new one under `runs_root`), then the
    figures over the seeds (`grow_over_seeds`; `morphogen run --seeds`). `from_scratch`: whether the runs train the
    grown model's final architecture from scratch. `jobs` > 1: `play` (picklable) runs in that many worker
    processes, each with `threads` torch threads (None: this process's count shared among them)."""
    chosen = _checked_seeds(seeds)
    try:
        check_count("jobs", jobs, MAX_JOBS)
        if threads is not None:
            check_count("threads", threads, MAX_JOBS)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    workers = min(jobs, len(chosen))
    if workers > 1:
        _check_picklable(play)
    parent = make_run_dir(run_dir, runs_root, f"{run_name(task_name)}-seeds")
    directories = [str(parent / f"seed_{seed}") for seed in chosen]
    runs: dict[int, RunResult] = {}
    played = map(play, chosen, directories) if workers == 1 else \
        _played_by_workers(play, chosen, directories, workers, threads or max(1, torch.get_num_threads() // workers))
    for seed, run in zip(chosen, played, strict=True):
        runs[seed] = run
        print(_seed_line(seed, run, from_scratch), file=out, flush=True)
    pairs = _pairs(list(runs.values()), from_scratch)
    differences = {name: paired_difference([grown.final_accuracy for grown, _ in both],
                                           [other.final_accuracy for _, other in both])
                   for name, both in pairs.items()}
    print("\n".join(_summary_lines(runs, pairs, differences)), file=out, flush=True)
    figures = json.dumps(_figures(runs, differences, from_scratch), indent=2) + "\n"
    write_atomic(parent / SEEDS_FILENAME, figures.encode())
    print(f"run dirs: {parent}/seed_<s>; figures: {parent / SEEDS_FILENAME}", file=out, flush=True)
    return SeedsResult(runs, differences, parent)


def _check_picklable(play: Callable[[int, str], RunResult]) -> None:
    """`ConfigError` in one line when what the seeds' runs need cannot be sent to a worker process."""
    try:
        pickle.dumps(play)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise ConfigError(f"jobs: worker processes receive the task, host and options pickled, and this one cannot "
                          f"be ({printable(str(error))}); define the functions you pass at a module's top level "
                          "(not lambdas or nested functions), or use jobs=1") from None


#: The seeds' play function of a worker process (set once per process by `_start_worker`).
_worker_play: Callable[[int, str], RunResult] | None = None


def _start_worker(play: Callable[[int, str], RunResult], threads: int) -> None:
    global _worker_play
    torch.set_num_threads(threads)
    _worker_play = play


def _play_in_worker(seed: int, directory: str) -> RunResult:
    assert _worker_play is not None, "a worker plays only after _start_worker"
    return _worker_play(seed, directory)


def _played_by_workers(play: Callable[[int, str], RunResult], seeds: list[int], directories: list[str], workers: int,
                       threads: int) -> Iterator[RunResult]:
    """Each seed's run, in the seeds' order, played by `workers` spawned processes. `play` is sent once to each
    worker, not with every seed (it may hold a whole dataset)."""
    # Spawned, not forked: a fork of a process whose torch threads already ran can deadlock in the child.
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(play, threads))
    try:
        yield from pool.map(_play_in_worker, seeds, directories)
    finally:  # stopped early (an error, Ctrl-C): the seeds not begun never are
        pool.shutdown(wait=True, cancel_futures=True)


def _checked_seeds(seeds: int | Sequence[int]) -> list[int]:
    chosen = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not 1 <= len(chosen) <= MAX_SEEDS or any(not isinstance(seed, int) or seed < 0 for seed in chosen) \
            or len(set(chosen)) != len(chosen):
        raise ConfigError(f"seeds: must be 1 to {MAX_SEEDS} distinct seeds >= 0 (or their count), got "
                          f"{short_repr(seeds)}")
    return chosen


Pairs = list[tuple[EpisodeOutcome, EpisodeOutcome]]


def _from_scratch(run: RunResult, trained: bool) -> EpisodeOutcome | None:
    """The grown model's final architecture trained from scratch, when `trained` (asked for); where no seed was
    kept that architecture is the host, and its training the no-growth one (the same seed and batches), which
    `grow` does not train twice."""
    if trained and run.from_scratch is None and not run.model.architecture():
        return run.baseline
    return run.from_scratch


def _pairs(runs: list[RunResult], from_scratch: bool) -> dict[str, Pairs]:
    """(grown, comparison) of every seed, by comparison, for each comparison that every seed's run trained."""
    comparisons: dict[str, list[EpisodeOutcome | None]] = {
        "no growth": [run.baseline for run in runs], "from scratch": [_from_scratch(run, from_scratch) for run in runs],
        **{name: [run.fixed.get(name) for run in runs] for name in runs[0].fixed}}
    return {name: [(run.grown, other) for run, other in zip(runs, others, strict=True) if other is not None]
            for name, others in comparisons.items() if all(other is not None for other in others)}


def _seed_line(seed: int, run: RunResult, from_scratch: bool) -> str:
    """One seed's figures: the grown model's score, parameters and FLOPs, then each comparison's score."""
    metric_name = run.metric_name
    others = [("no growth", run.baseline), ("from scratch", _from_scratch(run, from_scratch)), *run.fixed.items()]
    parts = [f", {printable(name)} {format_score(outcome.final_accuracy, metric_name)}" for name, outcome in others
             if outcome is not None]
    return (f"seed {seed}: grown {format_score(run.grown.final_accuracy, metric_name)} ({run.grown.parameters:,} "
            f"parameters, {format_flops(run.grown.flops.total)})" + "".join(parts))


def _summary_lines(runs: Mapping[int, RunResult], pairs: Mapping[str, Pairs],
                   differences: Mapping[str, tuple[float, float]]) -> list[str]:
    """The closing table: each model's means over the seeds, then the grown model's paired differences."""
    metric_name = next(iter(runs.values())).metric_name
    score = "val loss" if metric_name == NEGATIVE_LOSS else f"val {metric_name}"
    lines = [f"\n{len(runs)} seeds ({', '.join(map(str, runs))}): mean ± std over the seeds",
             f"{'':22}{cut(score, 16):>18}{'val loss':>20}{'parameters':>12}{'training FLOPs':>16}{'seconds':>10}",
             _model_line("grown", [run.grown for run in runs.values()], metric_name)]
    lines += [_model_line(name, [other for _, other in both], metric_name) for name, both in pairs.items()]
    lines.append("differences, paired by seed (mean ± standard error):")
    for name, (mean, error) in differences.items():
        ahead = sum(grown.final_accuracy > other.final_accuracy for grown, other in pairs[name])
        behind = sum(grown.final_accuracy < other.final_accuracy for grown, other in pairs[name])
        label = f"grown - {cut(printable(name), 20)}"
        lines.append(f"  {label:<30}{format_difference(mean, error, metric_name)} ({ahead} seeds ahead, "
                     f"{behind} behind)")
    return lines


def _model_line(name: str, outcomes: Sequence[EpisodeOutcome], metric_name: str) -> str:
    """A model's row: score and loss as mean ± std over the seeds; parameters, FLOPs and seconds as means."""
    def spread(values: list[float], decimals: int) -> str:
        deviation = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.fmean(values):.{decimals}f} ± {deviation:.{decimals}f}"

    scores = [o.final_accuracy for o in outcomes]
    shown = spread([-s for s in scores], 4) if metric_name == NEGATIVE_LOSS else \
        spread(scores, 2 if metric_name == "accuracy" else 4)
    losses = spread([o.final_loss for o in outcomes], 4)
    parameters = round(statistics.fmean(o.parameters for o in outcomes))
    flops = format_flops(round(statistics.fmean(o.flops.total for o in outcomes)))
    seconds = statistics.fmean(o.seconds for o in outcomes)
    return f"  {cut(printable(name), 20):<20}{shown:>18}{losses:>20}{parameters:>12,}{flops:>16}{seconds:>9.1f}s"


def _figures(runs: Mapping[int, RunResult], differences: Mapping[str, tuple[float, float]],
             from_scratch: bool) -> dict[str, object]:
    """What `seeds.json` holds: each seed's run directory and scores, and the paired differences."""
    def score(outcome: EpisodeOutcome | None) -> float | None:
        return None if outcome is None else outcome.final_accuracy

    return {"score": {"name": next(iter(runs.values())).metric_name},
            "seeds": {str(seed): {"run_dir": str(run.run_dir), "grown": score(run.grown),
                                  "no growth": score(run.baseline),
                                  "from scratch": score(_from_scratch(run, from_scratch)),
                                  "fixed": {name: score(outcome) for name, outcome in run.fixed.items()}}
                      for seed, run in runs.items()},
            "differences": {name: {"mean": mean, "standard_error": error}
                            for name, (mean, error) in differences.items()}}
