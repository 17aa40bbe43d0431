"""What telemetry costs: step time of a morphogenetic episode on digits at each level, as a ratio to `off`.

Every level gets the same episode, set up as `morphogen run` sets it up: a `Telemetry` writing into its own
run directory (a temporary one) with `TelemetryConfig(level=...)`, the episode's timer from
`PhaseTimer.from_config`, an `AnomalyDetector` on the same config, and `Telemetry.end_epoch` after every
step. The controller plays a fixed script (`SCRIPT`) under permissive gates with one epoch of training
before blending, so the steps cover germination, training, blending, holding and fossilizing, with
counterfactuals (`without:` configurations, and `all_off` once two seeds are blended) and seed gradient
reports. Same seed, same batches: every level trains exactly the same numbers (checked).

One timed step is one iteration of `morphogen.env.play.run_episode`'s loop: the controller's action (with the masks),
`episode.step`, `telemetry.end_epoch`. The four episodes advance in lockstep: a round is one step of each
level at the same epoch, so a round compares identical work, and each round's ratios (level / off) come
from seconds apart, which cancels drifts in machine load. The starting level rotates from round to round
so that no level always follows the same one. Figures are medians over rounds.

Run `python benchmarks/telemetry_overhead.py --help`; `--json` prints the figures as JSON on stdout (the
table then goes to stderr).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from arguments import BenchmarkParser, count, run_script
from morphogen.core.blend import BlendKind
from morphogen.core.lifecycle import BLENDED_STAGES, GateConfig, GateMode
from morphogen.core.slot import SlotConfig
from morphogen.data import Task, load_task
from morphogen.env.actions import Action, Op
from morphogen.env.counterfactual import ALL_OFF, CounterfactualSchedule
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.play import play_epoch
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.run_directory import EVENTS_FILENAME
from morphogen.telemetry import events
from morphogen.telemetry.anomalies import AnomalyDetector
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.events import LEVELS
from morphogen.telemetry.profiler import PhaseTimer
from morphogen.telemetry.sinks import Telemetry, read_events

BASELINE_LEVEL = "off"
#: The level the goal is about, and the largest acceptable ratio of its step time to `off`'s.
GOAL_LEVEL, GOAL_RATIO = "normal", 1.03

#: (epoch of the snapshot the controller sees, action); WAIT at every other epoch. With one epoch of
#: training before blending and 3-epoch ramps, the snapshots after each step show r0c1 training at epochs
#: 1-2, blending 3-4, holding 5-9 and fossilized from 10; r0c0 training 6-7, blending 8-9 and holding from
#: 10. From epoch 9 two seeds are blended with alpha > 0, so validation also runs `all_off`.
SCRIPT: tuple[tuple[int, Action], ...] = (
    (0, Action(Op.GERMINATE, slot="r0c1", blueprint="conv_light", blend=BlendKind.ADD, blend_epochs=3)),
    (2, Action(Op.ADVANCE, slot="r0c1")),
    (5, Action(Op.GERMINATE, slot="r0c0", blueprint="conv_small", blend=BlendKind.ADD, blend_epochs=3)),
    (7, Action(Op.ADVANCE, slot="r0c0")),
    (9, Action(Op.FOSSILIZE, slot="r0c1")),
)
#: Gates that let the script's moves through: health only, one epoch of training before blending.
SCRIPT_SLOTS = SlotConfig(gates=GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=1))
#: Epochs the script needs to show everything it is meant to exercise.
MIN_EPOCHS = 10


def episode_config(epochs: int) -> EpisodeConfig:
    """The episodes every level plays: the script's gates, and every counterfactual every epoch (`all_off`
    included, as a learned policy's episodes measure them), not only those a gate reads next, which never
    run `all_off`."""
    return EpisodeConfig(max_epochs=epochs, slots=SCRIPT_SLOTS, counterfactuals=CounterfactualSchedule.EVERY_EPOCH)


class ScriptedController:
    """Plays `script`: the action listed for the epoch of the snapshot, WAIT at every other epoch."""

    def __init__(self, script: Sequence[tuple[int, Action]]) -> None:
        self.actions = dict(script)

    def reset(self) -> None:
        """The script depends on the epoch alone; nothing to forget."""

    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
        return self.actions.get(snapshot.epoch, Action())


@dataclass
class LevelEpisode:
    """One level's episode in progress and where its telemetry goes."""

    level: str
    episode: MorphogenesisEpisode
    controller: ScriptedController
    run_dir: Path
    snapshot: EpisodeSnapshot
    #: (validation loss, validation accuracy) after each step: must match across levels.
    trajectory: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class LevelCost:
    level: str
    #: Median over timed rounds of this level's step seconds.
    step_seconds: float
    #: Median over timed rounds of (this level's step seconds / off's in the same round).
    ratio: float
    #: 25th and 75th percentiles of those per-round ratios (the spread the median comes from).
    ratio_quartiles: tuple[float, float]
    #: Events written to events.jsonl per step, and bytes, in the last timed episode.
    events_per_step: float
    bytes_per_step: float
    #: Anomalies reported (they escalate to debug for a few epochs) in the last timed episode.
    anomalies: int


@dataclass(frozen=True)
class OverheadReport:
    epochs: int
    episodes: int
    rounds: int
    threads: int
    costs: list[LevelCost]
    same_trajectory: bool

    @property
    def goal_met(self) -> bool:
        return next(cost.ratio for cost in self.costs if cost.level == GOAL_LEVEL) <= GOAL_RATIO


# ---------------------------------------------------------------- one level's episode


def start_episode(task: Task, level: str, config: EpisodeConfig, seed: int, run_dir: Path,
                  stack: ExitStack) -> LevelEpisode:
    """A reset episode wired to telemetry at `level` the way `morphogen.commands.run.run_command` wires it."""
    telemetry_config = TelemetryConfig(level=level)
    episode = MorphogenesisEpisode(task, config, seed=seed)
    episode.telemetry = stack.enter_context(Telemetry(run_dir, config=telemetry_config))
    episode.timer = PhaseTimer.from_config(telemetry_config)
    episode.detector = AnomalyDetector(telemetry_config)
    controller = ScriptedController(SCRIPT)
    snapshot = episode.reset()
    controller.reset()
    return LevelEpisode(level, episode, controller, run_dir, snapshot)


def play_step(run: LevelEpisode) -> float:
    """One iteration of `run_episode`'s loop (`play_epoch`); returns its seconds."""
    started = time.perf_counter()
    result = play_epoch(run.episode, run.controller, run.snapshot)
    seconds = time.perf_counter() - started
    run.snapshot = result.snapshot
    run.trajectory.append((result.snapshot.val_loss, result.snapshot.val_accuracy))
    return seconds


def check_script_exercised(episode: MorphogenesisEpisode) -> None:
    """Raise if the episode did not blend two seeds, run `all_off`, and report seed gradients."""
    assert episode.model is not None
    blended = [slot.slot_id for slot in episode.model.slots() if slot.stage in BLENDED_STAGES]
    all_off = any(isinstance(event, events.CounterfactualMeasured) and ALL_OFF in event.configs
                  for event in episode.history)
    seed_gradients = any(isinstance(event, events.GradientHealthMeasured) and event.seeds for event in episode.history)
    if len(blended) < 2 or not all_off or not seed_gradients:
        raise RuntimeError(
            f"the action script no longer exercises what it should (blended seeds {blended}, all_off run: "
            f"{all_off}, seed gradient reports: {seed_gradients}); update SCRIPT for the current lifecycle")


def written_events(run_dir: Path) -> tuple[int, int, int]:
    """(events, bytes, anomaly events) in a run directory's events.jsonl; zeros if nothing was written."""
    path = run_dir / EVENTS_FILENAME
    if not path.exists():
        return 0, 0, 0
    written = read_events(path)
    anomalies = sum(isinstance(event, events.AnomalyDetected) for event in written)
    return len(written), path.stat().st_size, anomalies


# ---------------------------------------------------------------- the measurement


def measure(task: Task, *, epochs: int, episodes: int, warmup_episodes: int, seed: int,
            progress: bool = True) -> OverheadReport:
    """Play `warmup_episodes + episodes` lockstep episode sets; time the rounds of the last `episodes`."""
    config = episode_config(epochs)
    seconds: dict[str, list[float]] = {level: [] for level in LEVELS}
    ratios: dict[str, list[float]] = {level: [] for level in LEVELS}
    written: dict[str, tuple[int, int, int]] = {}
    same_trajectory, timed_round = True, 0
    with tempfile.TemporaryDirectory(prefix="telemetry-overhead-") as root:
        for index in range(warmup_episodes + episodes):
            timed = index >= warmup_episodes
            started = time.perf_counter()
            with ExitStack() as stack:
                runs = {level: start_episode(task, level, config, seed, Path(root) / f"{index}-{level}", stack)
                        for level in LEVELS}
                for _ in range(epochs):
                    start = timed_round % len(LEVELS)
                    order = LEVELS[start:] + LEVELS[:start]
                    step_seconds = {level: play_step(runs[level]) for level in order}
                    if timed:
                        timed_round += 1
                        for level in LEVELS:
                            seconds[level].append(step_seconds[level])
                            ratios[level].append(step_seconds[level] / step_seconds[BASELINE_LEVEL])
            check_script_exercised(runs[BASELINE_LEVEL].episode)
            same_trajectory &= all(run.trajectory == runs[BASELINE_LEVEL].trajectory for run in runs.values())
            written = {level: written_events(run.run_dir) for level, run in runs.items()}
            if progress:
                kind = "timed" if timed else "warm-up"
                print(f"  episode set {index + 1}/{warmup_episodes + episodes} ({kind}) "
                      f"{time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    costs = []
    for level in LEVELS:
        quartiles = statistics.quantiles(ratios[level], n=4)
        count, size, anomalies = written[level]
        costs.append(LevelCost(level=level, step_seconds=statistics.median(seconds[level]),
                               ratio=statistics.median(ratios[level]), ratio_quartiles=(quartiles[0], quartiles[2]),
                               events_per_step=count / epochs, bytes_per_step=size / epochs, anomalies=anomalies))
    return OverheadReport(epochs=epochs, episodes=episodes, rounds=timed_round, threads=torch.get_num_threads(),
                          costs=costs, same_trajectory=same_trajectory)


# ---------------------------------------------------------------- report


def format_table(report: OverheadReport, task: Task) -> str:
    goal = next(cost for cost in report.costs if cost.level == GOAL_LEVEL)
    verdict = "met" if report.goal_met else "NOT met"
    lines = [
        f"telemetry overhead: digits ({len(task.train)} train / {len(task.validation)} validation), "
        f"{report.epochs}-epoch scripted episodes, {report.episodes} timed episode(s) per level, "
        f"{report.rounds} rounds, {report.threads} torch thread(s), torch {torch.__version__}",
        "",
        f"{'level':<8}{'step ms':>9}{'vs off':>9}{'quartiles':>17}{'events/step':>13}{'bytes/step':>12}"
        f"{'anomalies':>11}",
    ]
    for cost in report.costs:
        low, high = cost.ratio_quartiles
        lines.append(f"{cost.level:<8}{1000 * cost.step_seconds:>9.1f}{cost.ratio:>8.3f}x"
                     f"{f'{low:.3f}-{high:.3f}':>17}{cost.events_per_step:>13.1f}{cost.bytes_per_step:>12.0f}"
                     f"{cost.anomalies:>11}")
    lines += [
        "",
        f"goal: {GOAL_LEVEL} within {GOAL_RATIO - 1:.0%} of off: {verdict} ({GOAL_LEVEL} is "
        f"{goal.ratio - 1:+.1%}; median of per-round ratios)",
        f"same training trajectory at every level: {'yes' if report.same_trajectory else 'NO'}",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = BenchmarkParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=count, default=12,
                        help=f"epochs per episode (default 12, at least {MIN_EPOCHS} for the script)")
    parser.add_argument("--episodes", type=count, default=6, help="timed episodes per level (default 6)")
    parser.add_argument("--warmup-episodes", type=int, default=1, help="untimed episodes per level first (default 1)")
    parser.add_argument("--threads", type=count, default=1,
                        help="torch intra-op threads (default 1: the models are tiny and timings steadier)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON on stdout (table on stderr)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.epochs < MIN_EPOCHS:
        parser.error(f"--epochs must be >= {MIN_EPOCHS}: the script fossilizes its first seed at epoch 10")
    if args.episodes < 1 or args.warmup_episodes < 0 or args.threads < 1:
        parser.error("--episodes and --threads must be >= 1, --warmup-episodes >= 0")
    if args.episodes * args.epochs < 2:
        parser.error("need at least 2 timed rounds for quartiles")
    torch.set_num_threads(args.threads)
    task = load_task("digits", seed=args.seed)
    report = measure(task, epochs=args.epochs, episodes=args.episodes, warmup_episodes=args.warmup_episodes,
                     seed=args.seed)
    table = format_table(report, task)
    if args.json:
        print(table, file=sys.stderr)
        print(json.dumps({**asdict(report), "goal_level": GOAL_LEVEL, "goal_ratio": GOAL_RATIO,
                          "goal_met": report.goal_met, "torch": torch.__version__}, indent=2))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
