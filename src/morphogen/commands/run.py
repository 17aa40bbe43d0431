"""`morphogen run`: one episode with a controller, next to the same host trained without growth."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rich.progress import TaskID

from morphogen.commands.compared_hosts import check_settings, compared_tasks
from morphogen.commands.run_policy import recorded_policy_path, refuse_another_policy
from morphogen.commands.run_state import cut_events, load_training_state, remove_resume_state, save_training_state
from morphogen.config import build_config, config_to_dict, merge_tables, read_config_source
from morphogen.control.controller import NoGrowthController
from morphogen.control.heuristic import DEFAULT_DEPTH_BLUEPRINT, DEPTH_FALLBACK, HeuristicConfig, HeuristicController
from morphogen.core.lifecycle import Criterion
from morphogen.core.model import MorphogeneticModel
from morphogen.data import Task
from morphogen.data.tasks import InputStandardization
from morphogen.devices import resolve_device
from morphogen.env.actions import Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode, StepResult
from morphogen.env.optimizer import OptimizerConfig, resolved_optimizer_table, task_optimizer_config
from morphogen.env.play import Controller, EpisodeOutcome, run_episode
from morphogen.limits import MAX_EPOCHS, check_count
from morphogen.model_file import save_model_file
from morphogen.run_directory import (
    BASELINE_DIRNAME,
    CHECKPOINT_NAME,
    CONFIG_FILENAME,
    EVAL_RESUME_FILENAME,
    EVENTS_FILENAME,
    FIXED_DIRNAME,
    FROM_SCRATCH_DIRNAME,
    MODEL_FILENAME,
    RESUME_FILENAME,
    SCORES_FILENAME,
    SUMMARY_FILENAME,
    LockPurpose,
    RunDirectoryRefused,
    hold_run_directory,
    is_seeds_directory,
    make_run_dir,
    refuse_other_run,
    refuse_planted_link,
    remove_stale_temporaries,
    write_atomic,
)
from morphogen.session import SessionOptions, load_session_task
from morphogen.telemetry.anomalies import AnomalyDetector
from morphogen.telemetry.events import NON_FINITE_TOKENS
from morphogen.telemetry.profiler import PhaseTimer, TraceProfiler
from morphogen.telemetry.sinks import Telemetry
from morphogen.telemetry.story import NEGATIVE_LOSS
from morphogen.ui.progress import LINE_WIDTH, ProgressDisplay
from morphogen.ui.run_files import ScoreKind
from morphogen.ui.stages import stage_short
from morphogen.ui.terminal_text import cut, printable
from morphogen.ui.units import counted, format_flops, format_loss
from morphogen.user_paths import expand_path_settings


@dataclass(frozen=True)
class RunConfig(SessionOptions):
    """Settings of `morphogen run` (file keys and CLI flags share these names)."""

    #: Also train the bare host for comparison.
    baseline: bool = True
    #: Also train the grown model's final architecture (host + the seeds blended in at the end) from
    #: scratch for the same epochs: what growing it bought over simply building it that way.
    from_scratch: bool = True
    #: Epochs between two saves of each training's state (`resume.pt`, which `--resume` goes on from); a
    #: training's last epoch is always saved. 0: never (the run cannot be resumed).
    save_every: int = 1
    #: Other hosts trained without growth beside the grown one, by name (`--compare NAME=SPEC`): for a built-in
    #: task a table of host sizes as `[host]` takes (sizes left out are the grown host's), for a task of your own
    #: the import path of a function of no arguments building a host ("my_task:wide_host").
    compare_with: dict[str, dict[str, int] | str] = field(default_factory=dict)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    heuristic: HeuristicConfig = field(default_factory=HeuristicConfig)
    #: A learned policy decides instead of the heuristic (`--policy`): "default" (the policy shipped with morphogen),
    #: or a run directory or checkpoint of `morphogen train`; None: the heuristic. The run records a path absolute.
    policy: str | None = None
    #: SHA-256 of what `policy` acts with (its width, weights and observation statistics), filled in by the run from
    #: the checkpoint it loads (`commands/run_policy.py`): a resumed run refuses a policy of other weights. Setting it
    #: changes nothing else.
    policy_checksum: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        expand_path_settings(self, ("policy",))
        check_count("save_every", self.save_every, MAX_EPOCHS, lower=0)
        check_settings(self.task, self.compare_with)
        if self.policy is not None and not self.policy:
            raise ValueError("policy must name a policy (default, or a run directory of morphogen train), or be left "
                             "out for the heuristic")


def load_config(source: str | os.PathLike[str] | None = None, /, **tables: Any) -> RunConfig:
    """The settings of `morphogen run` from a preset's name (`morphogen list presets`) or a config file (TOML, JSON
    or YAML), with `tables` laid over them key by key: `load_config("grow_for_compute", heuristic={"warmup_fraction":
    0.4})`. Validated as `run --config` is: a bad key or value raises `ConfigError` naming its path. An
    `episode={"optimizer": {...}}` table is laid over the default optimizer of the config's task (SGD for digits);
    `morphogen.grow` lays it over your model's (AdamW for a transformer) when given the tables themselves."""
    values = merge_tables(read_config_source(source) if source is not None else {}, tables)
    return run_config_from_values(values, str(values.get("task", RunConfig.task)))


def run_config_from_values(values: Mapping[str, Any], task: str, topology: str = "") -> RunConfig:
    """`values` built into a `RunConfig`, an `[episode.optimizer]` table over `task`'s default optimizer."""
    episode = values.get("episode")
    if isinstance(episode, Mapping):
        optimizer = resolved_optimizer_table(episode.get("optimizer"), task, "episode.optimizer", topology=topology)
        if optimizer is not None:
            values = {**values, "episode": {**episode, "optimizer": optimizer}}
    return build_config(RunConfig, values)


#: What `grow(config=...)` and `Grower(config=...)` take: settings built, a preset's name or a config file's path,
#: or a mapping of its tables.
ConfigSource = RunConfig | str | os.PathLike[str] | Mapping[str, Any]


def settings_from(config: ConfigSource | None, task: str, topology: str = "") -> RunConfig:
    """`config` as settings; a file's or mapping's optimizer table laid over `task`'s default optimizer (that of
    its host's `topology` for a task of the user's own)."""
    if config is None or isinstance(config, RunConfig):
        return config or RunConfig()
    values = read_config_source(config) if isinstance(config, (str, os.PathLike)) else dict(config)
    return run_config_from_values(values, task, topology)


#: Columns the seeds part of an epoch line keeps at least before a refusal's reason moves to its own line.
MIN_SEED_COLUMNS = 24
#: Indentation of a refusal's reason printed below its epoch line.
REASON_INDENT = "      "


def format_step(result: StepResult, metric_name: str = "accuracy") -> str:
    """The progress line of one epoch: epoch, score (`metric_name`'s), loss, parameters, each seed, the action.

    Empty slots are left out; a seed shows as slot, blueprint, stage and alpha while it is blended in.
    Every line is at most `LINE_WIDTH` columns. When the line is too long the seeds part is cut (ending
    in an ellipsis), never the action: a refusal's reason that still does not fit goes below, on lines
    of its own, whole.
    """
    s = result.snapshot
    seeds = "  ".join(
        f"{printable(f'{slot.slot_id} {slot.blueprint}')} {stage_short(slot.stage.value)}"
        f"{f' a={slot.alpha:.2f}' if slot.alpha > 0 else ''}" for slot in s.slots if slot.blueprint is not None)
    action = Op(s.last_op).name
    rollback = "  ROLLBACK" if result.rollback is not None else ""
    score = _score_part(s.val_accuracy, metric_name)
    head = (f"epoch {s.epoch:3d}/{s.max_epochs}  {score}loss {format_loss(s.val_loss, 3)}  "
            f"params {s.active_parameters:>9,}  | ")
    outcome = "ok" if result.action_succeeded else f"refused: {result.reason}"
    tail = f" | {action} {outcome}{rollback}"
    room = LINE_WIDTH - len(head) - len(tail)
    if room >= min(len(seeds or "no seeds"), MIN_SEED_COLUMNS):
        return head + cut(seeds or "no seeds", room) + tail
    tail = f" | {action} refused{rollback}"
    line = head + cut(seeds or "no seeds", LINE_WIDTH - len(head) - len(tail)) + tail
    reason = textwrap.wrap(result.reason, LINE_WIDTH, initial_indent=REASON_INDENT, subsequent_indent=REASON_INDENT)
    return "\n".join([line, *reason])


def _score_part(score: float, metric_name: str) -> str:
    """An epoch line's score: accuracy in percent, a task's own metric by its name as a number, nothing for the
    negative loss (the loss beside it says it)."""
    if metric_name == "accuracy":
        return f"acc {score:6.2f}%  "
    return "" if metric_name == NEGATIVE_LOSS else f"{cut(printable(metric_name), 16)} {score:.4g}  "


#: Columns of outcomes per table: a label column and five fit in `LINE_WIDTH`.
TABLE_COLUMNS = 5


def print_summary(grown: EpisodeOutcome, baseline: EpisodeOutcome | None, out: TextIO,
                  from_scratch: EpisodeOutcome | None = None, metric_name: str = "accuracy",
                  criterion: Criterion = Criterion.SCORE, *, nothing_kept: bool = False,
                  fixed: Mapping[str, EpisodeOutcome] | None = None, decaying: bool = False,
                  last_reason: str = "") -> None:
    """The closing table: the grown model, the same host without growth, and the grown model's final
    architecture trained from scratch; the hosts `fixed` names, trained without growth, beside the grown model;
    then the story of every seed, its contributions in what `criterion` judges (accuracy points, or nats of
    validation loss removed). `metric_name` names the score row; `nothing_kept` says that no from-scratch run was
    trained because the final architecture is the host; `decaying`, that the learning rate decays over the run;
    `last_reason`, the controller's last word, which says why nothing grew when no seed germinated."""
    cells = _table_cells(grown, metric_name)
    columns = [("grown", grown), ("no growth", baseline), ("from scratch", from_scratch)]
    print("\n".join(_table_lines(columns, cells, from_scratch)), file=out)
    if nothing_kept:
        print("(from scratch: no seed was blended in, so the final architecture is the host itself)", file=out)
    note = None if baseline is None else noise_note(grown, baseline, metric_name, decaying=decaying)
    if note:
        print(textwrap.fill(note, LINE_WIDTH), file=out)
    if fixed:
        print("\nhosts to compare with, trained without growth (same data, epochs and seed):", file=out)
        named = [(cut(printable(name), 13), outcome) for name, outcome in fixed.items()]
        for start in range(0, len(named), TABLE_COLUMNS - 1):
            rows = _table_lines([("grown", grown), *named[start:start + TABLE_COLUMNS - 1]], cells)
            print("\n".join(rows).removeprefix("\n" if start == 0 else ""), file=out)
    _print_stories(grown, metric_name, criterion, out, last_reason)


def _table_cells(grown: EpisodeOutcome, metric_name: str) -> list[tuple[str, Callable[[EpisodeOutcome], str]]]:
    """The closing table's rows: each a label and how an outcome's cell reads."""
    percent = "%" if metric_name == "accuracy" else ""
    last = f"  last {len(grown.recent_scores)} epochs"
    cells: list[tuple[str, Callable[[EpisodeOutcome], str]]] = [
        (cut(f"final val {metric_name}", 30), lambda o: f"{o.final_accuracy:.{2 if percent else 4}f}{percent}"),
        ("final val loss", lambda o: format_loss(o.final_loss)),
        (last, lambda o: _score_range(o, 2 if percent else 4)),
        ("parameters", lambda o: f"{o.parameters:,}"),
        ("training FLOPs", lambda o: format_flops(o.flops.total)),
        ("  measuring seeds", lambda o: f"{100 * o.flops.measurement / max(o.flops.total, 1):.1f}%"),
        ("wall time", lambda o: f"{o.seconds:.1f} s"),
    ]
    if metric_name == NEGATIVE_LOSS:  # the score is the loss, negated: show the loss alone, and its range
        cells[:3] = [cells[1], (last, _loss_range)]
    return cells


def _print_stories(grown: EpisodeOutcome, metric_name: str, criterion: Criterion, out: TextIO,
                   last_reason: str = "") -> None:
    """Each seed's story: its path through the stages, how it ended, its predicted and measured contribution;
    where none germinated, the controller's last word on why."""
    print(f"\nseeds ({len(grown.stories)}):", file=out)
    if not grown.stories:
        print(textwrap.fill(f"none germinated (last epoch: {printable(last_reason)})" if last_reason else
                            "none germinated", LINE_WIDTH, initial_indent="  ", subsequent_indent="    "), file=out)
    judged = ScoreKind(metric_name, criterion.value)
    for story in grown.stories:
        predicted, measured = judged.contribution(story, predicted=True), judged.contribution(story)
        print(story_line(f"{printable(story.blueprint):<11} {printable(story.slot):<5} "
                         f"{story.path_before_outcome():<36} {story.ending():<14}",
                         f"predicted {predicted}  measured {measured}"), file=out)


def story_line(path: str, contributions: str) -> str:
    """A seed's line of the closing table: its path and ending, then its contributions, on a line of their own
    where both would not fit in `LINE_WIDTH` columns."""
    line = f"  {path} {contributions}"
    return line if len(line) <= LINE_WIDTH else f"  {path.rstrip()}\n{REASON_INDENT}{contributions}"


def _table_lines(columns: list[tuple[str, EpisodeOutcome | None]],
                 cells: list[tuple[str, Callable[[EpisodeOutcome], str]]],
                 from_scratch: EpisodeOutcome | None = None) -> list[str]:
    """The closing table's lines, a column per outcome ("-" where none), the grown one first; after the training
    FLOPs, the grown run's as a fraction of `from_scratch`'s, its final architecture's: what growing saved, or
    cost."""
    rows = [(label, ["-" if o is None else cell(o) for _, o in columns]) for label, cell in cells]
    # Columns as wide as their widest cell (a range of negative scores is), labels as their longest.
    width = max(14, *(len(text) + 2 for _, texts in rows for text in texts))
    label_width = max(22, *(len(label) + 1 for label, _ in rows))
    lines = ["\n" + " " * label_width + "".join(f"{name:>{width}}" for name, _ in columns)]
    grown = columns[0][1]
    for label, texts in rows:
        lines.append(f"{label:{label_width}}" + "".join(f"{text:>{width}}" for text in texts))
        if label == "training FLOPs" and grown is not None and from_scratch is not None \
                and from_scratch.flops.total > 0:
            ratio = grown.flops.total / from_scratch.flops.total
            lines.append(f"{'  of from scratch':{label_width}}{ratio:>{width - 1}.2f}x")
    return lines


def _score_range(outcome: EpisodeOutcome, decimals: int) -> str:
    """The lowest and highest validation score of the outcome's last epochs ("-" when none was kept)."""
    scores = outcome.recent_scores
    return _range(f"{min(scores):.{decimals}f}", f"{max(scores):.{decimals}f}") if scores else "-"


def _loss_range(outcome: EpisodeOutcome) -> str:
    """The lowest and highest validation loss of the last epochs, for a task whose score is the negated loss."""
    scores = outcome.recent_scores
    return _range(format_loss(-max(scores)), format_loss(-min(scores))) if scores else "-"


def _range(low: str, high: str) -> str:
    """`low-high`, or `low to high` where a dash could be read as a minus sign."""
    return f"{low} to {high}" if "-" in low + high else f"{low}-{high}"


def noise_note(grown: EpisodeOutcome, baseline: EpisodeOutcome, metric_name: str, *, decaying: bool = False) -> str:
    """A line saying that grown and no growth end closer than one epoch moved them, or "" when they do not
    (or end equal: nothing was grown, the same training); under a constant learning rate (not `decaying`) it
    says how to let training settle."""
    gap, swing = abs(grown.final_accuracy - baseline.final_accuracy), epoch_swing(grown, baseline)
    if swing is None or not 0 < gap < swing:
        return ""
    number = "{:.2f}" if metric_name == "accuracy" else "{:.3g}"  # a task's own metric or loss: any scale
    measure = "loss" if metric_name == NEGATIVE_LOSS else metric_name
    return (f"(grown and no growth end {number.format(gap)} apart, less than one epoch moved their {measure} near "
            f"the end ({number.format(swing)}): a difference this small may be noise."
            + ("" if decaying else
               " A decaying learning rate, [episode.optimizer] schedule = \"cosine\", lets training settle.") + ")")


def epoch_swing(*outcomes: EpisodeOutcome) -> float | None:
    """The largest change of the validation score from one epoch to the next over the outcomes' last epochs
    (None when none kept two): a final difference below it is one that another epoch could undo."""
    changes = [abs(after - before) for o in outcomes
               for before, after in itertools.pairwise(o.recent_scores)]
    return max(changes, default=None)


@dataclass(frozen=True)
class RunResult:
    """What `morphogen run` (and `morphogen.grow`) produced: the three trainings, the grown model, the run dir."""

    grown: EpisodeOutcome
    baseline: EpisodeOutcome | None
    """The same host trained without growth (None when `baseline` is off)."""
    from_scratch: EpisodeOutcome | None
    """The grown model's final architecture trained from scratch (None when off or nothing was blended in)."""
    model: MorphogeneticModel
    """The grown model, on the run's device, in the state the episode ended in."""
    run_dir: Path
    from_scratch_model: MorphogeneticModel | None = None
    """The grown model's final architecture trained from scratch (None when that training did not run): the
    architecture growth found, for a user who would rather have it trained from the start."""
    fixed: dict[str, EpisodeOutcome] = field(default_factory=dict)
    """Each host of `grow(compare_with=...)` trained without growth, by the name it was given."""
    metric_name: str = "accuracy"
    """What each outcome's `final_accuracy` holds: accuracy in percent, the task's own metric, or the negative
    loss ("negative loss")."""


@dataclass(frozen=True)
class PreparedRun:
    """A run with everything built that can fail on the user's input, before anything is written: its config (the
    host's whole size, the policy's identity, the task's name), task, grown episode (reset), controller, hosts to
    compare with, and device."""

    config: RunConfig
    task: Task
    episode: MorphogenesisEpisode
    controller: Controller
    controller_name: str
    """Who decides in the grown training: "heuristic" or "policy" (summary.json's `controller`)."""
    fixed: dict[str, Task]
    device: str


def prepare_run(config: RunConfig, controller_factory: Callable[[MorphogenesisEpisode], Controller] | None = None,
                task: Task | None = None, *, compare_with: Mapping[str, object] | None = None) -> PreparedRun:
    """What `run_command` builds before it makes or writes its run directory: an unknown slot, blueprint, task, device
    or policy, a missing data directory or a host to compare with that cannot be built fails here, without leaving a
    half-made run directory behind (`grow_over_seeds` and `run --seeds` call it for their first seed before making
    theirs)."""
    config = config.with_resolved_host()  # config.json records the host's whole size
    config = dataclasses.replace(config, text_file=_absolute(config.text_file), data_dir=_absolute(config.data_dir))
    device = resolve_device(config.device)
    if controller_factory is None and config.policy is not None:
        from morphogen.commands.evaluate import load_learned_policy  # loads the policy's modules only here

        learned = load_learned_policy(config.policy, device, config.compile_settings)
        controller_factory = learned.factory
        config = dataclasses.replace(config, policy=recorded_policy_path(config.policy),
                                     policy_checksum=learned.checksum)
    if task is None:
        task = load_session_task(config, device)
    config = dataclasses.replace(config, task_name=task.name, task_metric=task.metric_name)
    episode = MorphogenesisEpisode(task, config.episode, seed=config.seed, slots=config.slots,
                                   pool_slots=config.pool_slots)
    episode.compile_settings = config.compile_settings
    episode.reset()
    fixed = compared_tasks(config.compare_with, compare_with, task, config.task, config.host)
    if controller_factory is None:
        controller: Controller = HeuristicController(episode.action_space, task.topology, config.heuristic)
    else:
        controller = controller_factory(episode)
    return PreparedRun(config, task, episode, controller, "heuristic" if controller_factory is None else "policy",
                       fixed, device)


def run_command(config: RunConfig, controller_factory: Callable[[MorphogenesisEpisode], Controller] | None = None,
                out: TextIO | None = None, task: Task | None = None, *, resume: bool = False,
                compare_with: Mapping[str, object] | None = None) -> RunResult:
    """The whole `morphogen run`: load task, run the grown episode and the baseline, write the run dir.

    Progress and the summary go to `out`, by default the `sys.stdout` of the moment of the call (so that
    redirecting stdout works). `task` replaces the one `config` names (a user's task built in Python). Each
    training saves its state after every epoch (`commands/run_state.py`); `resume` goes on from those states in
    `config.run_dir`, a run stopped before its summary, with the config it was started with. `compare_with`
    names other hosts (or functions building them) trained without growth beside the rest, on the same data.
    """
    out = sys.stdout if out is None else out
    run = prepare_run(config, controller_factory, task, compare_with=compare_with)
    config, fixed = run.config, run.fixed
    saving = _Saving(_config_text(config), run.controller_name, resume)
    run_dir = resumable_run_dir(config.run_dir) if resume else \
        make_run_dir(config.run_dir, config.runs_root, run_name(run.task.name))
    with hold_run_directory(run_dir, LockPurpose.RESUME if resume else LockPurpose.NEW_RUN):  # one writer per run
        # Again, now that no other command can start (or finish) a run there.
        if resume:
            refuse_finished_run(run_dir)
            refuse_another_policy(run_dir, config.policy, config.policy_checksum)
            # Before any training: a comparison's directory that a copied run holds as a link would have its resume
            # cut, clear and append another directory's files (each training checks its own again when it starts).
            compared = (run_dir / FIXED_DIRNAME, *(_fixed_dir(run_dir, index) for index in range(len(fixed))))
            for directory in (run_dir / BASELINE_DIRNAME, run_dir / FROM_SCRATCH_DIRNAME, *(compared if fixed else ())):
                refuse_planted_link(directory)
        else:
            refuse_other_run(run_dir)
        return _play_and_write(config, run.task, run.episode, run.controller, saving, run.device, run_dir, out, fixed)


def resumable_run_dir(run_dir: str | None) -> Path:
    """The directory of a run that `run --resume` can continue; `RunDirectoryRefused` naming what is missing."""
    if run_dir is None:
        raise RunDirectoryRefused("resuming a run needs its run directory (--resume RUN_DIR, or run_dir=...)")
    path = Path(run_dir)
    if os.path.lexists(path / CHECKPOINT_NAME):
        raise RunDirectoryRefused(f"{path} holds a run of `morphogen train`; `morphogen train --resume {path}` "
                                  "continues it")
    if any(os.path.lexists(path / name) for name in (EVAL_RESUME_FILENAME, SCORES_FILENAME)):
        raise RunDirectoryRefused(f"{path} holds an evaluation of `morphogen eval`; `morphogen eval --resume {path}` "
                                  "continues it")
    if is_seeds_directory(path):
        raise RunDirectoryRefused(f"{path} holds a run over several seeds: `morphogen run --resume {path}` or "
                                  "morphogen.grow_over_seeds(..., resume=True) goes on with it")
    if not (path / CONFIG_FILENAME).is_file():
        raise RunDirectoryRefused(f"{path} holds no run of `morphogen run` to resume (no {CONFIG_FILENAME})")
    refuse_finished_run(path)
    return path


def refuse_finished_run(path: Path) -> None:
    """`RunDirectoryRefused` when the run in `path` has already written its summary: there is nothing to resume."""
    if os.path.lexists(path / SUMMARY_FILENAME):
        raise RunDirectoryRefused(f"the run in {path} is finished ({SUMMARY_FILENAME} is written); nothing to resume")


@dataclass(frozen=True)
class _Saving:
    """How a run saves each of its trainings between epochs, and whether it goes on from what they saved."""

    config: str
    """The run's config as JSON text: a saved state is resumed only by the same run."""
    controller: str
    """Who decides in the grown training: "heuristic" or "policy" (summary.json's `controller`)."""
    resuming: bool

    def state(self, directory: Path) -> dict[str, Any] | None:
        """The state saved in `directory` when resuming (its events cut back to it, the temporary files of saves a
        kill cut short removed), else None."""
        if not self.resuming:
            return None
        remove_stale_temporaries(directory)  # the run directory's lock is held
        state = load_training_state(directory, config=self.config, controller=self.controller)
        cut_events(directory / EVENTS_FILENAME, state)
        return state

    def saver(self, directory: Path, telemetry: Telemetry) -> Callable[[dict[str, Any]], None]:
        """What saves a training's state into `directory` after each epoch (with the size of its events)."""
        events = directory / EVENTS_FILENAME if telemetry.configured_level != "off" else None
        return lambda state: save_training_state(directory, state, config=self.config, controller=self.controller,
                                                 events=events)


def _config_text(config: RunConfig) -> str:
    """`config` as JSON text without where it runs and where its policy lies (`run_dir`, `runs_root`, `device`,
    `policy`: a resumed run may move; its policy is known by `policy_checksum`)."""
    values = config_to_dict(config)
    for key in ("run_dir", "runs_root", "device", "policy"):
        values.pop(key, None)
    return json.dumps(values, sort_keys=True)


def optimizer_note(task: Task, chosen: OptimizerConfig | None) -> str:
    """A line for a transformer of the user's own that trains with SGD because the run's optimizer settings say so
    (`name = "sgd"`, or an `OptimizerConfig` made in Python, which builds on SGD's defaults unless it names AdamW),
    else ""."""
    default = task_optimizer_config(task.name, topology=task.topology)
    if task.source == "builtin" or chosen is None or chosen.name == default.name:
        return ""
    return (f"note: the optimizer settings make this {task.topology} train with {chosen.label}; "
            f"without them, {default.summary} (name = \"{default.name}\")")


def depth_growth_note(controller: Controller, model: MorphogeneticModel | None) -> str:
    """A line for a heuristic that grows by depth with a blueprint some slot cannot take: told to
    (`[heuristic] depth_blueprint`), it grows seed by seed instead; by default (copies of a transformer's layers),
    it grows its fallback (zero-initialised blocks) instead; else ""."""
    if not isinstance(controller, HeuristicController) or model is None:
        return ""
    told = controller.config.depth_blueprint
    blueprint = DEFAULT_DEPTH_BLUEPRINT.get(model.topology, "") if told is None else told
    if not blueprint:  # "": seed by seed
        return ""
    unfit = [slot for slot in model.slots() if not model.can_graft(slot.slot_id, blueprint)]
    if not unfit:
        return ""
    ids = ", ".join(slot.slot_id for slot in unfit)
    reason = unfit[0].site_problem(blueprint) or f"{blueprint!r} cannot be grafted there"
    fallback = DEPTH_FALLBACK.get(blueprint, "") if told is None else ""
    instead = f"grows {fallback!r} instead" if fallback else "grows seed by seed instead"
    setting = f"[heuristic] depth_blueprint = {blueprint!r}" if told is not None else f"the default {blueprint!r}"
    return f"note: {setting} cannot be grafted into {cut(printable(ids), 60)} ({reason}); the heuristic {instead}"


def run_name(task_name: str) -> str:
    """A task name as it may appear in a run directory's name: letters, digits, '-', '_' and '.', at most 40."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", task_name).strip("-.")[:40] or "task"


def _play_and_write(config: RunConfig, task: Task, episode: MorphogenesisEpisode, controller: Controller,
                    saving: _Saving, device: str, run_dir: Path, out: TextIO, fixed: Mapping[str, Task]) -> RunResult:
    """The grown episode, the comparisons and the files of `run_command`, in a locked `run_dir`."""
    if not saving.resuming:
        write_resolved_config(run_dir, config)
    state = saving.state(run_dir)
    with Telemetry(run_dir, config=config.telemetry) as telemetry, ProgressDisplay(out) as display:
        episode.telemetry = telemetry
        episode.timer = PhaseTimer.from_config(config.telemetry)
        episode.detector = AnomalyDetector(config.telemetry)
        _print_header(display, config, task, episode, device, run_dir)
        if saving.resuming and state is None:
            display.print("resume: the grown training saved no epoch (save_every = 0, or it stopped in its first); "
                          "it starts over")
        epochs = _progress(display, "grown", config.episode.max_epochs, state)

        def on_step(result: StepResult) -> None:
            display.print(format_step(result, task.metric_name))
            display.advance(epochs)
            note = depth_growth_note(controller, episode.model) if result.snapshot.epoch == 1 else ""
            if note:
                display.print(textwrap.fill(note, LINE_WIDTH, subsequent_indent=REASON_INDENT))

        with TraceProfiler.from_config(run_dir, config.telemetry) as profiler:
            grown = run_episode(episode, controller, on_step, profiler, resume=state,
                                save=saving.saver(run_dir, telemetry), save_every=config.save_every)
        if episode.timer.enabled:
            telemetry.emit(episode.timer.event(epoch=episode.epoch, env_id=episode.env_id))
        display.remove(epochs)
        baseline = None
        if config.baseline:
            baseline = _run_baseline(config, task, run_dir, display, saving)
        assert episode.model is not None
        architecture, blends = episode.model.architecture(), episode.model.blends()
        from_scratch, from_scratch_model = None, None
        if config.from_scratch and architecture:
            from_scratch, from_scratch_model = _run_from_scratch(config, task, architecture, blends, run_dir, display,
                                                                 saving)
        fixed_outcomes = _run_fixed(config, fixed, run_dir, display, saving)
    print_summary(grown, baseline, out, from_scratch, task.metric_name, episode.slot_config.gates.judged_by,
                  nothing_kept=config.from_scratch and not architecture, fixed=fixed_outcomes,
                  decaying=episode.optimizer_config.schedule != "constant", last_reason=episode.last_reason)
    if episode.timer.enabled:
        print(f"\ntime by phase (grown model):\n{episode.timer.summary()}", file=out)
    result = RunResult(grown, baseline, from_scratch, episode.model, run_dir, from_scratch_model, fixed_outcomes,
                       task.metric_name)
    _write_results(result, architecture, saving.controller, episode.slot_config.gates.judged_by, task.vocabulary,
                   blends, task.input_standardization)
    return result


def _write_results(result: RunResult, architecture: dict[str, str], controller: str, criterion: Criterion,
                   vocabulary: tuple[str, ...] | None = None, blends: dict[str, str] | None = None,
                   standardization: InputStandardization | None = None) -> None:
    """`summary.json` and the models of a finished run; the trainings' resume states go (nothing is left). A
    character task's `vocabulary` goes in too: what a token id of the exported model means."""
    run_dir = result.run_dir
    summary: dict[str, object] = {
        "controller": controller, "score": {"name": result.metric_name, "criterion": criterion.value},
        "grown": _outcome_dict(result.grown),
        "baseline": None if result.baseline is None else _outcome_dict(result.baseline),
        "from_scratch": None if result.from_scratch is None else
        {**_outcome_dict(result.from_scratch), "architecture": architecture, **({"blends": blends} if blends else {})},
        "fixed": [{"name": name, **_outcome_dict(outcome)} for name, outcome in result.fixed.items()]}
    if vocabulary is not None:
        summary["vocabulary"] = list(vocabulary)
    if standardization is not None:  # what new data needs before the model (or an export) reads it
        summary["input_standardization"] = standardization.as_dict()
    write_atomic(run_dir / SUMMARY_FILENAME, (json.dumps(_strict(summary), indent=2) + "\n").encode())
    save_model_file(result.model, run_dir / MODEL_FILENAME)  # for `morphogen export`
    if result.from_scratch_model is not None:  # for `morphogen export --from-scratch`
        save_model_file(result.from_scratch_model, run_dir / FROM_SCRATCH_DIRNAME / MODEL_FILENAME)
    for directory in (run_dir, run_dir / BASELINE_DIRNAME, run_dir / FROM_SCRATCH_DIRNAME,
                      *(_fixed_dir(run_dir, index) for index in range(len(result.fixed)))):
        remove_resume_state(directory / RESUME_FILENAME)


def _print_header(display: ProgressDisplay, config: RunConfig, task: Task, episode: MorphogenesisEpisode, device: str,
                  run_dir: Path) -> None:
    """The run's first lines: the task, its host and data, the episode, the device, the optimizer, the run dir."""
    epochs = counted(config.episode.max_epochs, "epoch")
    display.print(f"morphogen run: task {printable(task.name)} ({task.topology} host, {len(task.train)} train / "
                  f"{len(task.validation)} validation), {epochs}, seed {config.seed}, "
                  f"device {device}, {episode.optimizer_config.summary}")
    display.print(f"run dir: {run_dir}")
    note = optimizer_note(task, config.episode.optimizer)
    if note:
        display.print(textwrap.fill(note, LINE_WIDTH, subsequent_indent=REASON_INDENT))


def _progress(display: ProgressDisplay, name: str, epochs: int, state: dict[str, Any] | None) -> TaskID | None:
    """A progress bar of a training's epochs, advanced to where its saved `state` stands (and said so)."""
    bar = display.add(name, epochs)
    if state is not None:
        played = int(state["episode"]["epoch"])
        display.print(f"resume: {name} from epoch {played} of {epochs}")
        display.advance(bar, played)
    return bar


def _run_baseline(config: RunConfig, task: Task, run_dir: Path, display: ProgressDisplay,
                  saving: _Saving) -> EpisodeOutcome:
    """The same host without growth, with a progress bar and its epochs in RUN_DIR/baseline/events.jsonl."""
    display.print(f"training the same host without growth ({config.episode.max_epochs} epochs)...")
    return _run_without_growth(config, task, run_dir / BASELINE_DIRNAME, display, "no growth", saving)[0]


def _run_from_scratch(config: RunConfig, task: Task, architecture: dict[str, str], blends: dict[str, str],
                      run_dir: Path, display: ProgressDisplay, saving: _Saving,
                      ) -> tuple[EpisodeOutcome, MorphogeneticModel]:
    """The grown model's final architecture, every seed installed at epoch 0 with the blend it was grown with,
    trained without growth, and the model it trained; its epochs in RUN_DIR/from_scratch/events.jsonl."""
    seeds = printable(", ".join(f"{blueprint} in {slot}" + (f" ({blends[slot]} blend)" if slot in blends else "")
                                for slot, blueprint in architecture.items()))
    display.print(f"training the final architecture from scratch (host + {seeds}, "
                  f"{config.episode.max_epochs} epochs)...")
    return _run_without_growth(config, task, run_dir / FROM_SCRATCH_DIRNAME, display, "from scratch", saving,
                               architecture, blends)


def _fixed_dir(run_dir: Path, index: int) -> Path:
    """Where the `index`-th host compared with trains: by index, since its name is the user's free text."""
    return run_dir / FIXED_DIRNAME / str(index)


def _run_fixed(config: RunConfig, fixed: Mapping[str, Task], run_dir: Path, display: ProgressDisplay,
               saving: _Saving) -> dict[str, EpisodeOutcome]:
    """Each host to compare with, trained without growth on the same data, epochs and seed, with all its slots
    (the run's `slots` name the grown host's); its epochs in RUN_DIR/fixed/<index>/events.jsonl."""
    outcomes = {}
    settings = dataclasses.replace(config, slots=None, pool_slots=False)
    for index, (name, task) in enumerate(fixed.items()):
        refuse_planted_link(run_dir / FIXED_DIRNAME)  # never through a `fixed` link planted in a copied run
        display.print(f"training {printable(name)} without growth ({config.episode.max_epochs} epochs)...")
        outcomes[name] = _run_without_growth(settings, task, _fixed_dir(run_dir, index), display, printable(name),
                                             saving)[0]
    return outcomes


def _run_without_growth(config: RunConfig, task: Task, events_dir: Path, display: ProgressDisplay, name: str,
                        saving: _Saving, architecture: dict[str, str] | None = None,
                        blends: dict[str, str] | None = None) -> tuple[EpisodeOutcome, MorphogeneticModel]:
    """One comparison episode (the host, or `architecture` built at epoch 0) with a progress bar; its outcome
    and the model it trained.

    Its epochs go to `events_dir/events.jsonl` at telemetry `minimal`, apart from the grown run's events,
    so that readers of `events.jsonl` see one episode and the HTML report can draw every curve.
    """
    episode = MorphogenesisEpisode(task, config.episode, seed=config.seed, slots=config.slots,
                                   pool_slots=config.pool_slots, architecture=architecture, blends=blends)
    episode.compile_settings = config.compile_settings
    # Before a resume cuts its events or removes its temporaries: a link planted in a copied run (`baseline` leading
    # to another directory) would have them cut, removed and written there.
    refuse_planted_link(events_dir)
    state = saving.state(events_dir)
    epochs = _progress(display, name, config.episode.max_epochs, state)
    level = "off" if config.telemetry.level == "off" else "minimal"
    with Telemetry(events_dir, level=level) as telemetry:
        episode.telemetry = telemetry
        outcome = run_episode(episode, NoGrowthController(), lambda result: display.advance(epochs), resume=state,
                              save=saving.saver(events_dir, telemetry), save_every=config.save_every)
    display.remove(epochs)
    assert episode.model is not None
    return outcome, episode.model


#: Settings that name a file or directory of data, relative to where the run started.
DATA_PATH_KEYS = ("text_file", "data_dir")


def _absolute(path: str | None) -> str | None:
    """`path` absolute (links kept as they are), so that a run's data is found from any directory later."""
    return None if path is None else str(Path(path).absolute())


def write_resolved_config(run_dir: Path, config: object) -> None:
    """RUN_DIR/config.json: the resolved config as `recorded_config_values` gives it."""
    values = recorded_config_values(config_to_dict(config))
    write_atomic(run_dir / CONFIG_FILENAME, (json.dumps(values, indent=2) + "\n").encode())


def recorded_config_values(values: dict[str, Any]) -> dict[str, Any]:
    """What RUN_DIR/config.json records of a config's `values`: all of them but `run_dir`, so that re-running the
    saved file (`morphogen run --config RUN_DIR/config.json`) makes a new run directory instead of appending here,
    with the data paths made absolute."""
    values = {**values, "run_dir": None}
    for key in DATA_PATH_KEYS:  # absolute: `export`, `report` and `--resume` read the data from any directory
        if isinstance(values.get(key), str):
            values[key] = _absolute(values[key])
    return values


def _outcome_dict(outcome: EpisodeOutcome) -> dict[str, object]:
    return {
        "final_accuracy": outcome.final_accuracy, "final_loss": outcome.final_loss,
        "parameters": outcome.parameters, "host_parameters": outcome.host_parameters,
        "seconds": outcome.seconds, "episode_return": outcome.episode_return, "flops": outcome.flops.as_dict(),
        "recent_scores": list(outcome.recent_scores),
        "seeds": [{"slot": s.slot, "blueprint": s.blueprint, "germinated": s.germinated, "stages": s.stages,
                   "outcome": s.outcome, "outcome_epoch": s.outcome_epoch, "contribution": s.contribution,
                   "predicted_contribution": s.predicted_contribution, "loss_contribution": s.loss_contribution,
                   "predicted_loss_contribution": s.predicted_loss_contribution,
                   "relative_loss_contribution": s.relative_loss_contribution,
                   "predicted_relative_loss_contribution": s.predicted_relative_loss_contribution}
                  for s in outcome.stories],
    }


def _strict(value: object) -> object:
    """`value` with NaN/inf floats written as the event schema's tokens, so summary.json is strict JSON too."""
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_strict(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return next(token for token, number in NON_FINITE_TOKENS.items()
                    if (math.isnan(number) and math.isnan(value)) or number == value)
    return value
