"""What worker processes gain: `morphogen eval --jobs N` and `morphogen run --seeds S --jobs N`, each timed in one
process against N worker processes of one thread each.

Both ways play the same episodes (for `eval`: the shipped policy, the heuristic and no growth on the same seeds; for
`run --seeds`: each seed's grown run, its no-growth twin and its final architecture from scratch) and are checked to
give the same figures; the repeats alternate the two, so that a drift in machine load hits both alike. The table
gives each setting's median seconds and the speed-up (one process / N processes). Worker start-up (a spawned
Python importing torch and morphogen, and building the task) is inside the N-process time. Run
`python benchmarks/jobs.py --help`.
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from arguments import BenchmarkParser, count, run_script
from morphogen.cli import main as morphogen_main
from morphogen.commands.evaluate import EvalConfig, evaluate_command
from morphogen.config import build_config
from morphogen.data import TASK_NAMES


def timed_eval(task: str, count: int, epochs: int, jobs: int) -> tuple[float, object]:
    """Seconds of one whole `morphogen eval` of `count` episodes per controller (policy and task loading included)
    and its scores."""
    config = build_config(EvalConfig, {"policy": "default", "task": task, "episodes": count,
                                       "episode_length": epochs, "jobs": jobs})
    started = time.perf_counter()
    scores = evaluate_command(config, out=io.StringIO())
    return time.perf_counter() - started, scores


def timed_seeds(task: str, count: int, epochs: int, jobs: int) -> tuple[float, object]:
    """Seconds of one whole `morphogen run --seeds count --jobs jobs --threads 1` and each seed's scores."""
    with tempfile.TemporaryDirectory() as directory, contextlib.redirect_stdout(io.StringIO()):
        started = time.perf_counter()
        code = morphogen_main(["run", "--task", task, "--epochs", str(epochs), "--seeds", str(count), "--jobs",
                               str(jobs), "--threads", "1", "--run-dir", str(Path(directory) / "seeds")])
        elapsed = time.perf_counter() - started
        assert code == 0, f"morphogen run exited {code}"
        figures = json.loads((Path(directory) / "seeds" / "seeds.json").read_text())
    return elapsed, {seed: without_wall_clock({k: v for k, v in scores.items() if k != "run_dir"})
                     for seed, scores in figures["seeds"].items()}


def without_wall_clock(figures: object) -> object:
    """`figures` less every `seconds` entry, at any depth: the wall time of a training differs between two runs
    that play the same episodes, so it is left out of the check that both ways gave the same results."""
    if isinstance(figures, dict):
        return {key: without_wall_clock(value) for key, value in figures.items() if key != "seconds"}
    if isinstance(figures, list):
        return [without_wall_clock(value) for value in figures]
    return figures


#: Each command the benchmark times: how to time it, and what its work is called in the table.
COMMANDS: dict[str, tuple[Callable[[str, int, int, int], tuple[float, object]], str]] = {
    "eval": (timed_eval, "{count} x 3 controllers x {epochs} epochs"),
    "seeds": (timed_seeds, "{count} seeds x 3 trainings x {epochs} epochs"),
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", default="eval,seeds", help="comma-separated: eval, seeds (default both)")
    parser.add_argument("--tasks", default="digits,mnist1d", help="comma-separated built-in tasks")
    parser.add_argument("--count", type=count, default=4, help="episodes per controller of eval, seeds of run "
                                                             "(default 4)")
    parser.add_argument("--epochs", type=count, default=30, help="epochs per episode (default 30)")
    parser.add_argument("--jobs", type=count, default=2, help="worker processes of the parallel way")
    parser.add_argument("--repeats", type=count, default=2, help="runs of each (default 2)")
    args = parser.parse_args(argv)
    commands = [name.strip() for name in args.commands.split(",") if name.strip()]
    tasks = [name.strip() for name in args.tasks.split(",") if name.strip()]
    if not commands or any(name not in COMMANDS for name in commands):
        parser.error(f"--commands: give some of {', '.join(COMMANDS)}, got {args.commands!r}")
    if not tasks or any(name not in TASK_NAMES for name in tasks):
        parser.error(f"--tasks: give some of the built-in tasks {', '.join(TASK_NAMES)}, got {args.tasks!r}")
    torch.set_num_threads(1)  # each worker takes the parent's threads: one each, as `--threads 1` gives
    print(f"| command | task | work | 1 process (s) | {args.jobs} processes (s) | speed-up |")
    print("|---|---|---|---|---|---|")
    for command in commands:
        timed, work = COMMANDS[command]
        for task in tasks:
            seconds: dict[int, list[float]] = {1: [], args.jobs: []}
            figures = []
            for _ in range(args.repeats):
                for jobs in (1, args.jobs):
                    elapsed, outcome = timed(task, args.count, args.epochs, jobs)
                    seconds[jobs].append(elapsed)
                    figures.append(outcome)
            assert all(outcome == figures[0] for outcome in figures), "the processes changed the results"
            one, many = statistics.median(seconds[1]), statistics.median(seconds[args.jobs])
            print(f"| {command} | {task} | {work.format(count=args.count, epochs=args.epochs)} | {one:.1f} | "
                  f"{many:.1f} | {one / many:.2f}x |")


if __name__ == "__main__":
    run_script(main)
