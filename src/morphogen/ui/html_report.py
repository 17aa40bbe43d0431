"""`morphogen report RUN_DIR --html`: one self-contained `report.html` with the run's figures.

The page holds inline SVG only (see `ui/svg.py`): no script, no stylesheet or font from a network, so it
opens offline, in a mail attachment or an artifact store, exactly as written. Its sections:

- accuracy and parameters over epochs against the no-growth baseline and the final architecture
  trained from scratch (`run`), or the per-round means (`train`);
- the controller's decisions: every action but a wait, with its epoch, whether it was carried out and why (the
  controller's measured reason, or the gate's figure and threshold for a refusal), as the text report gives them;
- a timeline with one bar per seed, coloured by lifecycle stage (a `run`'s seeds, or the last round's);
- contributions: predicted (the shadow contribution measured while the seed trained behind the host,
  the `with:<slot>` counterfactual) against measured (acc with it minus acc without it once blended);
- reward components per epoch (a `run` with a learned policy) or per round (`train`), PPO curves per
  round (a heuristic run has no reward section: the heuristic never reads the reward);
- anomalies and rollbacks.

Like the text report it reads only the run directory (`ui/run_files.py`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from morphogen.run_directory import REPORT_FILENAME, DiskFullError, run_of_file, write_atomic
from morphogen.telemetry.events import (
    ALL_ENVS,
    ActionTaken,
    AnomalyDetected,
    EpochCompleted,
    Event,
    GovernorRollback,
    PPOUpdateCompleted,
    RewardComputed,
    RoundCompleted,
)
from morphogen.telemetry.story import NEGATIVE_LOSS, SeedStory, seed_stories
from morphogen.ui.report import evaluation_means, hosts_compared
from morphogen.ui.run_files import (
    EvaluationEpisodes,
    RunDirectoryError,
    RunFiles,
    ScoreKind,
    events_by_round,
    load_run_files,
    round_of_events,
    score_kind,
    summary_number,
    task_label,
)
from morphogen.ui.stages import STAGE_COLOURS, stage_colour
from morphogen.ui.svg import Segment, Series, line_chart, scatter_chart, timeline_chart
from morphogen.ui.terminal_text import printable
from morphogen.ui.units import counted, format_flops, format_loss

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1180px; color: #212121; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
.meta { color: #616161; } .grid { display: flex; flex-wrap: wrap; gap: 12px; }
svg { background: #fff; border: 1px solid #e0e0e0; border-radius: 4px; }
svg .title { font-size: 13px; font-weight: 600; text-anchor: middle; } svg .tick { font-size: 10px; fill: #616161; }
svg .label { font-size: 11px; fill: #424242; } svg .legend { font-size: 11px; fill: #212121; }
svg .grid { stroke: #eeeeee; } svg .axis { stroke: #9e9e9e; } svg .diagonal { stroke: #9e9e9e; stroke-dasharray: 4 3; }
table { border-collapse: collapse; font-size: 13px; } td, th { padding: 3px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; background: #fafafa; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.none { color: #2e7d32; }
"""


@dataclass(frozen=True)
class ContributionPair:
    """One seed's last shadow contribution before blending and last measured contribution after."""

    label: str
    predicted: float
    measured: float


def _epochs(events: Sequence[Event], env_id: int = 0) -> list[EpochCompleted]:
    return [e for e in events if isinstance(e, EpochCompleted) and e.env_id == env_id]


def growth_charts(files: RunFiles) -> list[str]:
    """Accuracy and parameters: per epoch for a run, against no growth and the final architecture trained
    from scratch (those it recorded), per round for a training run."""
    if files.is_training:
        rounds = [e for e in files.history if isinstance(e, RoundCompleted)]
        return [
            line_chart([Series("mean final accuracy", tuple((r.round, r.mean_final_accuracy) for r in rounds))],
                       title="final accuracy per round (mean over envs)", x_label="round", y_label="accuracy %"),
            line_chart([Series("parameters added", tuple((r.round, r.mean_parameters_added) for r in rounds))],
                       title="parameters added per round (mean over envs)", x_label="round", y_label="parameters"),
        ]
    curves = [("grown", _epochs(files.history), False),
              ("no growth", _epochs([timed.event for timed in files.baseline_events]), True),
              ("from scratch", _epochs([timed.event for timed in files.from_scratch_events]), True)]
    shown = [(name, epochs, dashed) for name, epochs, dashed in curves if epochs or name == "grown"]
    score = files.score
    return [
        line_chart([Series(name, tuple((e.epoch, score.shown(e.val_accuracy)) for e in epochs), dashed)
                    for name, epochs, dashed in shown], title=f"validation {score.title}", x_label="epoch",
                   y_label=score.axis),
        line_chart([Series(name, tuple((e.epoch, float(e.param_count)) for e in epochs), dashed)
                    for name, epochs, dashed in shown], title="parameters", x_label="epoch", y_label="parameters"),
    ]


def _shown_stories(files: RunFiles) -> tuple[list[tuple[int, SeedStory]], dict[tuple[int, int], int]]:
    """The seeds to draw (a run's, or the last round's) with their round, and each (round, env)'s last epoch."""
    by_round: dict[int, list[Event]] = defaultdict(list)
    last_epoch: dict[tuple[int, int], int] = {}
    for round_number, event in round_of_events(files.history):
        by_round[round_number].append(event)
        if isinstance(event, EpochCompleted):
            last_epoch[(round_number, event.env_id)] = event.epoch
    stories = [(r, story) for r, events in sorted(by_round.items()) for story in seed_stories(events)]
    if files.is_training and stories:
        last = stories[-1][0]
        stories = [(r, story) for r, story in stories if r == last]
    return stories, last_epoch


def seed_segments(story: SeedStory, episode_end: int) -> list[Segment]:
    """A seed's life as coloured stretches: each stage from the epoch it was entered to the next one.

    A fossilized seed stays until the episode's end; a pruned one is marked for one epoch; a seed still
    alive at the end of the events runs to `episode_end`.
    """
    entered = [("germinated", story.germinated), *story.stages.items()]
    segments = []
    for index, (stage, start) in enumerate(entered):
        if index + 1 < len(entered):
            end = entered[index + 1][1]
        elif stage == "pruned":
            end = start + 1
        else:
            end = max(episode_end, start + 1)
        shown_end = max(float(end), start + 0.5)  # a stage entered and left in one epoch still shows
        segments.append(Segment(start, shown_end, stage_colour(stage), f"{stage} from epoch {start}"))
    return segments


def timeline_section(files: RunFiles) -> str:
    stories, last_epoch = _shown_stories(files)
    rows = []
    evaluation = files.evaluation
    for round_number, story in stories:
        where = (f"env {story.env_id} " if files.is_training
                 else f"{evaluation.label(story.env_id)}: " if evaluation is not None else "")
        end = last_epoch.get((round_number, story.env_id), story.germinated + 1)
        rows.append((f"{where}{story.slot} {story.blueprint}", seed_segments(story, end)))
    title = "seeds by stage" + (f" (round {stories[-1][0]})" if files.is_training and stories else "")
    return timeline_chart(rows, title=title, x_label="epoch", legend=list(STAGE_COLOURS.items())[1:])


def contribution_pairs(history: Sequence[Event], score: ScoreKind | None = None,
                       evaluation: EvaluationEpisodes | None = None) -> list[ContributionPair]:
    """Per seed that was both shadow-measured and measured blended: its last value of each, in the unit its gates
    judged (`score`; accuracy points when None). A seed is (round, env, slot, germination); an evaluation's env
    is named by its controller and episode."""
    score = ScoreKind() if score is None else score
    pairs = []
    for round_number, events in events_by_round(history).items():
        for story in seed_stories(events):
            predicted = score.contribution_value(story, predicted=True)
            measured = score.contribution_value(story)
            if predicted is None or measured is None:
                continue
            if evaluation is not None:
                where = f"{evaluation.label(story.env_id)}: "
            else:
                where = f"r{round_number} env {story.env_id} " if round_number != 1 or story.env_id else ""
            pairs.append(ContributionPair(f"{where}{story.slot} {story.blueprint}@{story.germinated}", predicted,
                                          measured))
    return pairs


def reward_chart(files: RunFiles) -> str:
    """Reward components: per epoch of env 0 (run), or summed per round and averaged over envs (train)."""
    components: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    envs_per_round: dict[int, set[int]] = defaultdict(set)
    for round_number, event in round_of_events(files.history):
        if not isinstance(event, RewardComputed):
            continue
        if files.is_training:
            envs_per_round[round_number].add(event.env_id)
            for name, value in event.components:
                components[name][round_number] += value
        elif event.env_id == 0:
            for name, value in event.components:
                components[name][event.epoch] += value
    if files.is_training:
        for values in components.values():
            for round_number in values:
                values[round_number] /= max(len(envs_per_round[round_number]), 1)
    series = [Series(name, tuple(sorted(values.items()))) for name, values in components.items()]
    x_label = "round" if files.is_training else "epoch"
    return line_chart(series, title=_reward_chart_title(files), x_label=x_label, y_label="reward")


def _reward_chart_title(files: RunFiles) -> str:
    """What the reward chart shows: a training run's per-episode means (its envs' own rewards), or one episode."""
    if files.is_training:
        own = "; each env's own, its no-growth twin's not subtracted" if files.paired_baseline else ""
        return f"reward by component (per episode, mean over envs{own})"
    evaluation = files.evaluation
    return "reward by component" + (f" ({evaluation.label(0)})" if evaluation is not None else "")


def ppo_charts(history: Sequence[Event]) -> list[str]:
    updates = [e for e in history if isinstance(e, PPOUpdateCompleted)]
    if not updates:
        return []

    def curve(name: str, values: Sequence[float]) -> Series:
        return Series(name, tuple((u.round, v) for u, v in zip(updates, values, strict=True)))

    heads = [head for head, _ in updates[0].entropy_per_head]
    entropy = [Series(head, tuple((u.round, dict(u.entropy_per_head).get(head, float("nan"))) for u in updates))
               for head in heads]
    return [
        line_chart([curve("policy loss", [u.policy_loss for u in updates]),
                    curve("value loss", [u.value_loss for u in updates])],
                   title="PPO losses", x_label="round", y_label="loss"),
        line_chart([curve("approx KL", [u.approx_kl for u in updates]),
                    curve("clip fraction", [u.clip_fraction for u in updates])],
                   title="PPO KL and clipping", x_label="round", y_label="value"),
        line_chart([curve("explained variance", [u.explained_variance for u in updates])],
                   title="value head: explained variance", x_label="round", y_label="explained variance"),
        line_chart(entropy, title="policy entropy per head", x_label="round", y_label="entropy (nats)"),
    ]


def health_table(files: RunFiles) -> str:
    rows = []
    for round_number, event in round_of_events(files.history):
        evaluation = files.evaluation
        where = ("trainer" if event.env_id == ALL_ENVS
                 else evaluation.label(event.env_id) if evaluation is not None else f"env {event.env_id}")
        when = f"{round_number}" if files.is_training else "-"
        if isinstance(event, AnomalyDetected):
            rows.append((when, str(event.epoch), where, event.anomaly, f"{event.message}; {event.advice}"))
        elif isinstance(event, GovernorRollback):
            rows.append((when, str(event.epoch), where, "rollback",
                         f"{event.reason}; pruned {', '.join(event.pruned_slots) or 'nothing'}"))
    if not rows:
        return '<p class="none">No anomalies and no rollbacks.</p>'
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr><th>round</th><th>epoch</th><th>where</th><th>what</th><th>detail</th></tr>{body}</table>"


def decisions_table(files: RunFiles) -> str:
    """Every action but a wait that env 0 took (of a training run, in its last round), with its epoch, whether it was
    carried out and the reason the events give: the controller's measured one, or the gate's figure and threshold
    for a refusal, as the text report's epoch table gives them; "" when there is none."""
    actions = [(round_number, event) for round_number, event in round_of_events(files.history)
               if isinstance(event, ActionTaken) and event.op != "WAIT" and event.env_id == 0]
    if files.is_training and actions:
        last = actions[-1][0]
        actions = [(r, event) for r, event in actions if r == last]
    rows = "".join(_decision_row(event) for _, event in actions)
    if not rows:
        return ""
    caption = _decisions_caption(files, actions[-1][0])
    return (f"<div>{caption}<table><tr><th>epoch</th><th>action</th><th>outcome</th><th>why</th></tr>{rows}"
            "</table></div>")


def _decision_row(event: ActionTaken) -> str:
    """One row of the decisions table: epoch, action, outcome and why."""
    action = " ".join(part for part in (event.op, event.slot, event.blueprint) if part)
    return (f"<tr><td class='num'>{event.epoch}</td><td>{escape(action)}</td>"
            f"<td>{'carried out' if event.succeeded else 'refused'}</td><td>{escape(event.reason or '-')}</td></tr>")


def _decisions_caption(files: RunFiles, last_round: int) -> str:
    """Which episode the decisions table shows: a training run's last round, or the evaluation's first episode."""
    where = (f"round {last_round}, env 0" if files.is_training
             else files.evaluation.label(0) if files.evaluation is not None else "")
    return f"<p class='meta'>{escape(where)}</p>" if where else ""


def summary_table(files: RunFiles) -> str:
    """The closing table of `run`: grown, no growth, the final architecture trained from scratch, and the hosts it
    was compared with (`--compare`), as `run`'s closing table and the text report show them."""
    summary = files.summary or {}
    if not summary.get("grown"):
        return ""
    columns = [("grown", summary.get("grown")), ("no growth", summary.get("baseline")),
               ("from scratch", summary.get("from_scratch")), *hosts_compared(summary)]
    score = score_kind(summary)
    score_row = [] if score.name == NEGATIVE_LOSS else [  # the loss row says it for a negated loss
        (f"final val {score.name}", "final_accuracy", "{:.2f}%" if score.is_accuracy else "{:.4g}")]
    rows = [*score_row, ("final val loss", "final_loss", ""),
            ("parameters", "parameters", "{:,.0f}"), ("training FLOPs", "flops", ""),
            ("wall time", "seconds", "{:.1f} s")]

    def cell(column: object, key: str, form: str) -> str:
        if key == "flops":  # a table of its own: {"total": ..., "training": ..., ...}
            total = summary_number(column.get("flops") if isinstance(column, dict) else None, "total")
            return "-" if total is None else format_flops(total)
        value = summary_number(column, key)
        if value is None:
            return "-"
        return format_loss(value) if key == "final_loss" else form.format(value)

    body = "".join(
        f"<tr><td>{escape(name)}</td>"
        + "".join(f"<td class='num'>{cell(column, key, form)}</td>" for _, column in columns)
        + "</tr>" for name, key, form in rows)
    header = "".join(f"<th>{escape(title)}</th>" for title, _ in columns)
    return f"<table><tr><th></th>{header}</tr>{body}</table>"


def evaluation_table(files: RunFiles) -> str:
    """An evaluation's result as `eval` printed it: each controller's mean final score and parameters added over its
    episodes (eval.json); "" for another run."""
    means = evaluation_means(files)
    if not means or files.evaluation is None:
        return ""
    body = "".join(f"<tr><td>{escape(name)}</td><td class='num'>{escape(files.score.format(score))}</td>"
                   f"<td class='num'>{'-' if added is None else f'{added:,.0f}'}</td></tr>"
                   for name, score, added in means)
    episodes = counted(files.evaluation.episodes, "episode")
    return (f"<table><tr><th>controller (means over {episodes} each)</th>"
            f"<th>final val {escape(files.score.title)}</th><th>parameters added</th></tr>{body}</table>")


def _section(title: str, *figures: str) -> str:
    shown = [figure for figure in figures if figure]
    if not shown:
        return ""
    return f"<h2>{escape(title)}</h2><div class='grid'>{''.join(shown)}</div>"


def render_html(run_dir: str | Path) -> str:
    """The whole report as one HTML document."""
    files = load_run_files(run_dir)
    config = files.config
    kind = "training run" if files.is_training else "evaluation" if files.evaluation is not None else "run"
    score = files.score
    pairs = contribution_pairs(files.history, score, files.evaluation)
    unit = score.contribution_unit
    contributions = scatter_chart([(p.predicted, p.measured, p.label) for p in pairs],
                                  title="contribution: predicted (shadow) vs measured",
                                  x_label=f"predicted: shadow contribution ({unit})",
                                  y_label=f"measured ({unit})", value_text=score.contribution_text)
    sections = [
        _section("Result", summary_table(files), evaluation_table(files)),
        _section("Growth", *growth_charts(files)),
        _section("Decisions", decisions_table(files)),
        _section("Seeds", timeline_section(files), contributions),
        _section("Reward", reward_chart(files)) if files.steered_by_reward else "",
        _section("PPO", *ppo_charts(files.history)),
        f"<h2>Anomalies and rollbacks</h2>{health_table(files)}",
    ]
    title = f"morphogen {kind}: {task_label(config) or '?'}"
    notes = [note for note in (files.damage_note(), files.recording_note) if note]
    damage = f" ({'; '.join(notes)})" if notes else ""
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{escape(title)}</h1>"
            f"<p class='meta'>{escape(str(files.path))} · seed {escape(str(config.get('seed', '?')))} · "
            f"{len(files.events)} events{escape(damage)}</p>{''.join(sections)}</body></html>\n")
    # Strings from the run may hold control and bidirectional-override characters, which `escape` keeps: shown as
    # escapes on the page (and harmless to a terminal that prints the file), never obeyed.
    return printable(page, keep_newlines=True)


def write_html_report(run_dir: str | Path, path: str | Path | None = None) -> Path:
    """Write `render_html(run_dir)` to `path` (default RUN_DIR/report.html) and return where.

    Written atomically (missing parent directories are made): a link at `path` is replaced, never
    written through; a directory, a device or a FIFO there is refused with `RunDirectoryError`.
    """
    target = Path(run_dir) / REPORT_FILENAME if path is None else Path(path)
    run = run_of_file(target)
    if run is not None and target.name != REPORT_FILENAME:  # the report replaces an earlier report, nothing else
        raise RunDirectoryError(f"--output {target} would replace the {target.name} of the run in {run}; choose "
                                "another name")
    page = render_html(run_dir).encode("utf-8")
    try:
        write_atomic(target, page)  # whole or not at all, never through a link
    except DiskFullError:
        raise
    except OSError as error:
        raise RunDirectoryError(f"cannot write {target}: {error.strerror or error}") from None
    return target
