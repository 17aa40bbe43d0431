"""Distributed PPO on this machine: rounds per second on 1, 2 (and 4 where cores allow) gloo ranks.

The run is fixed at `--envs` envs in all (so more ranks means fewer envs per rank: strong scaling),
each rank with `--threads` intra-op threads. Every rank is a process launched with the variables
torchrun sets; each trains `--warmup` rounds untimed, then `--rounds` timed rounds, and reports the
median seconds per round and the share of that time spent inside collectives: the all-reduces
(gradients, advantage moments, KL, round summary) and the per-step all-gathers (policy inputs,
reward/value moments). Collective time includes waiting for the slowest rank.

Run `python benchmarks/distributed.py --help`; `--json` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from arguments import BenchmarkParser, count, run_script, whole_numbers
from morphogen.control.distributed import DistributedTrainer, init_distributed, shutdown
from morphogen.control.trainer import TrainConfig
from morphogen.env.episode import EpisodeConfig
from morphogen.session import load_session_task

SRC = Path(__file__).resolve().parents[1] / "src"


def worker(args: argparse.Namespace) -> None:
    """One rank: time rounds, rank 0 prints one JSON line."""
    torch.set_num_threads(args.threads)
    context = init_distributed("cpu", timeout_s=600)
    config = TrainConfig(n_envs=args.envs, rounds=args.warmup + args.rounds, hidden_size=args.hidden_size,
                         max_train_samples=args.max_train_samples,
                         episode=EpisodeConfig(max_epochs=args.episode_length)).with_resolved_host()
    trainer = DistributedTrainer(config, load_session_task(config, "cpu"), context)
    for _ in range(args.warmup):
        trainer.run_round()
    context.time.seconds.clear()
    seconds = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        trainer.run_round()
        seconds.append(time.perf_counter() - started)
    total = sum(seconds)
    if context.is_main:
        print(json.dumps({
            "ranks": context.world_size, "envs_per_rank": args.envs // context.world_size,
            "seconds_per_round": statistics.median(seconds), "rounds_per_second": 1 / statistics.median(seconds),
            "all_reduce_share": context.time.seconds.get("all-reduce", 0.0) / total,
            "all_gather_share": context.time.seconds.get("all-gather", 0.0) / total,
        }))
    shutdown()


def launch(ranks: int, argv: list[str]) -> dict[str, float]:
    """Run `ranks` worker processes of this script; rank 0's figures."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    processes = []
    python_path = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    try:
        for rank in range(ranks):
            env = {**os.environ, "PYTHONPATH": python_path, "OMP_NUM_THREADS": "1", "RANK": str(rank),
                   "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            processes.append(subprocess.Popen([sys.executable, __file__, "--worker", *argv], env=env,
                                              stdout=subprocess.PIPE, text=True))
        outputs = [process.communicate(timeout=1800)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    if any(process.returncode for process in processes):
        raise SystemExit(f"a rank of the {ranks}-rank run failed")
    return json.loads(outputs[0].strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=count, default=4, help="envs in all (default 4)")
    parser.add_argument("--ranks", type=whole_numbers(), default=None,
                        help="comma-separated rank counts (default 1,2 and 4 if >= 4 cores)")
    parser.add_argument("--rounds", type=count, default=3, help="timed rounds per rank count (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    parser.add_argument("--episode-length", type=count, default=3, help="epochs per episode (default 3)")
    parser.add_argument("--max-train-samples", type=count, default=400, help="training samples (default 400)")
    parser.add_argument("--hidden-size", type=count, default=64, help="policy width (default 64)")
    parser.add_argument("--threads", type=count, default=1, help="torch threads per rank (default 1)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    cores = os.cpu_count() or 1
    counts = args.ranks if args.ranks else [1, 2] + ([4] if cores >= 4 else [])
    argv = [arg for arg in sys.argv[1:] if not arg.startswith("--ranks") and arg != "--json"]
    if "--ranks" in sys.argv:
        index = sys.argv.index("--ranks")
        argv = [a for i, a in enumerate(sys.argv[1:], start=1) if i not in (index, index + 1) and a != "--json"]
    results = [launch(n, argv) for n in counts]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.envs} envs in all, {args.episode_length} epochs per episode, {args.max_train_samples} samples, "
          f"{args.threads} thread(s) per rank, {cores} cores")
    print(f"{'ranks':>5} {'envs/rank':>9} {'s/round':>8} {'rounds/s':>9} {'all-reduce':>10} {'all-gather':>10}")
    for r in results:
        print(f"{r['ranks']:>5} {r['envs_per_rank']:>9} {r['seconds_per_round']:>8.2f} {r['rounds_per_second']:>9.3f} "
              f"{r['all_reduce_share']:>10.1%} {r['all_gather_share']:>10.1%}")


if __name__ == "__main__":
    run_script(main)
