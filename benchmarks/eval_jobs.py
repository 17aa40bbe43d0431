"""What `morphogen eval --jobs N` gains: the wall time of one evaluation played in one process against the same
evaluation played by N worker processes, each of one thread.

Both play the same episodes (the shipped policy, the heuristic and no growth on the same seeds) and are checked to
give the same table; the repeats alternate the two, so that a drift in machine load hits both alike. The table
gives each setting's median seconds and the speed-up (one process / N processes). Worker start-up (a spawned
Python importing torch and morphogen, and building the task) is inside the N-process time. Run
`python benchmarks/eval_jobs.py --help`.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Sequence

import torch

from morphogen.commands.evaluate import ControllerScores, EvalConfig, evaluate_command
from morphogen.config import build_config


def timed_eval(task: str, episodes: int, epochs: int, jobs: int) -> tuple[float, list[ControllerScores]]:
    """Seconds of one whole `morphogen eval` (policy and task loading included) and its scores."""
    config = build_config(EvalConfig, {"policy": "default", "task": task, "episodes": episodes,
                                       "episode_length": epochs, "jobs": jobs})
    started = time.perf_counter()
    scores = evaluate_command(config, out=io.StringIO())
    return time.perf_counter() - started, scores


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="digits,mnist1d", help="comma-separated built-in tasks")
    parser.add_argument("--episodes", type=int, default=4, help="episodes per controller (default 4)")
    parser.add_argument("--epochs", type=int, default=30, help="epochs per episode (default 30)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes of the parallel evaluation")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each (default 2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # each worker takes the parent's threads: one each, as `--threads 1` gives
    print(f"| task | episodes | 1 process (s) | {args.jobs} processes (s) | speed-up |")
    print("|---|---|---|---|---|")
    for task in args.tasks.split(","):
        seconds: dict[int, list[float]] = {1: [], args.jobs: []}
        tables = []
        for _ in range(args.repeats):
            for jobs in (1, args.jobs):
                elapsed, scores = timed_eval(task, args.episodes, args.epochs, jobs)
                seconds[jobs].append(elapsed)
                tables.append(scores)
        assert all(table == tables[0] for table in tables), "the processes changed the results"
        one, many = statistics.median(seconds[1]), statistics.median(seconds[args.jobs])
        print(f"| {task} | {args.episodes} x 3 controllers x {args.epochs} epochs | {one:.1f} | {many:.1f} | "
              f"{one / many:.2f}x |")


if __name__ == "__main__":
    main()
