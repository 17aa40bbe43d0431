"""Does growth pay? Heuristic growth against the same host without growth and against the grown model's
final architecture trained from scratch, on small hosts, over several seeds.

For every (task, seed) three episodes of `--epochs` epochs run on the task's default (small) host:
- grown: the heuristic controller grows the host (closed-loop TRAINING, strict gates, as `morphogen run`);
- no growth: the same host, seed and batch order, never growing;
- from scratch: the grown model's final architecture (host + every seed blended in at the end) with its
  seeds installed at epoch 0 and trained with the host for the same epochs. When nothing was grown this
  is the host itself, so the no-growth figures are reused.

Printed per task: final validation accuracy and loss, parameters and wall time of each (mean ± std over
seeds), the paired differences grown - no growth and grown - from scratch (mean ± standard error), and
the seeds' shadow contributions: the mean over TRAINING seeds that had trained at least 5 epochs, and
each blended seed's last prediction (shadow, before blending) against its measured contribution.

`text` trains on a subset of its windows (`--text-train-samples`) so that the whole benchmark ends within
an hour on a 2-core machine. Jobs run in `--jobs` processes of `--threads` torch threads each (one thread
per process: several small-model processes with the default thread count oversubscribe the cores).
`--json FILE` also writes every episode's figures.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

import torch

from arguments import BenchmarkParser, count, output_file, run_script
from morphogen.control.controller import NoGrowthController
from morphogen.control.heuristic import HeuristicController
from morphogen.data import DEFAULT_HOST_SIZES, TASK_NAMES, load_task
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.optimizer import SCHEDULES, task_optimizer_config
from morphogen.env.play import EpisodeOutcome, run_episode
from morphogen.paired_statistics import format_mean_error, format_mean_std
from morphogen.telemetry.events import CounterfactualMeasured, Event, StageTransition
from morphogen.telemetry.story import SHADOW_PREFIX
from morphogen.ui.units import format_flops

VARIANTS = ("grown", "no growth", "from scratch")
SHADOW_AFTER_EPOCHS = 5
"""The shadow-contribution figure averages measurements of seeds that have trained at least this long."""


@dataclass(frozen=True)
class Job:
    task: str
    seed: int
    epochs: int
    threads: int
    max_train_samples: int | None
    shadow_fraction: float = EpisodeConfig.shadow_fraction
    #: The learning-rate schedule (`OptimizerConfig.schedule`) over the task's own optimizer settings.
    schedule: str = "constant"


@dataclass
class Figures:
    accuracy: float
    loss: float
    parameters: int
    seconds: float
    flops: int
    """Training FLOPs: host and seeds forward and backward, shadow passes, validation and counterfactuals."""


@dataclass
class JobResult:
    task: str
    seed: int
    variants: dict[str, Figures]
    architecture: dict[str, str]
    #: Shadow contributions measured after SHADOW_AFTER_EPOCHS or more epochs of TRAINING.
    late_shadow: list[float] = field(default_factory=list)
    #: (predicted, measured) of every seed that was blended in.
    predictions: list[tuple[float, float]] = field(default_factory=list)


def _figures(outcome: EpisodeOutcome) -> Figures:
    return Figures(outcome.final_accuracy, outcome.final_loss, outcome.parameters, outcome.seconds,
                   outcome.flops.total)


def late_shadow_contributions(history: Sequence[Event], after: int) -> list[float]:
    """Shadow contributions measured when their seed had been TRAINING for at least `after` epochs."""
    training_since: dict[tuple[int, str], int] = {}
    found = []
    for event in history:
        if isinstance(event, StageTransition):
            key = (event.env_id, event.slot)
            if event.to_stage == "training":
                training_since[key] = event.epoch
            else:
                training_since.pop(key, None)
        elif isinstance(event, CounterfactualMeasured):
            for slot, points in event.contributions:
                start = training_since.get((event.env_id, slot))
                if start is not None and SHADOW_PREFIX + slot in event.configs and event.epoch - start >= after:
                    found.append(points)
    return found


def run_job(job: Job) -> JobResult:
    """The three episodes of one (task, seed)."""
    torch.set_num_threads(job.threads)
    task = load_task(job.task, seed=job.seed, max_train_samples=job.max_train_samples)
    optimizer = dataclasses.replace(task_optimizer_config(job.task), schedule=job.schedule)
    config = EpisodeConfig(max_epochs=job.epochs, shadow_fraction=job.shadow_fraction, optimizer=optimizer)
    episode = MorphogenesisEpisode(task, config, seed=job.seed)
    episode.reset()
    grown = run_episode(episode, HeuristicController(episode.action_space, task.topology))
    baseline = run_episode(MorphogenesisEpisode(task, config, seed=job.seed), NoGrowthController())
    assert episode.model is not None
    architecture = episode.model.architecture()
    if architecture:
        built = MorphogenesisEpisode(task, config, seed=job.seed, architecture=architecture)
        from_scratch = run_episode(built, NoGrowthController())
    else:
        from_scratch = baseline
    predictions = [(s.predicted_contribution, s.contribution) for s in grown.stories
                   if s.predicted_contribution is not None and s.contribution is not None]
    return JobResult(
        task=job.task, seed=job.seed, architecture=architecture,
        variants={"grown": _figures(grown), "no growth": _figures(baseline), "from scratch": _figures(from_scratch)},
        late_shadow=late_shadow_contributions(episode.history, SHADOW_AFTER_EPOCHS),
        predictions=predictions,  # type: ignore[arg-type]  # both checked not None above
    )


def print_task_table(task: str, results: Sequence[JobResult]) -> None:
    optimizer = task_optimizer_config(task)
    print(f"\n{task} ({len(results)} seeds; host {DEFAULT_HOST_SIZES[task]}; {optimizer.name} host lr "
          f"{optimizer.host_lr:g}, seed lr {optimizer.seed_lr:g})")
    print(f"  {'':14}{'val accuracy':>18}{'val loss':>18}{'parameters':>14}{'FLOPs':>12}{'seconds':>14}")
    for variant in VARIANTS:
        figures = [r.variants[variant] for r in results]
        accuracy = format_mean_std([f.accuracy for f in figures], ">10.2f", "<5.2f")
        loss = format_mean_std([f.loss for f in figures], ">10.4f", "<5.3f")
        parameters = statistics.fmean(f.parameters for f in figures)
        flops = statistics.fmean(f.flops for f in figures)
        seconds = format_mean_std([f.seconds for f in figures], ">8.1f", "<4.1f")
        print(f"  {variant:14}{accuracy}{loss}{parameters:>14,.0f}{format_flops(flops):>12}{seconds}")
    ratios = [r.variants["grown"].flops / r.variants["from scratch"].flops for r in results]
    print(f"  training FLOPs, grown / from scratch: {statistics.fmean(ratios):.2f} (mean over seeds)")
    for other in ("no growth", "from scratch"):
        differences = [r.variants["grown"].accuracy - r.variants[other].accuracy for r in results]
        print(f"  grown - {other}: {format_mean_error(differences)} points (mean ± standard error)")
    late = [value for r in results for value in r.late_shadow]
    if late:
        print(f"  shadow contribution after >= {SHADOW_AFTER_EPOCHS} TRAINING epochs: {format_mean_error(late)} "
              f"points over {len(late)} measurements")
    pairs = [pair for r in results for pair in r.predictions]
    if pairs:
        predicted = statistics.fmean(p for p, _ in pairs)
        measured = statistics.fmean(m for _, m in pairs)
        print(f"  blended seeds: predicted (shadow) {predicted:+.2f}, measured {measured:+.2f} points, "
              f"mean over {len(pairs)} seeds")
    grown_with = sum(1 for r in results if r.architecture)
    print(f"  seeds grown into the final model in {grown_with} of {len(results)} runs: "
          + "; ".join(", ".join(f"{b}@{s}" for s, b in r.architecture.items()) or "-" for r in results))


def main(argv: Sequence[str] | None = None) -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="digits,mnist1d,text")
    parser.add_argument("--seeds", type=count, default=5)
    parser.add_argument("--epochs", type=count, default=30)
    parser.add_argument("--text-train-samples", type=count, default=1000,
                        help="training windows of `text` (validation is always whole)")
    parser.add_argument("--jobs", type=count, default=2, help="worker processes")
    parser.add_argument("--threads", type=count, default=1, help="torch threads per worker")
    parser.add_argument("--json", type=output_file, default=None,
                        help="also write every episode's figures to this file")
    parser.add_argument("--shadow-fraction", type=float, default=EpisodeConfig.shadow_fraction,
                        help="fraction of each batch the TRAINING seeds' shadow pass runs on")
    parser.add_argument("--schedule", default="constant", choices=SCHEDULES,
                        help="learning-rate schedule of host and seeds over each episode")
    args = parser.parse_args(argv)
    tasks = [name.strip() for name in args.tasks.split(",") if name.strip()]
    unknown = [task for task in tasks if task not in TASK_NAMES]
    if unknown or not tasks:
        parser.error(f"--tasks: {unknown[0]!r} is not a built-in task; valid: {', '.join(TASK_NAMES)}" if unknown
                     else "--tasks: give at least one task")
    jobs = [Job(task, seed, args.epochs, args.threads, args.text_train_samples if task == "text" else None,
                args.shadow_fraction, args.schedule)
            for task in tasks for seed in range(args.seeds)]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run_job, jobs))
    print(f"growth benchmark: {args.epochs} epochs per episode, {args.schedule} learning rate, seeds "
          f"0..{args.seeds - 1}, shadow pass on "
          f"{args.shadow_fraction:g} of each batch, "
          f"{args.jobs} processes x {args.threads} thread(s), {time.perf_counter() - started:.0f} s in all")
    for task in tasks:
        print_task_table(task, [r for r in results if r.task == task])
    if args.json is not None:
        with open(args.json, "w") as handle:
            json.dump([asdict(r) for r in results], handle, indent=2)


if __name__ == "__main__":
    run_script(main)
