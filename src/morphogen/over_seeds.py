"""`morphogen.grow_over_seeds`: `grow` once per seed, then means over the seeds and differences paired by seed.

One run of a small network can swing by points from one epoch to the next, so one run's lead proves little. The
project's own claims are means over seeds with their spread; this gives a user's claims the same footing:

    result = morphogen.grow_over_seeds(task, make_host, seeds=5, run_dir="runs/mine", epochs=30)
    result.differences["no growth"]  # (mean, standard error) of grown minus no growth, by seed

Each seed is a whole `grow` (its own run directory, `RUN_DIR/seed_<s>`) and prints one line; the closing table
(`seeds_summary.py`) compares the grown model with each comparison every seed trained. The seeds are independent,
so `jobs=N` plays them in N worker processes side by side, and a run over seeds that stopped goes on where it
stood (`resume`): seeds that finished are read back, a seed's run that stopped resumes, the rest are played.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import inspect
import io
import json
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

import cloudpickle
import torch

from morphogen.commands.run import RunConfig, RunResult, prepare_run, run_command, run_name, settings_from
from morphogen.commands.threads import torch_threads
from morphogen.commands.workers import WorkerJob, spawned_workers
from morphogen.config import ConfigError
from morphogen.core.hosts import SegmentedHost
from morphogen.data import Task
from morphogen.devices import resolve_device
from morphogen.growing import grow, grow_settings
from morphogen.limits import MAX_JOBS, MAX_SEED, check_count, short_repr
from morphogen.run_directory import (
    CONFIG_FILENAME,
    FROM_SCRATCH_DIRNAME,
    MODEL_FILENAME,
    SEEDS_FILENAME,
    SEEDS_PLAN_FILENAME,
    SUMMARY_FILENAME,
    LockPurpose,
    RunDirectoryRefused,
    hold_run_directory,
    make_run_dir,
    read_json_object,
    refuse_other_run,
    refuse_planted_link,
    write_atomic,
)
from morphogen.seeds_summary import SeedRun, differences_of, seed_line, seed_pairs, seeds_figures, summary_lines
from morphogen.ui.terminal_text import printable
from morphogen.user_paths import user_path

#: Most seeds one call plays (each is a whole `grow`).
MAX_SEEDS = 100
#: `grow`'s options that `grow_over_seeds` chooses for each seed, refused among its `grow_options`.
_PER_SEED = ("seed", "run_dir", "out")


@dataclass(frozen=True)
class SeedsResult:
    """What `grow_over_seeds` produced: the `RunResult` of each seed it played, and the grown model's score minus
    each comparison's, paired by seed over every seed (those read back on `resume` too), as (mean, standard
    error)."""

    runs: dict[int, RunResult]
    differences: dict[str, tuple[float, float]]
    """By comparison ("no growth", "from scratch", or a `compare_with` name) present in every seed's run."""
    run_dir: Path
    """Where the seeds' runs (`seed_<s>/`) and `seeds.json` are."""


class PlaySeed(Protocol):
    """One seed's run into its directory, from the start or (`resume`) from where that run stopped."""

    def __call__(self, seed: int, directory: str, resume: bool) -> RunResult: ...

    def check(self, seed: int) -> None:
        """Raise what that seed's run would raise before writing anything (`prepare_run`), writing nothing."""


def grow_over_seeds(task: Task, host: object = None, *, seeds: int | Sequence[int] = 5, run_dir: str | None = None,
                    out: TextIO | None = None, jobs: int = 1, threads: int | None = None, resume: bool = False,
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
    count (`threads` given with `jobs=1`: this process runs the seeds with that many, then goes back to its
    own). The workers receive `task`, `host` and `grow_options` pickled by cloudpickle, which sends lambdas,
    nested functions and what a notebook or script defines by value.

    `resume=True` goes on with a run over seeds in `run_dir` that stopped, called with the same task, host, seeds
    and options: a seed whose run finished is read back from its `summary.json`, one whose run stopped resumes
    (`grow(..., resume=True)`), and the others are played.
    """
    for option in _PER_SEED:
        if option in grow_options:
            raise ConfigError(f"grow_over_seeds: {option} is chosen per seed; to go on with a stopped run over seeds, "
                              "call it again with resume=True")
    _refuse_unknown_options(grow_options)
    settings = settings_from(grow_options.get("config"), task.name, task.topology)
    from_scratch = grow_options.get("from_scratch")
    return play_over_seeds(
        GrowSeed(task, host, grow_options), seeds, None if run_dir is None else user_path(run_dir),
        user_path(grow_options.get("runs_root") or settings.runs_root),
        task.name, settings.from_scratch if from_scratch is None else bool(from_scratch), out, jobs=jobs,
        threads=threads, resume=resume)


def _refuse_unknown_options(grow_options: Mapping[str, Any]) -> None:
    """A `TypeError` naming `grow_over_seeds` for an option `grow` does not take (a misspelt `epoch`), raised before
    anything runs; without it, the first seed's check reported it as the internal `grow_settings`'s."""
    known = [name for name in inspect.signature(grow).parameters if name not in ("task", "host", *_PER_SEED)]
    for option in grow_options:
        if option not in known:
            close = difflib.get_close_matches(option, known, n=1)
            raise TypeError(f"grow_over_seeds() got an unexpected keyword argument {option!r}"
                            + (f": did you mean {close[0]!r}?" if close else f" (it takes grow's: {', '.join(known)})"))


@dataclass(frozen=True)
class GrowSeed:
    """`grow` for one seed of `grow_over_seeds`: a picklable callable, so a worker process can play it."""

    task: Task
    host: object
    grow_options: Mapping[str, Any]

    def fresh_host(self) -> SegmentedHost | None:
        """A host of this run's architecture to load a saved run's weights into (a copy of the host module, or the
        host function's, built without touching torch's global generator); None where the task builds its own."""
        given = self.task.host if self.host is None else self.host
        if isinstance(given, SegmentedHost):
            return copy.deepcopy(given)
        if callable(given):
            with torch.random.fork_rng(devices=[]):
                built = given()
            return built if isinstance(built, SegmentedHost) else None
        return None

    def __call__(self, seed: int, directory: str, resume: bool) -> RunResult:
        # A copy of a host module: `grow` loads the grown weights back into the host it is given, and the next
        # seed would start from them.
        host = copy.deepcopy(self.host) if isinstance(self.host, torch.nn.Module) else self.host
        return grow(self.task, host, seed=seed, run_dir=directory, out=io.StringIO(), resume=resume,
                    **self.grow_options)

    def check(self, seed: int) -> None:
        options = dict(self.grow_options)
        compare_with = options.pop("compare_with", None)
        settings, task = grow_settings(self.task, self.host, seed=seed, **options)
        prepare_run(settings, task=task, compare_with=compare_with)


@dataclass
class RunSeed:
    """`morphogen run` for one seed of `--seeds`: the run's config at its first seed (its policy, if any, recorded
    with the checksum of its weights), and the task already loaded (or None, to load it per seed as `run` does).
    Worker processes are sent `for_workers()`: without the task, which may hold a user's local functions, and each
    loads that task itself, once (`load_task`)."""

    config: RunConfig
    task: Task | None
    load_task: bool = False

    def for_workers(self) -> RunSeed:
        """The same runs, for worker processes: the task left for each to load."""
        return dataclasses.replace(self, task=None, load_task=self.task is not None or self.load_task)

    def plan(self) -> dict[str, Any]:
        """What `run --resume` of the run over seeds needs to play them again: the config (with its policy) and
        whether the task is loaded once for every seed."""
        from morphogen.config import config_to_dict

        values = config_to_dict(dataclasses.replace(self.config, run_dir=None))
        return {"config": values, "task_loaded_once": self.task is not None or self.load_task}

    @classmethod
    def from_plan(cls, plan: dict[str, Any], config: RunConfig) -> RunSeed:
        """The runs a plan (`plan()`) describes, with `config` built from it."""
        return cls(config, None, load_task=plan.get("task_loaded_once") is True)

    def __call__(self, seed: int, directory: str, resume: bool) -> RunResult:
        from morphogen.session import load_session_task

        device = resolve_device(self.config.device)
        if self.load_task and self.task is None:  # in a worker: the task the parent loaded, at the first seed
            self.task = load_session_task(self.config.with_resolved_host(), device)
        return run_command(dataclasses.replace(self.config, seed=seed, run_dir=directory), out=io.StringIO(),
                           task=self.task, resume=resume)

    def check(self, seed: int) -> None:
        prepare_run(dataclasses.replace(self.config, seed=seed, run_dir=None), task=self.task)


def play_over_seeds(play: PlaySeed, seeds: int | Sequence[int], run_dir: str | None, runs_root: str, task_name: str,
                    from_scratch: bool, out: TextIO | None, *, jobs: int = 1, threads: int | None = None,
                    resume: bool = False, plan: dict[str, Any] | None = None) -> SeedsResult:
    """`play(seed, its run directory, resume)` for each seed, into `run_dir` (None: a new one under `runs_root`),
    then the figures over the seeds (`grow_over_seeds`; `morphogen run --seeds`). `from_scratch`: whether the runs
    train the grown model's final architecture from scratch. `jobs` > 1: `play` (picklable) runs in that many
    worker processes, each with `threads` torch threads (None: this process's count shared among them).

    The first seed's run is checked (`play.check`) before anything is made; then the seeds, `from_scratch` and `plan`
    (what else a resume needs) go to `RUN_DIR/seeds_plan.json`, before any seed plays; `resume` goes on with the run
    over seeds there (the seeds given must be its own)."""
    chosen = _checked_seeds(seeds)
    try:
        check_count("jobs", jobs, MAX_JOBS)
        if threads is not None:
            check_count("threads", threads, MAX_JOBS)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    workers = min(jobs, len(chosen))
    sent = _sent_to_workers(play) if workers > 1 else None
    resumed = resumable_seeds_dir(run_dir) if resume else None
    # What each seed's run refuses before it writes (an unknown slot, blueprint or task, a policy, the device, ...),
    # refused before the run directory and its plan are made; building it draws no number the runs would have drawn,
    # at the thread count the runs have.
    with torch.random.fork_rng(devices=[]), contextlib.nullcontext() if threads is None else torch_threads(threads):
        play.check(chosen[0])
    parent = resumed or make_run_dir(run_dir, runs_root, f"{run_name(task_name)}-seeds")
    # One writer of seeds_plan.json and seeds.json.
    with hold_run_directory(parent, LockPurpose.RESUME if resume else LockPurpose.NEW_RUN):
        if resume:
            _check_same_seeds(parent, chosen)
        else:
            refuse_other_run(parent)
            plan_text = json.dumps({"seeds": chosen, "from_scratch": from_scratch, **(plan or {})}, indent=2)
            write_atomic(parent / SEEDS_PLAN_FILENAME, (plan_text + "\n").encode())
        runs, played = _played_over_seeds(play, sent, chosen, parent, from_scratch, out, workers, threads)
        pairs = seed_pairs(list(runs.values()))
        differences = differences_of(pairs)
        print("\n".join(summary_lines(runs, pairs, differences)), file=out, flush=True)
        figures = json.dumps(seeds_figures(runs, differences), indent=2) + "\n"
        write_atomic(parent / SEEDS_FILENAME, figures.encode())
    print(f"run dirs: {parent}/seed_<s>; figures: {parent / SEEDS_FILENAME}", file=out, flush=True)
    return SeedsResult(played, differences, parent)


def _played_over_seeds(play: PlaySeed, sent: bytes | None, seeds: list[int], parent: Path, from_scratch: bool,
                       out: TextIO | None, workers: int,
                       threads: int | None) -> tuple[dict[int, SeedRun], dict[int, RunResult]]:
    """Each seed's figures, in the seeds' order (a line printed for each as it comes), and the runs played now: a
    seed whose run finished before is read back, one whose run stopped resumes, the others are played. `sent`:
    `play` pickled for worker processes (None with one worker)."""
    directories = {seed: parent / f"seed_{seed}" for seed in seeds}
    for directory in directories.values():  # a `seed_<s>` link planted in a copied run would take its run elsewhere
        refuse_planted_link(directory)
    finished = {seed for seed, directory in directories.items() if (directory / SUMMARY_FILENAME).is_file()}
    jobs = [(seed, str(directories[seed]), (directories[seed] / CONFIG_FILENAME).is_file())
            for seed in seeds if seed not in finished]
    count = min(workers, len(jobs))
    runs: dict[int, SeedRun] = {}
    played: dict[int, RunResult] = {}
    with contextlib.ExitStack() as stack:
        if count <= 1 or sent is None:
            if threads is not None:  # as a worker would: a run's floating-point sums depend on the thread count
                stack.enter_context(torch_threads(threads))
            results: Iterator[RunResult] = (play(*job) for job in jobs)
        else:  # `play` is sent once to each worker, not with every seed (it may hold a whole dataset)
            threads = threads or max(1, torch.get_num_threads() // count)
            pool = stack.enter_context(spawned_workers(count, threads, _set_worker_play, (sent,)))
            results = (_received(pickle.loads(result), play) for result in pool.map(WorkerJob(_play_in_worker), jobs))
        for seed in seeds:
            if seed in finished:
                runs[seed] = SeedRun.read(directories[seed], from_scratch)
            else:
                played[seed] = next(results)
                runs[seed] = SeedRun.of(played[seed], from_scratch)
            print(seed_line(seed, runs[seed]), file=out, flush=True)
    return runs, played


def resumable_seeds_dir(run_dir: str | None) -> Path:
    """The directory of a run over seeds that stopped before its figures; `RunDirectoryRefused` saying why not."""
    if run_dir is None:
        raise RunDirectoryRefused("resuming a run over seeds needs its run directory (run_dir=...)")
    path = Path(run_dir)
    if not (path / SEEDS_PLAN_FILENAME).is_file():
        raise RunDirectoryRefused(f"{path} holds no run over several seeds to resume (no {SEEDS_PLAN_FILENAME})")
    if (path / SEEDS_FILENAME).is_file():
        raise RunDirectoryRefused(f"{path} holds a finished run over several seeds: nothing to resume")
    return path


def read_seeds_plan(path: Path) -> dict[str, Any]:
    """The plan of the run over seeds in `path` (`RunDirectoryRefused` when damaged): its seeds, whether its runs
    train from scratch, and what its command added (`RunSeed.plan`)."""
    plan = read_json_object(path / SEEDS_PLAN_FILENAME)
    seeds = None if plan is None else plan.get("seeds")
    if plan is None or not isinstance(seeds, list) or not isinstance(plan.get("from_scratch"), bool):
        raise RunDirectoryRefused(f"{path / SEEDS_PLAN_FILENAME} is damaged: it does not say which seeds to play")
    try:
        _checked_seeds(seeds)
    except ConfigError:
        raise RunDirectoryRefused(f"{path / SEEDS_PLAN_FILENAME} is damaged: its seeds are not "
                                  f"{short_repr(seeds)}") from None
    return plan


def _check_same_seeds(path: Path, seeds: list[int]) -> None:
    planned = read_seeds_plan(path)["seeds"]
    if planned != seeds:
        raise ConfigError(f"seeds: the run over seeds in {path} plays {short_repr(planned)}, not {short_repr(seeds)}; "
                          "resume it with its own")


def _sent_to_workers(play: PlaySeed) -> bytes:
    """`play` pickled for worker processes, or `ConfigError` in one line when it cannot be.

    cloudpickle, not pickle: it sends lambdas, nested functions and the classes and functions of a script or
    notebook by value (their code), where pickle sends only a reference to a module's top-level name, which a
    spawned worker cannot resolve for a notebook's cell or a function's local. The bytes load with plain
    `pickle.loads`, so a worker needs nothing but cloudpickle installed."""
    try:
        sent: bytes = cloudpickle.dumps(play)
        return sent
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise ConfigError(f"jobs: worker processes receive the task, host and options pickled, and this one cannot "
                          f"be ({printable(str(error))}); pass what a process can receive (no open files, locks "
                          "or generators), or use jobs=1") from None
    except RuntimeError as error:
        if "parametrized" not in str(error):
            raise
        raise ConfigError("jobs: the host holds parametrized layers (weight norm, spectral norm), which torch cannot "
                          "pickle for worker processes: pass a function that builds the host (host=lambda: "
                          "morphogen.host_from_module(...)), or use jobs=1") from None


#: The seeds' play function of a worker process (set once per process by `_set_worker_play`).
_worker_play: PlaySeed | None = None


def _set_worker_play(sent: bytes) -> None:
    global _worker_play
    _worker_play = pickle.loads(sent)  # bytes this run's own parent pickled, never a file


def _play_in_worker(job: tuple[int, str, bool]) -> bytes:
    """One seed's `RunResult`, pickled by cloudpickle too: its grown model holds instances of the classes the
    parent sent by value, which plain pickle cannot send back (cloudpickle maps them to the parent's own). A model
    with parametrized layers (weight norm, spectral norm), which pickle refuses, goes back through its run
    directory's saved model instead (`_WithoutModels`)."""
    assert _worker_play is not None, "a worker plays only after _set_worker_play"
    played = _worker_play(*job)
    try:
        result: bytes = cloudpickle.dumps(played)
    except RuntimeError as error:
        if "parametrized" not in str(error):
            raise
        result = cloudpickle.dumps(_WithoutModels({field.name: getattr(played, field.name)
                                                   for field in dataclasses.fields(played) if field.name not in
                                                   ("model", "from_scratch_model")}))
    return result


@dataclass(frozen=True)
class _WithoutModels:
    """A seed's `RunResult` without its models, which the parent loads from the run directory the seed saved."""

    fields: dict[str, Any]


def _received(value: RunResult | _WithoutModels, play: PlaySeed) -> RunResult:
    """A seed's `RunResult` as a worker sent it; its models loaded from its run directory where it sent none."""
    if isinstance(value, RunResult):
        return value
    from morphogen.export import load_grown_model

    fresh_host = getattr(play, "fresh_host", lambda: None)
    run_dir = Path(value.fields["run_dir"])
    from_scratch = (run_dir / FROM_SCRATCH_DIRNAME / MODEL_FILENAME).is_file()
    return RunResult(**value.fields, model=load_grown_model(run_dir, fresh_host()),
                     from_scratch_model=load_grown_model(run_dir, fresh_host(), from_scratch=True) if from_scratch
                     else None)


def _checked_seeds(seeds: object) -> list[int]:
    # True is no count of seeds.
    chosen = list(range(seeds)) if isinstance(seeds, int) and not isinstance(seeds, bool) \
        else list(seeds) if isinstance(seeds, list | tuple | range) else []
    if not 1 <= len(chosen) <= MAX_SEEDS or any(not isinstance(seed, int) or isinstance(seed, bool) or seed < 0
                                                for seed in chosen) or len(set(chosen)) != len(chosen):
        raise ConfigError(f"seeds: must be 1 to {MAX_SEEDS} distinct seeds >= 0 (or their count), got "
                          f"{short_repr(seeds)}")
    if max(chosen) > MAX_SEED:  # found before any seed plays, not when the first past it is set
        raise ConfigError(f"seeds: {max(chosen):,} is past the largest seed, {MAX_SEED:,}")
    return chosen
