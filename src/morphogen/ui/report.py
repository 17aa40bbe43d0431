"""`morphogen report RUN_DIR`: the story of a finished (or running) run, rebuilt from its files.

Reads only what telemetry wrote (`events.jsonl`, `config.json`, `summary.json`), so it works on a
run directory copied from another machine and never imports the model, the env or the controller.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from morphogen.telemetry.events import (
    ALL_ENVS,
    AnomalyDetected,
    EpochCompleted,
    Event,
    GovernorRollback,
    PhaseTimes,
    PPOUpdateCompleted,
    RewardComputed,
    RoundCompleted,
    TelemetryLevelChanged,
)
from morphogen.telemetry.sinks import EVENTS_FILENAME, read_events
from morphogen.telemetry.story import seed_stories


class RunDirectoryError(ValueError):
    """A path that is not a readable morphogen run directory."""


def load_run(run_dir: str | Path) -> tuple[dict[str, object], list[Event]]:
    """The resolved config and the events of a run directory."""
    path = Path(run_dir)
    events_file = path / EVENTS_FILENAME
    if not path.is_dir():
        raise RunDirectoryError(f"{path} is not a directory (expected a run directory under runs/)")
    if not events_file.is_file():
        raise RunDirectoryError(f"{path} has no {EVENTS_FILENAME} (was the run made with --telemetry off?)")
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        history = read_events(events_file)
    except (ValueError, OSError) as error:
        raise RunDirectoryError(f"{path}: {str(error).splitlines()[0]}") from None
    return config, history


def _episode_section(history: Sequence[Event]) -> list[str]:
    epochs = [e for e in history if isinstance(e, EpochCompleted) and e.env_id == 0]
    if not epochs:
        return []
    lines = ["epochs (env 0):", f"  {'epoch':>5}  {'val acc':>8}  {'val loss':>8}  {'params':>9}  action"]
    for e in epochs:
        outcome = "" if e.action_succeeded else "  (refused)"
        lines.append(f"  {e.epoch:>5}  {e.val_accuracy:>7.2f}%  {e.val_loss:>8.4f}  {e.param_count:>9,}  "
                     f"{e.action}{outcome}")
    return lines


def _seed_section(history: Sequence[Event]) -> list[str]:
    stories = seed_stories(history)
    lines = [f"seeds ({len(stories)}):"]
    for story in stories:
        contribution = "-" if story.contribution is None else f"{story.contribution:+.2f} pts"
        ending = story.outcome if story.outcome_epoch is None else f"{story.outcome}@{story.outcome_epoch}"
        lines.append(f"  env {story.env_id}  {story.blueprint:<11} {story.slot:<5} germinated@{story.germinated:<3} "
                     f"{story.stage_path():<48} {ending:<15} contribution {contribution}")
    return lines if stories else ["seeds: none germinated"]


def _reward_section(history: Sequence[Event]) -> list[str]:
    totals: dict[str, float] = defaultdict(float)
    for event in history:
        if isinstance(event, RewardComputed):
            for name, value in event.components:
                totals[name] += value
    if not totals:
        return []
    parts = "  ".join(f"{name} {value:+.3f}" for name, value in totals.items())
    return [f"reward by component (summed over all envs and epochs): {parts}"]


def _training_section(history: Sequence[Event]) -> list[str]:
    rounds = [e for e in history if isinstance(e, RoundCompleted)]
    if not rounds:
        return []
    updates = {e.round: e for e in history if isinstance(e, PPOUpdateCompleted)}
    lines = ["rounds:", f"  {'round':>5}  {'return':>8}  {'final acc':>9}  {'added':>8}  {'kl':>7}  {'ev':>6}  "
             f"{'seconds':>7}"]
    for r in rounds:
        update = updates.get(r.round)
        kl = "-" if update is None else f"{update.approx_kl:.4f}"
        explained = "-" if update is None else f"{update.explained_variance:+.2f}"
        lines.append(f"  {r.round:>5}  {r.mean_return:>+8.3f}  {r.mean_final_accuracy:>8.2f}%  "
                     f"{r.mean_parameters_added:>8,.0f}  {kl:>7}  {explained:>6}  {r.seconds:>7.1f}")
    return lines


def _health_section(history: Sequence[Event]) -> list[str]:
    lines = []
    for event in history:
        where = "trainer" if event.env_id == ALL_ENVS else f"env {event.env_id}"
        if isinstance(event, GovernorRollback):
            lines.append(f"  epoch {event.epoch} {where}: rollback ({event.reason}); pruned "
                         f"{', '.join(event.pruned_slots) or 'nothing'}")
        elif isinstance(event, AnomalyDetected):
            lines.append(f"  epoch {event.epoch} {where}: {event.anomaly}: {event.message}; {event.advice}")
        elif isinstance(event, TelemetryLevelChanged):
            lines.append(f"  epoch {event.epoch}: telemetry {event.from_level} -> {event.to_level} ({event.reason})")
    return ["health:", *lines] if lines else ["health: no rollbacks, no anomalies"]


def _phase_section(history: Sequence[Event]) -> list[str]:
    totals: dict[str, float] = defaultdict(float)
    for event in history:
        if isinstance(event, PhaseTimes):
            for name, seconds in event.phases:
                totals[name] += seconds
    if not totals:
        return []
    return ["time by phase: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in totals.items())]


def render_report(run_dir: str | Path) -> str:
    """The whole report as text."""
    config, history = load_run(run_dir)
    task = config.get("task", "?")
    header = f"run {Path(run_dir)}: task {task}, seed {config.get('seed', '?')}, {len(history)} events"
    sections = [[header], _episode_section(history), _seed_section(history), _reward_section(history),
                _training_section(history), _health_section(history), _phase_section(history)]
    summary_file = Path(run_dir) / "summary.json"
    if summary_file.is_file():
        summary = json.loads(summary_file.read_text())
        grown, baseline = summary.get("grown") or {}, summary.get("baseline") or {}
        if grown and baseline:
            sections.append([f"grown {grown['final_accuracy']:.2f}% with {grown['parameters']:,} parameters; "
                             f"no growth {baseline['final_accuracy']:.2f}% with {baseline['parameters']:,}"])
    return "\n\n".join("\n".join(section) for section in sections if section)
