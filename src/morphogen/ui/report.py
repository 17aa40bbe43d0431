"""`morphogen report RUN_DIR`: the story of a finished (or running) run, rebuilt from its files.

Reads only what telemetry wrote (`events.jsonl`, `config.json`, `summary.json`), so it works on a
run directory copied from another machine and never imports the model, the env or the controller.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from morphogen.run_directory import MAX_JSON_BYTES, SCORES_FILENAME, is_seeds_directory, read_regular_file
from morphogen.telemetry.events import (
    ALL_ENVS,
    PHASES,
    ActionTaken,
    AnomalyDetected,
    EpisodeCompleted,
    EpochCompleted,
    Event,
    GovernorRollback,
    ImitationCompleted,
    PhaseTimes,
    PPOUpdateCompleted,
    RewardComputed,
    RoundCompleted,
    TelemetryLevelChanged,
)
from morphogen.telemetry.story import NEGATIVE_LOSS, SeedStory, seed_stories
from morphogen.ui.run_files import (
    IMITATION_ROUND,
    EvaluationEpisodes,
    RunDirectoryError,
    RunFiles,
    ScoreKind,
    events_by_round,
    load_run_files,
    nothing_kept,
    round_cell,
    round_of_events,
    score_kind,
    summary_number,
    task_label,
)
from morphogen.ui.seeds_report import MAX_HOSTS, MAX_NAME, render_seeds_report
from morphogen.ui.terminal_text import cut, printable, printable_wrap
from morphogen.ui.units import counted, format_flops, format_loss

__all__ = ["RunDirectoryError", "render_report"]

#: The controller of an evaluation that grows nothing, as `eval` names it in its table.
_NO_GROWTH = "no growth"

#: The most columns a line of the epoch table takes: an action's reason wraps onto lines under its first word beyond.
_LINE_WIDTH = 150
#: The fewest columns an action's reason is given per line, however wide the row before it (a long slot id).
_MIN_REASON_WIDTH = 40
#: The widest the epoch table's score column grows to hold the score's name ("val mean abs error").
_SCORE_WIDTH = 24

#: Where an action was taken: (round, env, epoch).
_Step = tuple[int, int, int]


def _round_name(round_number: int) -> str:
    """A round as a line names it: "round 3", or "imitation" for the imitation warm start's episodes."""
    return "imitation" if round_number == IMITATION_ROUND else f"round {round_number}"


def _action_reasons(history: Sequence[Event]) -> dict[_Step, tuple[bool, str]]:
    """What each action did and why (the controller's words), or why it was refused (the gate's or the mask's), by
    where it was taken."""
    return {(round_number, event.env_id, event.epoch): (event.succeeded, event.reason) for round_number, event in
            round_of_events(history) if isinstance(event, ActionTaken) and event.reason}


def _outcome_text(e: EpochCompleted, taken: tuple[bool, str] | None, previous: str) -> tuple[str, str]:
    """What follows an action in the epoch table, as its opening and the reason after it: why it was refused, what it
    did and why, or, for a wait, why, where that differs from the wait before (`previous`)."""
    reason = "" if taken is None else taken[1]
    if not e.action_succeeded:
        return ("  (refused: ", reason) if reason else ("  (refused)", "")
    # A taken action's reason says why after a colon ("pruned r0c1: ..."); without one it only repeats the action.
    if ": " not in reason or (e.action == "WAIT" and reason == previous):
        return "", ""
    return "  (", reason


def _row_with_reason(row: str, reason: str) -> list[str]:
    """`row` followed by `reason` in brackets, escaped and wrapped within `_LINE_WIDTH` onto lines indented under its
    first word, so that the whole reason (a gate's figures come last) is shown, never cut."""
    head = printable(row)
    if not reason:
        return [head]
    first, *rest = printable_wrap(reason + ")", max(_LINE_WIDTH - len(head), _MIN_REASON_WIDTH))
    return [head + first, *(" " * len(head) + line for line in rest)]


def _epoch_rows(epochs: Sequence[tuple[int, EpochCompleted]], with_round: bool, score: ScoreKind,
                reasons: dict[_Step, tuple[bool, str]]) -> list[str]:
    round_header = f"{'round':>5}  " if with_round else ""
    shows_score = score.name != NEGATIVE_LOSS  # a negated loss: the loss column says it
    # As wide as the score's name, up to `_SCORE_WIDTH`: "val mean abs error" whole, not "val mean …".
    width = min(max(len(f"val {score.label}"), 10), _SCORE_WIDTH)
    title = f"{cut(f'val {score.label}', width):>{width}}  " if shows_score else ""
    lines = [f"  {round_header}{'env':>3}  {'epoch':>5}  {title}{'val loss':>10}  {'params':>9}  action"]
    previous_wait = ""
    for round_number, e in epochs:
        taken = reasons.get((round_number, e.env_id, e.epoch))
        opening, reason = _outcome_text(e, taken, previous_wait)
        if e.action == "WAIT" and taken is not None:
            previous_wait = taken[1]
        round_column = f"{round_cell(round_number):>5}  " if with_round else ""
        score_cell = f"{score.format(e.val_accuracy):>{width}}  " if shows_score else ""
        row = (f"  {round_column}{e.env_id:>3}  {e.epoch:>5}  {score_cell}{format_loss(e.val_loss):>10}  "
               f"{e.param_count:>9,}  {e.action}{opening}")
        lines.extend(_row_with_reason(row, reason))
    return lines


def _env_name(env_id: int, evaluation: EvaluationEpisodes | None) -> str:
    """`env 3`, or in an evaluation `env 3, heuristic episode 2`."""
    return f"env {env_id}" if evaluation is None else evaluation.label(env_id)


def _episode_section(history: Sequence[Event], training: bool, score: ScoreKind,
                     evaluation: EvaluationEpisodes | None = None) -> list[str]:
    """A run: every epoch of env 0 (of an evaluation, the first controller's first episode). A training run: one row
    per episode, then the last round's env 0 epochs."""
    epochs = [(r, e) for r, e in round_of_events(history) if isinstance(e, EpochCompleted)]
    if not epochs:
        return []
    reasons = _action_reasons(history)
    if not training:
        return [f"epochs ({_env_name(0, evaluation)}):",
                *_epoch_rows([(r, e) for r, e in epochs if e.env_id == 0], False, score, reasons)]
    final, width = _final_column(score)
    lines = ["episodes:", f"  {'round':>5}  {'env':>3}  {final:>{width}}  {'params':>9}  {'added':>8}  "
             f"{'fossilized':>10}  {'pruned':>6}  {'return':>8}"]
    for round_number, e in round_of_events(history):
        if isinstance(e, EpisodeCompleted):
            lines.append(f"  {round_cell(round_number):>5}  {e.env_id:>3}  {score.format(e.final_accuracy):>{width}}  "
                         f"{e.param_count:>9,}  {e.param_count - e.host_param_count:>8,}  {e.fossilized:>10}  "
                         f"{e.pruned:>6}  {e.episode_return:>+8.3f}")
    last = max(r for r, _ in epochs)
    return [*lines, "", f"epochs of {_round_name(last)} (env 0):",
            *_epoch_rows([(r, e) for r, e in epochs if r == last and e.env_id == 0], True, score, reasons)]


def _seed_section(history: Sequence[Event], training: bool, score: ScoreKind,
                  summary: Mapping[str, Any] | None = None, *, without_events: bool = False,
                  evaluation: EvaluationEpisodes | None = None, minimal: bool = False) -> list[str]:
    stories_by_round: list[tuple[int, SeedStory]] = []
    for round_number, events_of_round in events_by_round(history).items():
        stories_by_round.extend((round_number, story) for story in seed_stories(events_of_round))
    if not stories_by_round:
        named = _summary_seeds(summary)
        if named:  # the events were cut short, lost or never written; the summary still says what grew
            where = ("no events written" if without_events else "not recorded at --telemetry minimal" if minimal
                     else "none in the events that could be read")
            return [f"seeds: {where}; summary.json names {len(named)}: {', '.join(named)}"]
        return ["seeds: none germinated"]
    lines = []
    if training:
        outcomes = Counter(story.outcome for _, story in stories_by_round)
        lines.append(f"seeds, every round: {len(stories_by_round)} germinated, {outcomes['fossilized']} "
                     f"fossilized, {outcomes['pruned']} pruned, {outcomes['alive']} alive at the episode's end")
        last = stories_by_round[-1][0]
        stories_by_round = [(r, story) for r, story in stories_by_round if r == last]
        lines.append(f"seeds of {_round_name(last)} ({len(stories_by_round)}):")
    else:
        lines.append(f"seeds ({len(stories_by_round)}):")
    for round_number, story in stories_by_round:
        where = f"{_round_name(round_number)} env {story.env_id}" if training else _env_name(story.env_id, evaluation)
        lines.append(f"  {where}  {story.blueprint:<11} {story.slot:<5} germinated@{story.germinated:<3} "
                     f"{story.path_before_outcome():<40} {story.ending():<15} predicted "
                     f"{score.contribution(story, predicted=True)}  measured {score.contribution(story)}")
    return lines


def _summary_seeds(summary: Mapping[str, Any] | None) -> list[str]:
    """The grown run's seeds as summary.json lists them (untrusted: short strings only), "blueprint in slot
    (outcome)"; at most `MAX_HOSTS`."""
    grown = summary.get("grown") if isinstance(summary, Mapping) else None
    seeds = grown.get("seeds") if isinstance(grown, Mapping) else None
    named = []
    for seed in (seeds if isinstance(seeds, list) else [])[:MAX_HOSTS]:
        parts = [seed.get(key) if isinstance(seed, Mapping) else None for key in ("blueprint", "slot", "outcome")]
        if all(isinstance(part, str) and 0 < len(part) <= MAX_NAME for part in parts):
            named.append(f"{parts[0]} in {parts[1]} ({parts[2]})")
    return named


def _reward_section(history: Sequence[Event], evaluation: EvaluationEpisodes | None = None, *,
                    paired_baseline: bool = False) -> list[str]:
    """The reward's components summed over the run; of an evaluation, per controller and averaged over its
    episodes (adding the learned policy's rewards to those of the heuristic and of no growth says nothing), then
    each controller's return over no growth on the same seed: the figure `train` with `paired_baseline` reports.

    Every component is an episode's own reward; `paired_baseline` (a training run that subtracted a no-growth
    twin's reward from each step's) says so in the heading, since the rounds' returns are net of the twin."""
    totals: dict[str | None, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    returns: dict[int, float] = defaultdict(float)
    for event in history:
        if isinstance(event, RewardComputed):
            controller = None if evaluation is None else evaluation.controller(event.env_id)
            for name, value in event.components:
                totals[controller][name] += value
            returns[event.env_id] += event.total
    if not totals:
        return []
    if evaluation is None:
        parts = "  ".join(f"{name} {value:+.3f}" for name, value in totals[None].items())
        own = "; each env's own reward, before its no-growth twin's is subtracted" if paired_baseline else ""
        return [f"reward by component (summed over all envs and epochs{own}): {parts}"]
    lines = ["reward by component (per episode, mean over each controller's episodes; each episode's own reward, "
             "nothing subtracted):"]
    for controller, components in totals.items():
        parts = "  ".join(f"{name} {value / evaluation.episodes:+.3f}" for name, value in components.items())
        lines.append(f"  {printable(controller or 'other envs'):<12}{parts}")
    return lines + _return_over_no_growth(returns, evaluation)


def _return_over_no_growth(returns: Mapping[int, float], evaluation: EvaluationEpisodes) -> list[str]:
    """Each controller's episode return minus no growth's on the same seed, mean over the seeds both played: what a
    round's return of `train --paired-baseline` measures (its no-growth twin is that same host on the same batches)."""
    if _NO_GROWTH not in evaluation.controllers:
        return []
    baseline = evaluation.controllers.index(_NO_GROWTH) * evaluation.episodes
    parts = []
    for position, controller in enumerate(evaluation.controllers):
        if controller == _NO_GROWTH:
            continue
        first = position * evaluation.episodes
        differences = [returns[first + index] - returns[baseline + index] for index in range(evaluation.episodes)
                       if first + index in returns and baseline + index in returns]
        if differences:
            parts.append(f"{printable(controller)} {statistics.fmean(differences):+.3f}")
    if not parts:
        return []
    return [f"return over no growth on the same seed (per episode, mean; what `train` reports as a round's return "
            f"when a no-growth twin is subtracted, paired_baseline): {'  '.join(parts)}"]


def _imitation_lines(history: Sequence[Event]) -> list[str]:
    """The imitation warm start's fit, as `train` printed it."""
    return [f"imitation: watched the heuristic for {counted(e.rounds, 'round')} ({counted(e.episodes, 'episode')}, "
            f"round 'imit' above): action NLL {e.action_loss_before:.3f} -> {e.action_loss_after:.3f}, agreement "
            f"with the heuristic {100 * e.agreement:.1f}% of steps, value loss {e.value_loss:.3f}"
            for e in history if isinstance(e, ImitationCompleted)]


def _final_column(score: ScoreKind) -> tuple[str, int]:
    """The header of a column of final scores ("final acc", "final loss", "final <metric>") and its width."""
    header = f"final {cut(score.label, _SCORE_WIDTH)}"
    return header, max(len(header), 9)


def _training_section(history: Sequence[Event], score: ScoreKind, *, paired_baseline: bool = False) -> list[str]:
    """The imitation's fit and one row per round; with `paired_baseline`, a closing line saying that the rounds'
    return is net of the no-growth twins' (the episodes' returns and reward components are not)."""
    imitation = _imitation_lines(history)
    rounds = [e for e in history if isinstance(e, RoundCompleted)]
    if not rounds:
        return imitation
    updates = {e.round: e for e in history if isinstance(e, PPOUpdateCompleted)}
    final, width = _final_column(score)
    # Headed in words a newcomer reads: the round's PPO update's approximate KL divergence and its value head's
    # explained variance; the mean of the parameters the envs' seeds added.
    lines = [*imitation, "rounds:",
             f"  {'round':>5}  {'return':>8}  {final:>{width}}  {'params added':>12}  {'approx KL':>9}  "
             f"{'explained variance':>18}  {'seconds':>7}"]
    for r in rounds:
        update = updates.get(r.round)
        kl = "-" if update is None else f"{update.approx_kl:.4f}"
        explained = "-" if update is None else f"{update.explained_variance:+.2f}"
        lines.append(f"  {r.round:>5}  {r.mean_return:>+8.3f}  {score.format(r.mean_final_accuracy):>{width}}  "
                     f"{r.mean_parameters_added:>12,.0f}  {kl:>9}  {explained:>18}  {r.seconds:>7.1f}")
    if paired_baseline:
        lines.append("  (return: mean over the round's envs of each episode's return minus its no-growth twin's "
                     "(paired_baseline), what growth added; the episodes' returns and the reward by component are "
                     "their own)")
    return lines


def _health_section(history: Sequence[Event], training: bool,
                    evaluation: EvaluationEpisodes | None = None) -> list[str]:
    lines = []
    for round_number, event in round_of_events(history):
        where = "trainer" if event.env_id == ALL_ENVS else _env_name(event.env_id, evaluation)
        when = f"{_round_name(round_number)} epoch {event.epoch}" if training else f"epoch {event.epoch}"
        if isinstance(event, GovernorRollback):
            lines.append(f"  {when} {where}: rollback ({event.reason}); pruned "
                         f"{', '.join(event.pruned_slots) or 'nothing'}")
        elif isinstance(event, AnomalyDetected):
            lines.append(f"  {when} {where}: {event.anomaly}: {event.message}; {event.advice}")
        elif isinstance(event, TelemetryLevelChanged):
            lines.append(f"  {when}: telemetry {event.from_level} -> {event.to_level} ({event.reason})")
    return ["health:", *lines] if lines else ["health: no rollbacks, no anomalies"]


def _phase_section(history: Sequence[Event]) -> list[str]:
    totals: dict[str, float] = defaultdict(float)
    for event in history:
        if isinstance(event, PhaseTimes):
            for name, seconds in event.phases:
                totals[name] += seconds
    if not totals:
        return []
    # In the order and to the digits of the phase table `run` and `train` print at their end.
    names = [name for name in PHASES if name in totals] + [name for name in totals if name not in PHASES]
    return ["time by phase: " + ", ".join(f"{name} {totals[name]:.3f} s" for name in names)]


def _comparison_section(summary: dict[str, Any] | None, config: dict[str, Any]) -> list[str]:
    """The grown model, then no growth, the final architecture from scratch and the hosts compared with where
    summary.json holds them, each with its cost and wall time; nothing when it lacks the grown model's figures. Where
    no seed was kept, from scratch is the no-growth run, marked so, as the run's seed lines and seeds.json give it."""
    summary = summary or {}
    score = score_kind(summary)
    kept_none = nothing_kept(config, summary)
    scratch = summary.get("baseline" if kept_none else "from_scratch")
    parts = []
    for name, table in [("grown", summary.get("grown")), ("no growth", summary.get("baseline")),
                        ("from scratch", scratch), *hosts_compared(summary)]:
        accuracy, parameters = summary_number(table, "final_accuracy"), summary_number(table, "parameters")
        if accuracy is None or parameters is None:
            continue
        flops = summary_number(table.get("flops") if isinstance(table, dict) else None, "total")
        seconds = summary_number(table, "seconds")  # its training's wall time, as `run`'s table gives it
        marked = kept_none and name == "from scratch"
        parts.append(f"{name} {_score_text(score, accuracy)} with {parameters:,.0f} parameters"
                     + ("" if flops is None else f" and {format_flops(flops)}")
                     + ("" if seconds is None else f" in {seconds:.1f} s")
                     + (" (nothing kept: the final architecture is the host, so these are no growth's figures)"
                        if marked else ""))
    return ["; ".join(parts)] if parts and parts[0].startswith("grown ") else []


def evaluation_means(files: RunFiles) -> list[tuple[str, float, float | None]]:
    """Of an evaluation, (controller, mean final score, mean parameters added) over its episodes, as `eval` printed
    them, from eval.json (untrusted: finite numbers only); [] for another run or a table that cannot be read."""
    if files.evaluation is None:  # eval.json does not name the controllers config.json's episodes belong to
        return []
    try:
        table = json.loads(read_regular_file(files.path / SCORES_FILENAME, MAX_JSON_BYTES))
    except (OSError, ValueError, RecursionError):
        return []
    means = []
    for row in table if isinstance(table, list) else []:
        scores, added = (_finite_numbers(row.get(key)) for key in ("accuracies", "added"))
        if scores:
            means.append((row["name"], statistics.fmean(scores), statistics.fmean(added) if added else None))
    return means


def _evaluation_section(files: RunFiles) -> list[str]:
    """An evaluation's result in one line: each controller's mean final score and parameters added."""
    means = evaluation_means(files)
    if not means or files.evaluation is None:
        return []
    parts = [f"{name} {files.score.format(score)}" + ("" if added is None else f" adding {added:,.0f} parameters")
             for name, score, added in means]
    episodes = counted(files.evaluation.episodes, "episode")
    return [f"evaluation ({SCORES_FILENAME}, means over {episodes} each): {'; '.join(parts)}"]


def _finite_numbers(values: object) -> list[float]:
    """A list of eval.json as numbers, or [] where any entry is not a finite number within `MAX_MAGNITUDE`."""
    numbers = [summary_number({"value": value}, "value") for value in (values if isinstance(values, list) else [])]
    return [] if None in numbers else [number for number in numbers if number is not None]


def hosts_compared(summary: dict[str, object]) -> list[tuple[str, object]]:
    """(name, figures) of each host summary.json says the run compared with (names of at most `MAX_NAME`)."""
    fixed = summary.get("fixed")
    return [(entry["name"], entry) for entry in (fixed if isinstance(fixed, list) else [])[:MAX_HOSTS]
            if isinstance(entry, dict) and isinstance(entry.get("name"), str) and 0 < len(entry["name"]) <= MAX_NAME]


def _score_text(score: ScoreKind, value: float) -> str:
    """A final score in the report's closing line: accuracy, the loss itself, or the metric by its name."""
    if score.name == NEGATIVE_LOSS:  # the loss itself, not its negation
        return f"loss {-value:.4g}"
    return score.format(value) if score.is_accuracy else f"{score.name} {score.format(value)}"


def render_report(run_dir: str | Path) -> str:
    """The whole report as text, every string from the run with its control characters escaped; of a run over
    several seeds, its figures over them (`seeds_report.py`)."""
    if is_seeds_directory(run_dir):
        return render_seeds_report(run_dir)
    files = load_run_files(run_dir, without_events=True)
    config, history, training = files.config, files.history, files.is_training
    notes = [note for note in (files.damage_note(), files.recording_note) if note]
    header = (f"run {files.path}: task {task_label(config) or '?'}, seed {config.get('seed', '?')}, "
              f"{len(history)} events" + (f" ({'; '.join(notes)})" if notes else ""))
    reward = _reward_section(history, files.evaluation, paired_baseline=files.paired_baseline) \
        if files.steered_by_reward else []
    score = files.score
    evaluation = files.evaluation
    sections = [[header], _episode_section(history, training, score, evaluation),
                _seed_section(history, training, score, files.summary, without_events=files.without_events,
                              evaluation=evaluation, minimal=files.recording_note is not None),
                reward,
                _training_section(history, score, paired_baseline=files.paired_baseline),
                [] if files.without_events else _health_section(history, training, evaluation),
                _phase_section(history),
                _comparison_section(files.summary, config),
                _evaluation_section(files)]
    text = "\n\n".join("\n".join(section) for section in sections if section)
    return "\n".join(printable(line) for line in text.split("\n"))
