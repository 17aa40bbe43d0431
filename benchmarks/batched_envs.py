"""Env-steps per second of a `VectorEpisodes`, envs trained one after another vs batched (env/batched.py).

For each env count, two vectors with the same seeds step the same actions: one trains env after env
(`batch_identical=False`, today's path), the other trains the envs of identical architecture in one
vmapped call per batch (`batch_identical=True`). A step is what `VectorEpisodes.step` does: apply the
actions, train one epoch on the shared batches, validate every env with its counterfactuals. The two
vectors step in lockstep and every step is timed for both, in alternating order, so that the load of a
shared machine hits both alike; the ratio is the median over the steps of the per-step ratios.

Scenarios (`--scenario`):
- `empty`: every env waits; no seed anywhere, so the batched vector trains all envs as one group. This
  is every env at the start of an episode and most envs for most of it.
- `grown`: at the first timed step every env germinates the same seed (conv_light in r0c0); its
  TRAINING stage adds the shadow pass, and the envs still form one group.
- `mixed`: at the first timed step env i germinates blueprint i mod 3 of conv_light, norm, conv_small
  in r0c0 (about a third of the envs each, three groups); with 1 env: conv_light.

Env-steps per second = envs x timed steps / their seconds. "train" is the share of the step in host training
(the "train" phase of the envs' shared timer). Run `python benchmarks/batched_envs.py --help`.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from arguments import BenchmarkParser, count, run_script
from morphogen.core.lifecycle import GateConfig, GateMode
from morphogen.core.slot import SlotConfig
from morphogen.data import Task, load_task
from morphogen.env.actions import Action, Op
from morphogen.env.episode import EpisodeConfig
from morphogen.env.vector import VectorEpisodes
from morphogen.telemetry.profiler import PhaseTimer
from vector_throughput import parse_env_counts

SCENARIOS = ("empty", "grown", "mixed")
MIXED_BLUEPRINTS = ("conv_light", "norm", "conv_small")


@dataclass(frozen=True)
class Timing:
    """Timed steps of one mode."""

    seconds: float
    train_seconds: float
    env_steps: int

    @property
    def env_steps_per_second(self) -> float:
        return self.env_steps / self.seconds


@dataclass(frozen=True)
class Comparison:
    envs: int
    scenario: str
    per_env: Timing
    batched: Timing
    #: Median over the timed steps of (per-env step seconds / batched step seconds).
    ratio: float


def first_actions(scenario: str, envs: int) -> list[Action]:
    """The actions of the first timed step; every later step waits."""
    if scenario == "empty":
        return [Action()] * envs
    if scenario == "grown":
        return [Action(op=Op.GERMINATE, slot="r0c0", blueprint="conv_light")] * envs
    return [Action(op=Op.GERMINATE, slot="r0c0", blueprint=MIXED_BLUEPRINTS[i % len(MIXED_BLUEPRINTS)])
            for i in range(envs)]


def timed_step(vector: VectorEpisodes, actions: Sequence[Action]) -> float:
    started = time.perf_counter()
    vector.step(actions)
    if vector.device.type == "cuda":
        torch.cuda.synchronize(vector.device)
    return time.perf_counter() - started


def compare(task: Task, envs: int, scenario: str, *, steps: int, seed: int) -> Comparison:
    """Step a per-env and a batched vector in lockstep; each step is timed for both, in alternating order."""
    gates = GateConfig(mode=GateMode.PERMISSIVE)
    base = EpisodeConfig(max_epochs=steps + 1, slots=SlotConfig(gates=gates))
    vectors, timers = [], []
    for batched in (False, True):
        vector = VectorEpisodes(task, dataclasses.replace(base, batch_identical=batched), envs, seed=seed)
        timer = PhaseTimer()
        for episode in vector.episodes:
            episode.timer = timer
        vector.reset(0)
        timed_step(vector, [Action()] * envs)  # warm-up: first allocations, lazy initialisation
        vectors.append(vector)
        timers.append(timer)
    train_before = [timer.totals.get("train", 0.0) for timer in timers]
    seconds = [[], []]
    for step in range(steps):
        actions = first_actions(scenario, envs) if step == 0 else [Action()] * envs
        # Alternate which mode goes first, so that a change in machine load hits both alike.
        for mode in ((0, 1) if step % 2 == 0 else (1, 0)):
            seconds[mode].append(timed_step(vectors[mode], actions))
    timings = [Timing(sum(seconds[mode]), timers[mode].totals.get("train", 0.0) - train_before[mode], envs * steps)
               for mode in (0, 1)]
    ratio = statistics.median(alone / batched for alone, batched in zip(seconds[0], seconds[1], strict=True))
    return Comparison(envs, scenario, timings[0], timings[1], ratio)


def format_table(results: Sequence[Comparison]) -> str:
    lines = [f"{'envs':>4}  {'scenario':>8}  {'per-env steps/s':>15}  {'batched steps/s':>15}  {'ratio':>6}  "
             f"{'train share per-env':>19}  {'train share batched':>19}"]
    for result in results:
        lines.append(f"{result.envs:>4}  {result.scenario:>8}  {result.per_env.env_steps_per_second:>15.1f}  "
                     f"{result.batched.env_steps_per_second:>15.1f}  {result.ratio:>5.2f}x  "
                     f"{result.per_env.train_seconds / result.per_env.seconds:>19.0%}  "
                     f"{result.batched.train_seconds / result.batched.seconds:>19.0%}")
    return "\n".join(lines)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--envs", default="1,8,32", help="comma-separated env counts (default 1,8,32)")
    parser.add_argument("--scenario", default="empty,grown", help=f"comma-separated, of {', '.join(SCENARIOS)} "
                        "(default empty,grown)")
    parser.add_argument("--steps", type=count, default=5, help="timed steps (epochs) per env count (default 5)")
    parser.add_argument("--max-train-samples", type=count, default=500,
                        help="cap on digits training images (default 500 of 1437; 0 = all)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    parser.add_argument("--threads", type=count, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.env_counts = parse_env_counts(parser, args.envs)
    args.scenarios = [value.strip() for value in args.scenario.split(",") if value.strip()]
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown or not args.scenarios:
        parser.error(f"--scenario accepts {', '.join(SCENARIOS)}; got {args.scenario!r}")
    for name in ("steps", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.max_train_samples < 0:
        parser.error("--max-train-samples must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    task = load_task("digits", seed=args.seed, max_train_samples=args.max_train_samples or None, device=device)
    print(f"batched envs: digits on {device}, {len(task.train)} train / {len(task.validation)} validation images, "
          f"{args.steps} timed steps after 1 warm-up, {torch.get_num_threads()} torch "
          f"thread(s), torch {torch.__version__}", flush=True)
    results = []
    for scenario in args.scenarios:
        for envs in args.env_counts:
            started = time.perf_counter()
            results.append(compare(task, envs, scenario, steps=args.steps, seed=args.seed))
            print(f"  {envs} env(s), {scenario}: done in {time.perf_counter() - started:.1f} s", file=sys.stderr,
                  flush=True)
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
