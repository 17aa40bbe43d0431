"""Growth of a language model under a fixed training-FLOP budget: does growing 2 -> 4 layers, or growing its MLPs
wider, save compute?

The `text` task on the whole standard-library corpus (every training window), by default at the host's width
(32, 4 heads) and AdamW at the task's learning rate (`--width`, `--heads`, `--lr` change them; `--text-file`
trains on another corpus; `--device` says where the runs train), six variants per seed:
- `4 layers`: a 4-layer host trained from scratch, never growing;
- `2 layers`: the default 2-layer host, never growing;
- `2 -> 4 zero`: the 2-layer host under the heuristic with `depth_blueprint = "block"`: when its validation
  loss slows down it GROWs a zero-initialised whole block into both slots (one after each layer), each
  trained with the host from then on (fresh optimizer state, learning rate re-warmed);
- `2 -> 4 copy`: the same with `depth_blueprint = "block_copy"`: each new block starts as a copy of the
  trained layer before it (stacking, Gstack) and is blended in from alpha 0;
- `2 + MLPs x2` and `2 + MLPs x4`: growth by width instead, at the same moment: `depth_blueprint = "wider"`
  (`"wider_inside"`) grafts new hidden neurons into the MLP of both layers, as many as it has (three times as
  many), their output weights zero at birth, so each MLP is twice (four times) as wide from then on.

Every run trains until its training FLOPs reach the budget (`--budget-steps` training steps of the 4-layer
model). Training FLOPs are what the episode's own account charges (`MorphogenesisEpisode.compute`: forward
and backward of the model's output path, plus the shadow pass while a seed trains behind the host), counted
once per execution plan by `morphogen.core.flops.FlopCounter`; validation passes are not training and are
not counted. The controller acts once per `--chunk` batches
(the episode's epoch here), after a validation pass: the points of the curves.

Printed: each variant's final validation loss (mean ± std over seeds), the training FLOPs at which each
grown model first reaches the validation loss the 4-layer model from scratch ends the budget at (mean of
its seeds), as a fraction of the budget, and when growth happened. `--svg FILE` draws validation loss
against training FLOPs (mean over seeds). Each (variant, seed) writes `OUT/<variant>-<seed>.json` as it
finishes; a rerun skips those already there, so an interrupted benchmark resumes. `--report` runs nothing and
prints the table of the records in `--out` (made elsewhere, on a GPU say).
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import statistics
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from arguments import BenchmarkParser, count, run_script
from morphogen.control.controller import NoGrowthController
from morphogen.control.heuristic import HeuristicConfig, HeuristicController
from morphogen.data import DEFAULT_HOST_SIZES, Task, load_task
from morphogen.data.user import task_on_device
from morphogen.env.actions import Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.optimizer import OptimizerConfig, task_optimizer_config
from morphogen.env.play import Controller
from morphogen.inputs import Inputs, InputSpec
from morphogen.paired_statistics import format_mean_std, format_spread, sample_std
from morphogen.ui.svg import Series, line_chart


@dataclass(frozen=True)
class Variant:
    name: str
    layers: int
    """Layers of the host it starts from (one slot after each)."""
    depth_blueprint: str | None
    """What the heuristic grows by depth; None never grows."""


VARIANTS = (
    Variant("4 layers", 4, None),
    Variant("2 layers", 2, None),
    Variant("2 -> 4 zero", 2, "block"),
    Variant("2 -> 4 copy", 2, "block_copy"),
    Variant("2 + MLPs x2", 2, "wider"),
    Variant("2 + MLPs x4", 2, "wider_inside"),
)
SCRATCH, SMALL = VARIANTS[0].name, VARIANTS[1].name
GROWN = tuple(variant.name for variant in VARIANTS[2:])


@dataclass(frozen=True)
class Job:
    variant: Variant
    seed: int
    budget_steps: int
    chunk: int
    threads: int
    out: str
    width: int = DEFAULT_HOST_SIZES["text"]["d_model"]
    heads: int = DEFAULT_HOST_SIZES["text"]["n_heads"]
    device: str = "cpu"
    lr: float | None = None
    """AdamW learning rate of host and seeds (None: the task's)."""
    grow_at: float | None = None
    """Grow once this fraction of the budget is spent (None: when the heuristic's loss signal says)."""
    text_file: str | None = None
    """The corpus (None: the task's default, the standard library's top-level sources)."""


@dataclass
class Point:
    flops: float
    """Training FLOPs spent so far."""
    loss: float
    """Validation loss, nats per character."""
    accuracy: float
    parameters: int


@dataclass
class RunRecord:
    variant: str
    seed: int
    budget_flops: float
    points: list[Point]
    growths: list[float]
    """Training FLOPs spent at each GROW of the heuristic (a pruned block's slot may be grown into again)."""
    architecture: dict[str, str]
    seconds: float


def endless_batches(task: Task, batch_size: int, generator: torch.Generator) -> Iterator[tuple[Inputs, Tensor]]:
    """Pass after pass over the training windows, each pass in an order drawn from `generator`."""
    while True:
        yield from task.train.iterate_batches(batch_size, generator=generator)


def text_task(layers: int, width: int = DEFAULT_HOST_SIZES["text"]["d_model"],
              heads: int = DEFAULT_HOST_SIZES["text"]["n_heads"], device: str = "cpu",
              text_file: str | None = None) -> Task:
    """The `text` task on its whole corpus (`text_file`, or the default) on `device`, with a `layers`-layer host of
    `width` (d_model) and `heads` attention heads, and one slot after each layer."""
    task = load_task("text", text_file=text_file,
                     host={"n_layers": layers, "n_segments": layers, "d_model": width, "n_heads": heads})
    return task if device == "cpu" else task_on_device(task, device)


def text_optimizer(lr: float | None) -> OptimizerConfig:
    """The `text` task's optimizer, with host and seeds at `lr` when given."""
    return task_optimizer_config("text", None if lr is None else {"host_lr": lr, "seed_lr": lr})


def step_flops(episode: MorphogenesisEpisode, inputs: Inputs) -> int:
    """Training FLOPs of one batch like `inputs` in the episode's present plan, as its compute account charges it."""
    assert episode.model is not None
    return episode.flop_counter.training_step(episode.model, InputSpec.of(inputs)).total


def training_flops(episode: MorphogenesisEpisode) -> int:
    """What the episode has spent on training so far: its output path and its seeds' shadow passes."""
    return episode.compute.training + episode.compute.shadow


def host_step_flops(layers: int, width: int, heads: int, text_file: str | None = None) -> int:
    """Training FLOPs of one batch of the `layers`-layer host, before any growth (the corpus sets the vocabulary)."""
    task = text_task(layers, width, heads, text_file=text_file)
    episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=1), seed=0)
    episode.reset()
    inputs, _ = next(task.train.iterate_batches(task.batch_size, shuffle=False))
    return step_flops(episode, inputs)


def budget_flops(budget_steps: int, width: int, heads: int, text_file: str | None = None) -> float:
    """The budget: training FLOPs of `budget_steps` batches of the 4-layer host."""
    return float(budget_steps * host_step_flops(VARIANTS[0].layers, width, heads, text_file))


def growth_timing(depth_blueprint: str, job: Job, budget: float, max_epochs: int) -> HeuristicConfig:
    """The heuristic's settings: its defaults, or with `job.grow_at` a warm-up of the validations (epochs) the
    starting host needs to spend that fraction of the budget, then growth at once."""
    if job.grow_at is None:
        return HeuristicConfig(depth_blueprint=depth_blueprint)
    step = host_step_flops(job.variant.layers, job.width, job.heads, job.text_file)
    warmup = max(round(job.grow_at * budget / (job.chunk * step)), 1)
    return HeuristicConfig(depth_blueprint=depth_blueprint, warmup_epochs=warmup,
                           first_growth_by=min(warmup / max_epochs, 1.0))


def run_job(job: Job, budget: float) -> RunRecord:
    """One variant and seed: train in chunks until the training FLOPs reach `budget`, validating after each."""
    torch.set_num_threads(job.threads)
    started = time.perf_counter()
    variant = job.variant
    task = text_task(variant.layers, job.width, job.heads, job.device, job.text_file)
    small_step = budget / job.budget_steps / 2  # a lower bound of a 2-layer step: chunks enough for any variant
    config = EpisodeConfig(max_epochs=math.ceil(budget / (job.chunk * small_step)) + 1,
                           optimizer=text_optimizer(job.lr))
    episode = MorphogenesisEpisode(task, config, seed=job.seed)
    snapshot = episode.reset()
    assert episode.model is not None
    controller: Controller = NoGrowthController() if variant.depth_blueprint is None else HeuristicController(
        episode.action_space, task.topology, growth_timing(variant.depth_blueprint, job, budget, config.max_epochs))
    controller.reset()
    batches = endless_batches(task, episode.batch_size, episode.generator)
    growths: list[float] = []
    points = [Point(0.0, snapshot.val_loss, snapshot.val_accuracy, snapshot.active_parameters)]
    while training_flops(episode) < budget:
        action = controller.act(snapshot, episode.masks())
        succeeded, reason = episode.apply_action(action)
        if action.op is Op.GROW and succeeded:
            growths.append(float(training_flops(episode)))
        chunk = list(itertools.islice(batches, job.chunk))
        steps = math.ceil((budget - training_flops(episode)) / step_flops(episode, chunk[0][0]))
        episode.train_epoch(chunk[:steps])
        snapshot = episode.finish_epoch(action, succeeded, reason).snapshot
        points.append(Point(float(training_flops(episode)), snapshot.val_loss, snapshot.val_accuracy,
                            snapshot.active_parameters))
    record = RunRecord(variant.name, job.seed, budget, points, growths, episode.model.architecture(),
                       time.perf_counter() - started)
    path = Path(job.out) / record_name(variant.name, job.seed)
    path.write_text(json.dumps(asdict(record), indent=1) + "\n")
    return record


def record_name(variant: str, seed: int) -> str:
    return f"{variant.replace(' ', '').replace('->', '-to-')}-{seed}.json"


def load_record(path: Path) -> RunRecord:
    data = json.loads(path.read_text())
    data["points"] = [Point(**point) for point in data["points"]]
    return RunRecord(**data)


def flops_to_reach(points: Sequence[Point], target: float) -> float | None:
    """Training FLOPs at which the validation loss first reaches `target`, interpolated linearly between the two
    validations around the crossing; None when it never does."""
    for before, after in itertools.pairwise(points):
        if after.loss <= target:
            if before.loss <= target:
                return before.flops
            fraction = (before.loss - target) / (before.loss - after.loss)
            return before.flops + fraction * (after.flops - before.flops)
    return None


def loss_at(points: Sequence[Point], flops: float) -> float:
    """The validation loss at `flops`, interpolated linearly between validations."""
    for before, after in itertools.pairwise(points):
        if after.flops >= flops:
            fraction = (flops - before.flops) / (after.flops - before.flops) if after.flops > before.flops else 1.0
            return before.loss + fraction * (after.loss - before.loss)
    return points[-1].loss


def summarize(records: Sequence[RunRecord], target: float | None = None) -> list[str]:
    """The table's lines: final loss per variant, and FLOPs of the grown models to reach `target` (default: the
    final loss of the 4-layer model from scratch, mean over its seeds)."""
    by_variant = {variant.name: sorted((r for r in records if r.variant == variant.name), key=lambda r: r.seed)
                  for variant in VARIANTS}
    budget = records[0].budget_flops
    # Without the 4-layer runs there is no loss to reach: that column is left empty.
    given = target
    if target is None:
        target = statistics.fmean(r.points[-1].loss for r in by_variant[SCRATCH]) if by_variant[SCRATCH] else math.nan
    named = "4 layers' final loss" if given is None else "--target"
    reaching = "(no 4-layer run to reach)" if math.isnan(target) else f"{target:.4f} ({named})"
    lines = [f"| variant | final val loss (nats/char) | best val loss | final accuracy | parameters | FLOPs to reach "
             f"{reaching} | first GROW at | seconds |", "|---|---|---|---|---|---|---|---|"]
    for name, runs in by_variant.items():
        if not runs:
            continue
        loss = format_mean_std([r.points[-1].loss for r in runs], ".4f")
        # Below the final loss only where the model overfits its corpus within the budget.
        best = format_mean_std([min(point.loss for point in r.points) for r in runs], ".4f")
        accuracy = format_mean_std([r.points[-1].accuracy for r in runs])
        reached = [flops_to_reach(r.points, target) for r in runs]
        fractions = [value / budget for value in reached if value is not None]
        reach = "-" if name == SCRATCH or math.isnan(target) else (
            f"{format_mean_std(fractions)} x budget" if len(fractions) == len(runs)
            else f"{len(fractions)} of {len(runs)} seeds reach it" + (
                f" ({', '.join(f'{f:.2f}' for f in fractions)} x budget)" if fractions else ""))
        grew = [r.growths[0] / budget for r in runs if r.growths]
        again = sum(max(len(r.growths) - 1, 0) for r in runs)
        grew_text = (f"{statistics.fmean(grew):.2f} x budget" if grew else "-") + (
            f" (again in {again} run{'s' if again > 1 else ''})" if again else "")
        seconds = format_mean_std([r.seconds for r in runs], ".0f")
        lines.append(f"| {name} | {loss} | {best} | {accuracy}% | "
                     f"{statistics.fmean(r.points[-1].parameters for r in runs):,.0f} | {reach} | {grew_text} | "
                     f"{seconds} |")
    small = [r.points[-1].loss for r in by_variant[SMALL]]
    for name in GROWN:
        grown = [r.points[-1].loss for r in by_variant[name]]
        if grown and len(grown) == len(small):
            differences = [s - g for s, g in zip(small, grown, strict=True)]
            lines.append(f"\n{name} ends below 2 layers by {format_mean_std(differences, '+.4f', '.4f')} nats (paired "
                         f"by seed; seed-to-seed std of the two: {format_spread(sample_std(small), '.4f')}, "
                         f"{format_spread(sample_std(grown), '.4f')})")
    return lines


def mean_curve(runs: Sequence[RunRecord], grid: Sequence[float]) -> tuple[tuple[float, float], ...]:
    return tuple((flops, statistics.fmean(loss_at(r.points, flops) for r in runs)) for flops in grid)


def chart(records: Sequence[RunRecord]) -> str:
    """Validation loss against training FLOPs (in units of 1e12), each variant's mean over its seeds."""
    budget = records[0].budget_flops
    grid = [budget * i / 50 for i in range(12, 51)]  # from a quarter of the budget: the first losses dwarf the rest
    series = []
    for variant in VARIANTS:
        runs = [r for r in records if r.variant == variant.name]
        if runs:
            points = tuple((flops / 1e12, loss) for flops, loss in mean_curve(runs, grid))
            series.append(Series(f"{variant.name} ({len(runs)} seeds)", points, dashed=variant.depth_blueprint is None))
    return line_chart(series, title="text: validation loss vs training FLOPs",
                      x_label="training FLOPs (1e12)", y_label="validation loss (nats/char)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=count, default=3)
    parser.add_argument("--budget-steps", type=count, default=3000,
                        help="the training-FLOP budget, in training steps of the 4-layer model")
    parser.add_argument("--chunk", type=count, default=220, help="training batches between validations")
    parser.add_argument("--variants", default=",".join(v.name for v in VARIANTS),
                        help="comma-separated variant names (default: all four)")
    parser.add_argument("--width", type=count, default=DEFAULT_HOST_SIZES["text"]["d_model"],
                        help="d_model of every variant (default: the task's host)")
    parser.add_argument("--heads", type=count, default=DEFAULT_HOST_SIZES["text"]["n_heads"], help="attention heads")
    parser.add_argument("--device", default="cpu", help="where the models train (cpu, cuda, cuda:N)")
    parser.add_argument("--lr", type=float, default=None,
                        help="AdamW learning rate of every variant (default: the task's, 5e-3, chosen for width 32)")
    parser.add_argument("--grow-at", type=float, default=None,
                        help="grow once this fraction of the budget is spent (default: when the loss slows down)")
    parser.add_argument("--target", type=float, default=None,
                        help="the loss whose FLOPs to reach are reported (default: the 4-layer runs' final loss)")
    parser.add_argument("--text-file", default=None,
                        help="a UTF-8 corpus to train on (default: the standard library's top-level sources, ~1e6 "
                             "characters, which a model as wide as 128 overfits within the budget)")
    parser.add_argument("--jobs", type=count, default=2, help="worker processes")
    parser.add_argument("--threads", type=count, default=1, help="torch threads per worker")
    parser.add_argument("--out", default="runs/lm_growth",
                        help="directory of the per-run records (resumable; one per width, lr, corpus and device)")
    parser.add_argument("--report", action="store_true",
                        help="run nothing: print the table (and --svg) of the records already in --out")
    parser.add_argument("--svg", default=None, help="write the chart of validation loss against FLOPs here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    chosen = {name.strip() for name in args.variants.split(",")}
    unknown = chosen - {v.name for v in VARIANTS}
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(sorted(unknown))}; valid: {', '.join(v.name for v in VARIANTS)}")
    if args.grow_at is not None and not 0 < args.grow_at < 1:
        parser.error(f"--grow-at: a fraction of the budget between 0 and 1, got {args.grow_at:g}")
    if args.lr is not None and not args.lr > 0:
        parser.error(f"--lr: must be > 0, got {args.lr:g}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out: {out} is a file; give the directory of the per-run records")
    if args.report:
        problem = report(out, args.target, args.svg)
        if problem:
            parser.error(problem)
        return
    out.mkdir(parents=True, exist_ok=True)
    budget = budget_flops(args.budget_steps, args.width, args.heads, args.text_file)
    jobs = [Job(variant, seed, args.budget_steps, args.chunk, args.threads, str(out), args.width, args.heads,
                args.device, args.lr, args.grow_at, args.text_file)
            for seed in range(args.seeds) for variant in VARIANTS if variant.name in chosen
            and not (out / record_name(variant.name, seed)).exists()]
    started = time.perf_counter()
    # CUDA cannot be used in a forked child of a process that touched it: workers of a GPU run are spawned.
    context = multiprocessing.get_context("fork" if args.device == "cpu" else "spawn")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as pool:
        for record in pool.map(run_job, jobs, itertools.repeat(budget)):
            print(f"{record.variant} seed {record.seed}: final loss {record.points[-1].loss:.4f}, "
                  f"{record.seconds:.0f} s", flush=True)
    records = [load_record(path) for path in sorted(out.glob("*.json"))]
    records = [r for r in records if r.budget_flops == budget and r.seed < args.seeds]
    optimizer = text_optimizer(args.lr)
    host = {**DEFAULT_HOST_SIZES["text"], "d_model": args.width, "n_heads": args.heads}
    corpus = args.text_file or "the default corpus"
    print(f"\nlm growth: text on {corpus} (all of it) on {args.device}, host {host} (layers as named), "
          f"{optimizer.name} lr {optimizer.host_lr:g}; budget {budget:.3g} training FLOPs ({args.budget_steps} steps "
          f"of 4 layers), validation every {args.chunk} batches; {args.jobs} processes x {args.threads} thread(s), "
          f"{time.perf_counter() - started:.0f} s for {len(jobs)} new runs\n")
    print_results(records, args.target, args.svg)


def print_results(records: Sequence[RunRecord], target: float | None, svg: str | None) -> None:
    """The table of `records`, and their chart written to `svg` when given."""
    print("\n".join(summarize(records, target)))
    if svg is not None:
        Path(svg).write_text(chart(records))


def report(out: Path, target: float | None, svg: str | None) -> str | None:
    """Print the table of the records in `out` as they are (for runs made elsewhere, on a GPU say); what is wrong
    with `out` instead, if anything."""
    records = [load_record(path) for path in sorted(out.glob("*.json"))]
    if not records:
        return f"no records (*.json) in {out}"
    budgets = {r.budget_flops for r in records}
    if len(budgets) > 1:
        return f"{out} holds runs of {len(budgets)} budgets; one directory per width, lr and corpus"
    print(f"lm growth: {len(records)} records in {out}, budget {records[0].budget_flops:.3g} training FLOPs\n")
    print_results(records, target, svg)
    return None


if __name__ == "__main__":
    run_script(main)
