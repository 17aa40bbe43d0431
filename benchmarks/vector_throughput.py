"""PPO training throughput on digits for 1, 2, 4 and 8 envs, and where the time of a step goes.

For each env count a fresh `PPOTrainer` runs `--warmup-rounds` untimed rounds, then `--rounds` timed ones
(collect whole episodes of `--episode-length` epochs with one batched policy call per step, then one PPO
update). Env-steps per second = envs x episode length x rounds / (collect + update seconds).

The time is split into:
- policy: `PolicyAgent.act` (observation normalization, the one batched policy call, decoding the actions);
- update: `ppo_update`;
- train: host training of all envs on the shared batches (`train` phase of every env's timer);
- validate: validation with counterfactuals (`validate` phase of every env's timer);
- other: the rest of collect (observation encoding, masks, applying actions, rewards, the rollout buffer,
  producing the shared batches).

Everything runs in one process on the CPU, env after env, so the figures show how the fixed per-step
costs (policy call, update) are shared out as envs are added. Run `python benchmarks/vector_throughput.py
--help`; `--json` also prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from morphogen.control.trainer import PPOTrainer, TrainConfig
from morphogen.data import Task, load_task
from morphogen.telemetry.sinks import Telemetry

PHASES = ("policy", "update", "train", "validate", "other")


@dataclass(frozen=True)
class Throughput:
    """Timed rounds of one env count."""

    envs: int
    rounds: int
    env_steps: int
    seconds: float
    env_steps_per_second: float
    #: Seconds per phase (PHASES) over the timed rounds.
    phase_seconds: dict[str, float]

    @property
    def shares(self) -> dict[str, float]:
        return {name: seconds / self.seconds for name, seconds in self.phase_seconds.items()}


class _TimedCall:
    """Wraps a callable and adds the wall time of every call to `seconds`."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.function(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started


def _env_phase_totals(trainer: PPOTrainer, phase: str) -> float:
    """Seconds in `phase` over every env; envs that share one timer (as `PPOTrainer` attaches it) count once."""
    timers = {id(episode.timer): episode.timer for episode in trainer.vector.episodes}
    return sum(timer.totals.get(phase, 0.0) for timer in timers.values())


def measure(task: Task, envs: int, *, rounds: int, warmup_rounds: int, episode_length: int, hidden_size: int,
            seed: int) -> Throughput:
    """Run `warmup_rounds` + `rounds` PPO rounds with `envs` envs; time the last `rounds`."""
    base = TrainConfig(task=task.name, n_envs=envs, rounds=warmup_rounds + rounds, seed=seed,
                       hidden_size=hidden_size)
    config = dataclasses.replace(base, episode=dataclasses.replace(base.episode, max_epochs=episode_length))
    # Level normal runs the phase timer; with no run directory nothing is written.
    trainer = PPOTrainer(config, task, Telemetry(None, level="normal"))
    for _ in range(warmup_rounds):
        trainer.run_round()
    policy = _TimedCall(trainer.state.agent.act)
    trainer.state.agent.act = policy  # type: ignore[method-assign]
    train_before, validate_before = _env_phase_totals(trainer, "train"), _env_phase_totals(trainer, "validate")
    collect = update = 0.0
    for _ in range(rounds):
        summary = trainer.run_round()
        collect += summary.collect_seconds
        update += summary.update_seconds
    train = _env_phase_totals(trainer, "train") - train_before
    validate = _env_phase_totals(trainer, "validate") - validate_before
    total = collect + update
    phases = {"policy": policy.seconds, "update": update, "train": train, "validate": validate,
              "other": collect - policy.seconds - train - validate}
    env_steps = envs * episode_length * rounds
    return Throughput(envs=envs, rounds=rounds, env_steps=env_steps, seconds=total,
                      env_steps_per_second=env_steps / total, phase_seconds=phases)


def format_table(results: Sequence[Throughput]) -> str:
    """One row per env count: throughput, its ratio to the first row, and the share of time per phase."""
    lines = [f"{'envs':>4}  {'env-steps':>9}  {'seconds':>8}  {'steps/s':>8}  {'vs first':>8}  "
             + "  ".join(f"{name:>8}" for name in PHASES)]
    for result in results:
        ratio = result.env_steps_per_second / results[0].env_steps_per_second
        shares = result.shares
        lines.append(f"{result.envs:>4}  {result.env_steps:>9}  {result.seconds:>8.1f}  "
                     f"{result.env_steps_per_second:>8.2f}  {ratio:>7.2f}x  "
                     + "  ".join(f"{shares[name]:>8.1%}" for name in PHASES))
    return "\n".join(lines)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--envs", default="1,2,4,8", help="comma-separated env counts (default 1,2,4,8)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per env count (default 3)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first (default 1)")
    parser.add_argument("--episode-length", type=int, default=4, help="epochs per episode (default 4)")
    parser.add_argument("--max-train-samples", type=int, default=500,
                        help="cap on digits training images (default 500 of 1437; 0 = all)")
    parser.add_argument("--hidden-size", type=int, default=512, help="policy width (default 512, as trained)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: the models are tiny, and extra threads "
                             "mostly spin on a busy machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    try:
        args.env_counts = [int(value) for value in args.envs.split(",") if value.strip()]
    except ValueError:
        parser.error(f"--envs must be comma-separated integers, got {args.envs!r}")
    if not args.env_counts or min(args.env_counts) < 1:
        parser.error(f"--envs needs env counts >= 1, got {args.envs!r}")
    for name in ("rounds", "episode_length", "hidden_size", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup_rounds < 0 or args.max_train_samples < 0:
        parser.error("--warmup-rounds and --max-train-samples must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    torch.set_num_threads(args.threads)
    task = load_task("digits", seed=args.seed, max_train_samples=args.max_train_samples or None)
    print(f"vector throughput: digits, {len(task.train)} train / {len(task.validation)} validation images, "
          f"{args.episode_length}-epoch episodes, policy hidden {args.hidden_size}, {args.rounds} timed rounds "
          f"after {args.warmup_rounds} warm-up, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}",
          flush=True)
    results = []
    for envs in args.env_counts:
        started = time.perf_counter()
        results.append(measure(task, envs, rounds=args.rounds, warmup_rounds=args.warmup_rounds,
                               episode_length=args.episode_length, hidden_size=args.hidden_size, seed=args.seed))
        print(f"  {envs} env(s) done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    print(format_table(results))
    print("shares are of collect + update time; policy = batched PolicyAgent.act, other = encoding, masks, "
          "actions, rewards, buffer, batch production")
    if args.json:
        print(json.dumps([{**asdict(result), "shares": result.shares} for result in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
