"""What measuring the seeds costs: the share of a grown run's FLOPs spent on shadow passes and counterfactuals.

Grows the CIFAR-layout ResNet of `benchmarks/your_model.py` (ResNet-20 at width 4, 17,534 parameters, slots
after its three stages) on digits resized to 32x32x3 with the default heuristic, once per setting:
- `every epoch, whole batch`: every counterfactual configuration every epoch, the shadow pass on every sample;
- `for decisions, 3/4 batch` (the default): only the configurations a gate or the heuristic reads next, the
  shadow pass on 3/4 of each batch.
Both run the default heuristic, which also measures growth signals (`probe`) when a seed could be germinated.
Printed per setting (mean over seeds): final accuracy, total FLOPs, and the shares of training, shadow
passes, validation, counterfactual configurations and growth-signal probes; FLOPs are counted, not timed, so
the shares do not depend on the machine's load.
"""

from __future__ import annotations

import io
import statistics
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch

import morphogen
from arguments import BenchmarkParser, count, run_script
from morphogen.env.counterfactual import CounterfactualSchedule
from morphogen.env.episode import EpisodeConfig
from morphogen.ui.units import format_flops
from your_model import task_and_host

SETTINGS = {
    "every epoch, whole batch": (CounterfactualSchedule.EVERY_EPOCH, 1.0),
    "for decisions, 3/4 batch": (CounterfactualSchedule.FOR_DECISIONS, 0.75),
}


@dataclass(frozen=True)
class Result:
    setting: str
    seed: int
    accuracy: float
    flops: dict[str, int]
    architecture: dict[str, str]


def run_job(job: tuple[str, int, int]) -> Result:
    setting, seed, epochs = job
    torch.set_num_threads(1)
    task, host = task_and_host("resnet_by_seeds")  # slots after its three stages, grown seed by seed
    schedule, fraction = SETTINGS[setting]
    config = morphogen.RunConfig(episode=EpisodeConfig(max_epochs=epochs, counterfactuals=schedule,
                                                       shadow_fraction=fraction))
    with tempfile.TemporaryDirectory() as root:
        result = morphogen.grow(task, host, epochs=epochs, seed=seed, run_dir=f"{root}/run", baseline=False,
                                from_scratch=False, config=config, out=io.StringIO())
    return Result(setting, seed, result.grown.final_accuracy, result.grown.flops.as_dict(),
                  result.model.architecture())


def print_table(results: Sequence[Result]) -> None:
    print(f"  {'setting':28}{'accuracy':>10}{'FLOPs':>14}{'training':>10}{'shadow':>9}{'validation':>12}"
          f"{'counterf.':>11}{'probe':>8}{'measuring':>11}")
    for setting in SETTINGS:
        rows = [r for r in results if r.setting == setting]
        total = statistics.fmean(r.flops["total"] for r in rows)
        shares = {key: statistics.fmean(r.flops[key] / r.flops["total"] for r in rows)
                  for key in ("training", "shadow", "validation", "counterfactual", "probe")}
        accuracy = statistics.fmean(r.accuracy for r in rows)
        print(f"  {setting:28}{accuracy:>9.2f}%{format_flops(total):>14}{shares['training']:>10.1%}"
              f"{shares['shadow']:>9.1%}{shares['validation']:>12.1%}{shares['counterfactual']:>11.1%}"
              f"{shares['probe']:>8.1%}{shares['shadow'] + shares['counterfactual'] + shares['probe']:>11.1%}")
    for result in results:
        grown = ", ".join(f"{b}@{s}" for s, b in result.architecture.items()) or "-"
        print(f"  {result.setting}, seed {result.seed}: {grown}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=count, default=1)
    parser.add_argument("--epochs", type=count, default=30)
    parser.add_argument("--jobs", type=count, default=2, help="worker processes, one torch thread each")
    args = parser.parse_args(argv)
    jobs = [(setting, seed, args.epochs) for setting in SETTINGS for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(run_job, jobs))
    print(f"measurement cost: ResNet-20 (width 4) on digits 32x32x3, {args.epochs} epochs, seeds "
          f"0..{args.seeds - 1}, heuristic")
    print_table(results)


if __name__ == "__main__":
    run_script(main)
