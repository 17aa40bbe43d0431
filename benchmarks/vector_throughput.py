"""PPO training throughput on digits for 1, 8, 32 and 64 envs, where the time of a step goes, and how busy
the GPU is.

For each env count a fresh `PPOTrainer` runs `--warmup-rounds` untimed rounds, then `--rounds` timed ones
(collect whole episodes of `--episode-length` epochs with one batched policy call per step, then one PPO
update). Env-steps per second = envs x episode length x rounds / (collect + update seconds).

The time is split into:
- policy: `PolicyAgent.act` (observation normalization and the one batched policy call; decoding the actions,
  which waits for them, counts as other);
- update: `ppo_update`;
- train: host training of all envs on the shared batches (`train` phase of every env's timer);
- validate: validation with counterfactuals (`validate` phase of every env's timer);
- other: the rest of collect (observation encoding, masks, applying actions, rewards, the rollout buffer,
  producing the shared batches).

GPU busy (CUDA only; "n/a" elsewhere): one more round after the timed ones, under `torch.profiler`, with
the summed self device time of every op (the kernels) divided by that round's wall time. Envs on their
own streams can run kernels at the same time, so the figure can exceed 100%. The profiler slows the
host side a little, so this round is not part of the throughput.

`--compile` measures every env count twice, eager and with `--compile` (the policy's forward and every
host's training forward compiled; see `morphogen.core.compilation`), and prints compiled / eager. The
warm-up rounds then include compile time; graphs for growth plans first met in a timed round are
compiled there, and counted.

Run `python benchmarks/vector_throughput.py --help`; `--json` also prints the figures as JSON.
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

from arguments import BenchmarkParser, count, run_script
from morphogen.control.trainer import PPOTrainer, TrainConfig
from morphogen.data import Task, load_task
from morphogen.devices import resolve_device
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
    #: Whether the hosts' training forward and the policy's forward ran compiled.
    compiled: bool = False
    #: Device kernel time / wall time of one profiled round; None off CUDA.
    gpu_busy: float | None = None

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
    timers = {id(episode.timer): episode.timer for group in trainer.groups for episode in group.vector.episodes}
    return sum(timer.totals.get(phase, 0.0) for timer in timers.values())


def gpu_busy_fraction(trainer: PPOTrainer) -> float | None:
    """Device kernel time over wall time of one more round run under `torch.profiler`; None off CUDA."""
    if trainer.tasks[0].train.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        trainer.run_round()
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    kernel_microseconds = sum(event.self_device_time_total for event in profiler.key_averages())
    return kernel_microseconds / 1e6 / wall


def measure(task: Task, envs: int, *, rounds: int, warmup_rounds: int, episode_length: int, hidden_size: int,
            seed: int, compile_forward: bool = False) -> Throughput:
    """Run `warmup_rounds` + `rounds` PPO rounds with `envs` envs; time the last `rounds`."""
    base = TrainConfig(task=task.name, n_envs=envs, rounds=warmup_rounds + rounds + 1, seed=seed,
                       hidden_size=hidden_size, device=str(task.train.device), compile=compile_forward)
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
                      env_steps_per_second=env_steps / total, phase_seconds=phases, compiled=compile_forward,
                      gpu_busy=gpu_busy_fraction(trainer))


def format_table(results: Sequence[Throughput]) -> str:
    """One row per env count (and mode): throughput, its ratio to the first eager row, compiled / eager at
    the same env count, the share of time per phase, and GPU busy."""
    eager = {result.envs: result for result in results if not result.compiled}
    first = results[0].env_steps_per_second
    lines = [f"{'envs':>4}  {'mode':>8}  {'env-steps':>9}  {'seconds':>8}  {'steps/s':>8}  {'vs first':>8}  "
             f"{'vs eager':>8}  " + "  ".join(f"{name:>8}" for name in PHASES) + f"  {'GPU busy':>8}"]
    for result in results:
        shares = result.shares
        versus_eager = "-"
        if result.compiled and result.envs in eager:
            versus_eager = f"{result.env_steps_per_second / eager[result.envs].env_steps_per_second:.2f}x"
        busy = "n/a" if result.gpu_busy is None else f"{result.gpu_busy:.1%}"
        lines.append(f"{result.envs:>4}  {'compiled' if result.compiled else 'eager':>8}  {result.env_steps:>9}  "
                     f"{result.seconds:>8.1f}  {result.env_steps_per_second:>8.2f}  "
                     f"{result.env_steps_per_second / first:>7.2f}x  {versus_eager:>8}  "
                     + "  ".join(f"{shares[name]:>8.1%}" for name in PHASES) + f"  {busy:>8}")
    return "\n".join(lines)


def parse_env_counts(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """`--envs 1,8,32` as a list of env counts >= 1; anything else ends with the parser's usage error."""
    try:
        counts = [int(value) for value in text.split(",") if value.strip()]
    except ValueError:
        parser.error(f"--envs must be comma-separated integers, got {text!r}")
    if not counts or min(counts) < 1:
        parser.error(f"--envs needs env counts >= 1, got {text!r}")
    return counts


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = BenchmarkParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--envs", default="1,8,32,64", help="comma-separated env counts (default 1,8,32,64)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    parser.add_argument("--compile", action="store_true",
                        help="measure every env count eager and compiled (--compile), and print the ratio")
    parser.add_argument("--rounds", type=count, default=3, help="timed rounds per env count (default 3)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first (default 1)")
    parser.add_argument("--episode-length", type=count, default=4, help="epochs per episode (default 4)")
    parser.add_argument("--max-train-samples", type=count, default=500,
                        help="cap on digits training images (default 500 of 1437; 0 = all)")
    parser.add_argument("--hidden-size", type=count, default=512, help="policy width (default 512, as trained)")
    parser.add_argument("--threads", type=count, default=1,
                        help="torch intra-op threads (default 1: the models are tiny, and extra threads "
                             "mostly spin on a busy machine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args(argv)
    args.env_counts = parse_env_counts(parser, args.envs)
    for name in ("rounds", "episode_length", "hidden_size", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup_rounds < 0 or args.max_train_samples < 0:
        parser.error("--warmup-rounds and --max-train-samples must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    torch.set_num_threads(args.threads)
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        print(f"vector_throughput: error: {error}", file=sys.stderr)
        return 2
    task = load_task("digits", device=device, seed=args.seed, max_train_samples=args.max_train_samples or None)
    where = torch.cuda.get_device_name(device) if task.train.device.type == "cuda" else device
    print(f"vector throughput: digits on {where}, {len(task.train)} train / {len(task.validation)} validation "
          f"images, {args.episode_length}-epoch episodes, policy hidden {args.hidden_size}, {args.rounds} timed "
          f"rounds after {args.warmup_rounds} warm-up, {torch.get_num_threads()} torch thread(s), "
          f"torch {torch.__version__}", flush=True)
    results = []
    for envs in args.env_counts:
        for compile_forward in (False, True) if args.compile else (False,):
            started = time.perf_counter()
            results.append(measure(task, envs, rounds=args.rounds, warmup_rounds=args.warmup_rounds,
                                   episode_length=args.episode_length, hidden_size=args.hidden_size, seed=args.seed,
                                   compile_forward=compile_forward))
            mode = "compiled" if compile_forward else "eager"
            print(f"  {envs} env(s) {mode} done in {time.perf_counter() - started:.1f} s", file=sys.stderr,
                  flush=True)
    print(format_table(results))
    print("shares are of collect + update time; policy = batched PolicyAgent.act, other = encoding, masks, "
          "actions, rewards, buffer, batch production; GPU busy = kernel time / wall time of one profiled round")
    if args.json:
        print(json.dumps([{**asdict(result), "shares": result.shares} for result in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
