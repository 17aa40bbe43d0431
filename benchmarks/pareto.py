"""Growth against every fixed size: accuracy per parameter and per training FLOP, on mnist1d and digits.

Per task, two kinds of job, each over `--seeds` seeds and `--epochs` epochs (`--threads` torch threads per
process, `--jobs` processes):
- fixed: a sweep of hosts of the task's family (`--blocks` x `--widths`: n_blocks x base_channels of the
  task's CNNHost or Conv1dHost), trained without growth;
- grown: the heuristic growing the small hosts (`--grow-from`, default the task's default host 2x8, 2x4,
  and 3x4: on mnist1d a third block is worth more than width, which growth adds), and each grown model's
  final architecture (host + every seed blended in at the end) trained from scratch for the same epochs.

`--config FILE` grows with a run config's `[heuristic]` and `[episode]` settings (a file, or a preset's name such
as `grow_for_compute`; the episode length stays `--epochs`), its jobs kept apart from the default heuristic's in
`--results` by the config's name (a file's stem); `--first-seed` starts the seeds elsewhere than 0 (fresh seeds
for a setting tuned on the first ones).

Every job's figures go to `--results` (JSON lines) as soon as it ends, and a job already there is not run
again: the sweep can be stopped and resumed, or run task by task (`--tasks`) or kind by kind (`--only`).

Printed per task: each point's accuracy (mean ± std), parameters, training FLOPs (host and seeds forward and
backward, shadow passes, validation and counterfactuals) and wall time; which grown points a fixed host
dominates; the grown run's training FLOPs against its final architecture's from scratch. A fixed host
*dominates* a grown point in (accuracy, parameters) when it has at most as many parameters and its mean
accuracy is higher by more than the standard error of the difference (sqrt(se_a^2 + se_b^2)); likewise in
(accuracy, training FLOPs). `--plot DIR` writes one SVG per task and cost (accuracy against log10 of
parameters, and of training FLOPs; `--plot-configs` draws other configs' grown points from `--results` too).
Wall times come from processes sharing the machine: compare them only within one run of this script.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from arguments import BenchmarkParser, count, output_file, run_script, whole_numbers
from morphogen.commands.run import RunConfig
from morphogen.config import ConfigError, build_config, read_config_source
from morphogen.control.controller import NoGrowthController
from morphogen.control.heuristic import HeuristicConfig, HeuristicController
from morphogen.data import load_task
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.play import EpisodeOutcome, run_episode
from morphogen.paired_statistics import format_spread, sample_std, standard_error
from morphogen.ui.svg import Series, line_chart
from morphogen.ui.units import format_flops

#: The built-in tasks whose hosts the sweep sizes (n_blocks x base_channels) and that need no data directory.
TASKS = ("mnist1d", "digits")
#: Accuracy points within which a grown run counts as as accurate as its final architecture from scratch.
EQUAL_ACCURACY = 0.3
#: The grown run's training FLOPs the issue asks for, as a fraction of its final architecture's from scratch.
FLOPS_TARGET = 0.7
#: Standalone SVG charts need the styles the HTML report gives them.
CHART_STYLE = ("<style>text { font-family: sans-serif; } .title { font-size: 13px; font-weight: 600; "
               "text-anchor: middle; } .tick { font-size: 10px; fill: #616161; } .label { font-size: 11px; "
               "fill: #424242; } .legend { font-size: 11px; fill: #212121; } .grid { stroke: #eeeeee; } "
               ".axis { stroke: #9e9e9e; }</style>")


@dataclass(frozen=True)
class Job:
    kind: str
    """"fixed" (the host without growth) or "grown" (grown by the heuristic, and its final architecture)."""
    task: str
    blocks: int
    width: int
    seed: int
    epochs: int
    threads: int
    config: str = ""
    """A run config file whose `[heuristic]` and `[episode]` settings a grown job uses; "" for the defaults."""

    @property
    def key(self) -> str:
        kind = f"{self.kind}[{Path(self.config).stem}]" if self.config else self.kind
        return f"{kind}/{self.task}/{self.blocks}x{self.width}/seed{self.seed}/epochs{self.epochs}"


@dataclass(frozen=True)
class Point:
    accuracy: float
    parameters: int
    flops: int
    seconds: float


def _point(outcome: EpisodeOutcome) -> Point:
    return Point(outcome.final_accuracy, outcome.parameters, outcome.flops.total, outcome.seconds)


def run_job(job: Job) -> dict[str, object]:
    """One job's figures: {"key", "point"} for a fixed host; grown and from-scratch points for a grown one."""
    torch.set_num_threads(job.threads)
    task = load_task(job.task, seed=job.seed, host={"n_blocks": job.blocks, "base_channels": job.width})
    config, heuristic = EpisodeConfig(max_epochs=job.epochs), HeuristicConfig()
    if job.config:
        settings = build_config(RunConfig, read_config_source(job.config))
        config, heuristic = dataclasses.replace(settings.episode, max_epochs=job.epochs), settings.heuristic
    episode = MorphogenesisEpisode(task, config, seed=job.seed)
    if job.kind == "fixed":
        return {"key": job.key, "job": asdict(job), "point": asdict(_point(run_episode(episode,
                                                                                       NoGrowthController())))}
    episode.reset()
    grown = run_episode(episode, HeuristicController(episode.action_space, task.topology, heuristic))
    assert episode.model is not None
    architecture = episode.model.architecture()
    scratch = None
    if architecture:
        built = MorphogenesisEpisode(task, config, seed=job.seed, architecture=architecture)
        scratch = asdict(_point(run_episode(built, NoGrowthController())))
    return {"key": job.key, "job": asdict(job), "point": asdict(_point(grown)), "from_scratch": scratch,
            "architecture": architecture}


def read_results(path: Path) -> dict[str, dict[str, object]]:
    """The results already written, by job key (a damaged last line, from a killed run, is skipped)."""
    results: dict[str, dict[str, object]] = {}
    if not path.exists():
        return results
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        results[record["key"]] = record
    return results


def run_missing(jobs: Sequence[Job], path: Path, processes: int) -> None:
    """Run the jobs not in `path` yet, appending each result as it ends."""
    done = read_results(path)
    missing = [job for job in jobs if job.key not in done]
    print(f"{len(jobs) - len(missing)} of {len(jobs)} jobs already in {path}; running {len(missing)}", flush=True)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=processes) as pool, path.open("a") as file:
        for count, record in enumerate(pool.map(run_job, missing), start=1):
            file.write(json.dumps(record) + "\n")
            file.flush()
            print(f"  [{count}/{len(missing)}] {record['key']} ({time.perf_counter() - started:.0f} s)", flush=True)


@dataclass(frozen=True)
class Summary:
    """Mean and spread over seeds of one host, fixed or grown."""

    label: str
    accuracy: float
    #: The sample std and standard error of the accuracy over seeds; None for one seed, which has no spread.
    accuracy_std: float | None
    accuracy_error: float | None
    parameters: float
    flops: float
    seconds: float
    seeds: int


def summarize(label: str, points: Sequence[Point]) -> Summary:
    accuracies = [p.accuracy for p in points]
    return Summary(label, statistics.fmean(accuracies), sample_std(accuracies), standard_error(accuracies),
                   statistics.fmean(p.parameters for p in points), statistics.fmean(p.flops for p in points),
                   statistics.fmean(p.seconds for p in points), len(points))


def dominates(fixed: Summary, grown: Summary, cost: str) -> bool:
    """Whether `fixed` costs at most what `grown` costs (`cost`: "parameters" or "flops") and is more accurate by
    more than the standard error of the difference; never where either has one seed, with no error to judge by."""
    if fixed.accuracy_error is None or grown.accuracy_error is None:
        return False
    error = math.sqrt(fixed.accuracy_error ** 2 + grown.accuracy_error ** 2)
    return getattr(fixed, cost) <= getattr(grown, cost) and fixed.accuracy - grown.accuracy > error


def _points(records: Iterable[dict[str, object]], field: str = "point") -> list[Point]:
    return [Point(**record[field]) for record in records if record.get(field)]  # type: ignore[arg-type]


def report_task(task: str, results: dict[str, dict[str, object]], args: argparse.Namespace) -> None:
    """The table, the dominance check and the FLOPs ratio of one task; the plots when asked."""
    def records(kind: str, blocks: int, width: int, config: str = args.config) -> list[dict[str, object]]:
        return [r for r in results.values() if r["job"]["kind"] == kind and r["job"]["task"] == task  # type: ignore[index]
                # The fixed sweep with every seed it has; grown runs of this config and these seeds only.
                and (kind == "fixed" or (Path(r["job"].get("config", "")).stem == Path(config).stem  # type: ignore[index, attr-defined]
                                         and r["job"]["seed"] in range(args.first_seed, args.first_seed + args.seeds)))  # type: ignore[index]
                and r["job"]["blocks"] == blocks and r["job"]["width"] == width  # type: ignore[index]
                and r["job"]["epochs"] == args.epochs]  # type: ignore[index]

    fixed = [summarize(f"fixed {b}x{w}", _points(records("fixed", b, w)))
             for b in args.blocks for w in args.widths if records("fixed", b, w)]
    grown: list[Summary] = []
    scratch: list[Summary | None] = []
    ratios: list[list[tuple[float, float]]] = []
    for blocks, width in args.grow_from:
        found = records("grown", blocks, width)
        if not found:
            continue
        # A run that grew nothing has the host itself as its final architecture: its fixed run of the same seed.
        host_runs = {r["job"]["seed"]: r for r in records("fixed", blocks, width)}  # type: ignore[index]
        pairs = [(Point(**r["point"]), Point(**r["from_scratch"]) if r.get("from_scratch")  # type: ignore[arg-type]
                  else Point(**host_runs[r["job"]["seed"]]["point"]))  # type: ignore[index, arg-type]
                 for r in found if r.get("from_scratch") or r["job"]["seed"] in host_runs]  # type: ignore[index]
        grown.append(summarize(f"grown from {blocks}x{width}", _points(found)))
        # A run that grew nothing, with no fixed run of its host in --results, has no architecture to compare.
        scratch.append(summarize("  its final architecture from scratch", [built for _, built in pairs])
                       if pairs else None)
        ratios.append([(point.flops / built.flops, point.accuracy - built.accuracy) for point, built in pairs])
    print(f"\n{task} ({args.epochs} epochs; accuracy mean ± std over seeds)")
    print(f"  {'':40}{'accuracy':>16}{'parameters':>12}{'FLOPs':>14}{'seconds':>9}")
    for row in [*fixed, *(row for pair in zip(grown, scratch, strict=True) for row in pair if row is not None)]:
        spread = format_spread(row.accuracy_std, "<4.2f")
        print(f"  {row.label:40}{row.accuracy:>9.2f} ± {spread}{row.parameters:>12,.0f}"
              f"{format_flops(row.flops):>14}{row.seconds:>9.1f}")
    for point, pairs in zip(grown, ratios, strict=True):
        if point.accuracy_error is None:
            print(f"  {point.label}: one seed, no spread to judge by whether a fixed host dominates it")
        for cost, name in (("parameters", "parameters"), ("flops", "training FLOPs")):
            if point.accuracy_error is None:
                break
            beaten = [f.label for f in fixed if dominates(f, point, cost)]
            print(f"  {point.label}: dominated in (accuracy, {name}) by {', '.join(beaten) if beaten else 'none'}")
        if pairs:
            ratio = statistics.fmean(r for r, _ in pairs)
            # Accuracies are multiples of 1/validation-size points: round away the float error of their means.
            difference = round(statistics.fmean(d for _, d in pairs), 9)
            met = ratio <= FLOPS_TARGET and difference >= -EQUAL_ACCURACY
            print(f"  {point.label}: training FLOPs / final architecture from scratch {ratio:.2f} (target <= "
                  f"{FLOPS_TARGET}), accuracy difference {difference:+.2f} points (within {EQUAL_ACCURACY}: "
                  f"{'yes' if difference >= -EQUAL_ACCURACY else 'no'}): {'met' if met else 'not met'}")
    if args.plot:
        # Grown points of other configs (--plot-configs) join the charts, labelled by the config's name.
        others = [summarize(f"grown from {b}x{w} ({Path(config).stem if config else 'default'})", points)
                  for config in args.plot_configs for b, w in args.grow_from
                  if (points := _points(records("grown", b, w, config)))]
        write_plots(task, fixed, grown + others, args)


def write_plots(task: str, fixed: Sequence[Summary], grown: Sequence[Summary], args: argparse.Namespace) -> None:
    """Accuracy against log10 parameters and log10 training FLOPs: a line per block count, a dot per grown host."""
    folder = Path(args.plot)
    folder.mkdir(parents=True, exist_ok=True)
    for cost, name in (("parameters", "parameters"), ("flops", "training FLOPs")):
        series = [Series(f"fixed, {blocks} blocks",
                         tuple(sorted((math.log10(getattr(s, cost)), s.accuracy) for s in fixed
                                      if s.label.startswith(f"fixed {blocks}x"))))
                  for blocks in args.blocks]
        series += [Series(s.label, ((math.log10(getattr(s, cost)), s.accuracy),)) for s in grown]
        chart = line_chart(series, title=f"{task}: accuracy against {name} ({args.epochs} epochs)",
                           x_label=f"log10 {name}", y_label="validation accuracy (%)")
        chart = chart.replace(">", ">" + CHART_STYLE, 1)  # right after the opening <svg ...> tag
        (folder / f"pareto_{task}_{cost}.svg").write_text(chart)


def host_sizes(text: str) -> list[tuple[int, int]]:
    """`--grow-from`: comma-separated BLOCKSxWIDTH host sizes, each number >= 1."""
    sizes = []
    for size in (item.strip() for item in text.split(",") if item.strip()):
        blocks, _, width = size.partition("x")
        if not (blocks.isdigit() and width.isdigit() and int(blocks) >= 1 and int(width) >= 1):
            raise argparse.ArgumentTypeError(f"{size!r} is not BLOCKSxWIDTH (as 2x8), each at least 1")
        sizes.append((int(blocks), int(width)))
    return sizes


def check_arguments(tasks: Sequence[str], config: str) -> None:
    """A task the sweep cannot size, or a config that does not load, is one line and exit 2 now, not a traceback
    from every worker process."""
    unknown = [task for task in tasks if task not in TASKS]
    problem = ""
    if unknown:
        problem = (f"--tasks: {unknown[0]!r} is not one of {', '.join(TASKS)}: pareto.py sweeps the sizes of those "
                   "built-in hosts; to compare a model of your own with other sizes of it, run `morphogen run --task "
                   "module:function --seeds N --compare NAME=module:function`")
    elif config:
        try:
            build_config(RunConfig, read_config_source(config))
        except ConfigError as error:
            problem = f"--config: {error}"
    if problem:
        print(f"pareto.py: error: {problem}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="mnist1d,digits")
    parser.add_argument("--blocks", type=whole_numbers(), default="2,3", help="n_blocks of the fixed hosts")
    parser.add_argument("--widths", type=whole_numbers(), default="4,6,8,12,16,24,32",
                        help="base_channels of the fixed hosts")
    parser.add_argument("--grow-from", type=host_sizes, default="2x8,2x4,3x4",
                        help="hosts the heuristic grows (blocks x width)")
    parser.add_argument("--only", choices=("fixed", "grown"), help="run one kind of job only")
    parser.add_argument("--seeds", type=count, default=5)
    parser.add_argument("--first-seed", type=int, default=0, help="the first of the --seeds seeds")
    parser.add_argument("--config", default="", help="run config file or preset whose [heuristic] and [episode] "
                        "settings the grown jobs use (default: the heuristic's defaults)")
    parser.add_argument("--epochs", type=count, default=30)
    parser.add_argument("--jobs", type=count, default=2, help="worker processes (at most 2 on a shared machine)")
    parser.add_argument("--threads", type=count, default=1, help="torch threads per worker")
    parser.add_argument("--results", type=output_file, default="benchmarks/results/pareto.jsonl",
                        help="JSON lines file of every job's figures")
    parser.add_argument("--plot", default=None, help="folder for the SVG charts (none when left out)")
    parser.add_argument("--plot-configs", default="", help="comma-separated config files or presets (\"\" for the "
                        "defaults) whose grown points --results holds, drawn on the charts too")
    parser.add_argument("--report-only", action="store_true", help="print the tables from --results, run nothing")
    args = parser.parse_args(argv)
    args.plot_configs = [name.strip() for name in args.plot_configs.split(",")] if args.plot_configs else []
    tasks = [name.strip() for name in args.tasks.split(",") if name.strip()]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    check_arguments(tasks, args.config)
    jobs = []
    for task in tasks:
        if args.only in (None, "fixed"):
            jobs += [Job("fixed", task, b, w, seed, args.epochs, args.threads) for b in args.blocks
                     for w in args.widths for seed in seeds]
        if args.only in (None, "grown"):
            jobs += [Job("grown", task, b, w, seed, args.epochs, args.threads, args.config)
                     for b, w in args.grow_from for seed in seeds]
    path = Path(args.results)
    if args.report_only and not path.is_file():
        parser.error(f"--results: no results file {path} to report (run the sweep first, without --report-only)")
    if not args.report_only:
        run_missing(jobs, path, args.jobs)
    results = read_results(path)
    for task in tasks:
        report_task(task, results, args)


if __name__ == "__main__":
    run_script(main)
