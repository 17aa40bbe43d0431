"""Reading a run directory as telemetry wrote it: events with their wall-clock times, read whole or tailed.

A run directory holds `config.json` (the resolved config), `events.jsonl` (one JSON object per event,
each with the sink's "time"), `summary.json` after a `run` finished, and `baseline/events.jsonl` and
`from_scratch/events.jsonl` (the no-growth episode and the final architecture trained from scratch,
of a `run`). Readers here never import the model, env or controller, so they work on
a run copied from another machine, and on a run that is still being written: `EventTail` returns only
complete lines and picks up where it stopped.

A copied run directory is untrusted input. Every reader here is bounded and tolerant:

- a line that is not one event record (torn, not JSON, nested too deep, an unknown kind, a field of
  the wrong type, a "time" that is not a finite number within `MAX_MAGNITUDE`) is skipped and counted (`skipped`), never
  fatal; the record is checked against the event's schema (`event_from_dict`), so what is returned is
  typed;
- a line longer than `MAX_LINE_BYTES` is skipped without being parsed, and at most `MAX_EVENTS`
  events are kept per file (the rest are counted as skipped), so memory stays below roughly
  `MAX_EVENTS` events plus one line whatever the file holds;
- `config.json` and `summary.json` over `run_directory.MAX_JSON_BYTES` (4 MiB), unparsable or not an object, and the
  comparisons' events files that cannot be read, read as missing (`unreadable` names them);
- only regular files are read, opened without blocking (`morphogen.run_directory.open_regular_file`):
  a FIFO or a link to a device planted at a name is unreadable, never a wait or an endless read.

Rounds: events carry no round number of their own (only per-round events do), but the trainer writes
a `RoundCompleted` after the episodes of each round, so an event belongs to round 1 + the number of
`RoundCompleted` events before it (`round_of_events`). That holds across `--resume` too, because a
resumed run appends after the last completed round. The episodes a run watched the heuristic play before
PPO (`--imitate-rounds`) end with an `ImitationCompleted`: they and it are round 0 (`IMITATION_ROUND`).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from morphogen.limits import MAX_EVAL_EPISODES
from morphogen.run_directory import (
    BASELINE_DIRNAME,
    CONFIG_FILENAME,
    EVENTS_FILENAME,
    FROM_SCRATCH_DIRNAME,
    MAX_JSON_BYTES,
    MAX_LINE_BYTES,
    SCORES_FILENAME,
    SEEDS_FILENAME,
    SUMMARY_FILENAME,
    is_seeds_directory,
    open_regular_file,
    read_json_object,
    read_line,
    read_regular_file,
)
from morphogen.telemetry.events import EpochCompleted, Event, ImitationCompleted, RoundCompleted, event_from_dict
from morphogen.telemetry.story import NEGATIVE_LOSS, SeedStory
from morphogen.ui.units import format_loss

MAX_EVENTS = 2_000_000
"""Events kept per events file (a 100-round, 64-env training run writes about 200,000)."""
IMITATION_ROUND = 0
"""The round `round_of_events` gives the events of the imitation warm start, which come before round 1."""


class RunDirectoryError(ValueError):
    """A path that is not a readable morphogen run directory."""


@dataclass(frozen=True)
class TimedEvent:
    """An event and the wall-clock time (seconds since the epoch) its sink wrote it at."""

    time: float
    event: Event


def parse_line(line: str | bytes) -> TimedEvent:
    """One JSON line of `events.jsonl` as a `TimedEvent`; ValueError saying why if it is not one."""
    try:
        record = json.loads(line)
    except RecursionError:
        raise ValueError("nested too deep") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    time = summary_number(record, "time")
    if time is None:
        raise ValueError("'time' is not a finite number")
    try:
        return TimedEvent(time, event_from_dict(record))
    except (TypeError, OverflowError, RecursionError) as error:  # an integer past float range, too deep
        raise ValueError(f"unreadable record: {type(error).__name__}") from None


class EventTail:
    """Reads the complete lines appended to an events file since the last call, skipping bad ones.

    A last line without its newline is a record still being written: it is left for the next call,
    unless `final` (a finished run), where it is skipped. A file that does not exist yet reads as
    empty (a run that has not written its first event). `skipped` counts the lines that were not
    events, and the events past `MAX_EVENTS`. A file whose bytes before the point read to have changed
    (shorter, or cut back and written again: `--resume` cuts the interrupted round's events and plays the
    round again) is read again from its start, and `cuts` counts such restarts, so a follower knows to
    forget what it had folded.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.skipped = 0
        self.cuts = 0
        self._offset = 0
        self._line_start = 0
        self._kept = 0
        self._mark = b""

    def read_new(self, final: bool = False) -> list[TimedEvent]:
        """The events of every complete line added since the previous call, in order."""
        try:
            file = open_regular_file(self.path)  # a FIFO or a device planted here never blocks nor floods us
        except FileNotFoundError:
            return []
        except OSError as error:
            if not self.path.exists():
                return []
            raise RunDirectoryError(f"cannot read {self.path}: {error.strerror or error}") from None
        events = []
        with file:
            if self._offset and self._bytes_before_offset(file) != self._mark:  # cut back: what follows is new
                self.skipped = self._offset = self._line_start = self._kept = 0
                self.cuts += 1
            file.seek(self._offset)
            while line := self._next_line(file, final):
                if line is _TOO_LONG:
                    self.skipped += 1
                    continue
                event = self._parse(line)
                if event is not None:
                    events.append(event)
            self._mark = self._bytes_before_offset(file)
        return events

    def _bytes_before_offset(self, file: IO[bytes]) -> bytes:
        """The first and the last `_MARK_BYTES` bytes of the last line read: the same on the next call unless the
        file was cut back (and perhaps written again past that point). The line's start holds its time, the one
        thing a resumed round's lines surely change: the round plays again to the same figures, so lines of the
        same length can end at the same offsets with the same last bytes."""
        head_end = min(self._line_start + _MARK_BYTES, self._offset)
        file.seek(self._line_start)
        head = file.read(head_end - self._line_start)
        start = max(self._offset - _MARK_BYTES, head_end)
        file.seek(start)
        return head + file.read(self._offset - start)

    def _next_line(self, file: IO[bytes], final: bool) -> bytes | None:
        """The next whole line (`_TOO_LONG` for one past the limit, skipped to its end), None at the end.

        A last line without its newline is left to be read again, unless `final`: then it is skipped.
        """
        line = read_line(file, MAX_LINE_BYTES)
        if line.complete:
            self._line_start = self._offset
            self._offset += line.size
            return _TOO_LONG if line.text is None else line.text
        if line.size and final:
            self._line_start = self._offset
            self._offset += line.size
            self.skipped += 1
        return None

    def _parse(self, line: bytes) -> TimedEvent | None:
        if not line.strip():
            return None
        try:
            event = parse_line(line)
        except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            self.skipped += 1
            return None
        if self._kept >= MAX_EVENTS:
            self.skipped += 1
            return None
        self._kept += 1
        return event


_MARK_BYTES = 64
"""How many bytes before its offset `EventTail` checks again on each call, to notice a file cut back."""

_TOO_LONG = b"\0too long\0"
"""What `EventTail._next_line` returns for a line past `MAX_LINE_BYTES` (never a real line: no newline)."""


@dataclass
class RunFiles:
    """What a run directory holds, read once; `skipped` lines of its events files were not events, and
    the files named in `unreadable` were damaged and read as missing."""

    path: Path
    config: dict[str, Any]
    events: list[TimedEvent]
    baseline_events: list[TimedEvent] = field(default_factory=list)
    from_scratch_events: list[TimedEvent] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    skipped: int = 0
    unreadable: tuple[str, ...] = ()
    #: The run wrote no events (`--telemetry off`): what is known of it comes from summary.json and config.json.
    without_events: bool = False

    @property
    def history(self) -> list[Event]:
        return [timed.event for timed in self.events]

    @functools.cached_property
    def is_training(self) -> bool:
        """Whether this is a `morphogen train` run (its config has rounds, or it wrote rounds); computed once,
        since it reads every event and the views ask it per event."""
        return "rounds" in self.config or any(isinstance(t.event, RoundCompleted) for t in self.events)

    @property
    def paired_baseline(self) -> bool:
        """Whether this is a training run whose envs each had a no-growth twin whose reward was subtracted from theirs
        (config.json's `paired_baseline`): its rounds' returns are what growth added, its episodes' their own."""
        return self.is_training and self.config.get("paired_baseline") is True

    @property
    def steered_by_reward(self) -> bool:
        """Whether a reward steered this run: a training run, or a `run` whose summary.json does not name
        the heuristic as its controller (a `run --policy`), or, before it has a summary.json (still going, or
        stopped), whose config.json names no policy. The heuristic computes the reward's components but never
        reads them, so its runs are not shown a reward."""
        if self.is_training:
            return True
        if self.summary is not None and "controller" in self.summary:
            return bool(self.summary["controller"] != "heuristic")
        return not ("policy" in self.config and self.config["policy"] is None)

    @functools.cached_property
    def evaluation(self) -> EvaluationEpisodes | None:
        """Of an evaluation (`morphogen eval --run-dir`), which controller and episode each env played."""
        return evaluation_episodes(self.path, self.config)

    @property
    def score(self) -> ScoreKind:
        """What this run's score is and what its seeds were judged by: summary.json's, or, before the run wrote
        one, config.json's `task_metric` (the dashboard's reading), so a stopped regression is not shown a
        percent accuracy."""
        return score_kind(self.summary, self.config)

    def damage_note(self) -> str | None:
        """One line saying what was skipped or unreadable, or None for an intact run."""
        parts = [f"{self.skipped:,} line{'s' if self.skipped != 1 else ''} skipped"] if self.skipped else []
        parts += [f"{name} unreadable" for name in self.unreadable]
        if self.without_events:
            parts.append(f"no {EVENTS_FILENAME}: made with --telemetry off, its figures are summary.json's")
        unfinished = self._unfinished_note()
        return ", ".join([*parts, *([unfinished] if unfinished else [])]) or None

    @property
    def recording_note(self) -> str | None:
        """What a run recorded at `--telemetry minimal` leaves out (actions and their reasons, stage changes,
        counterfactuals: normal's), so that their absence does not read as damage; None at any other level."""
        if config_value(self.config, "telemetry.level") != "minimal" or self.without_events:
            return None
        return "recorded at --telemetry minimal: no actions' reasons, stage changes or seed measurements"

    def _unfinished_note(self) -> str | None:
        """Of a `run` (its config has `from_scratch`) whose events have no summary.json beside them: that it stopped
        or is still going, and the last epoch its events reach, so a reader knows why no final figures follow."""
        if "from_scratch" not in self.config or self.without_events or os.path.lexists(self.path / SUMMARY_FILENAME):
            return None
        epochs = [event.epoch for event in self.history if isinstance(event, EpochCompleted) and event.env_id == 0]
        total = config_value(self.config, "episode.max_epochs")
        of_total = f" of {total}" if isinstance(total, int) and not isinstance(total, bool) else ""
        reached = f" after epoch {max(epochs)}{of_total}" if epochs else " before its first epoch"
        return f"no {SUMMARY_FILENAME}: the run stopped, or is still going,{reached}"


#: Longest controller name read from an evaluation's table (eval's own are "learned", "heuristic", "no growth").
MAX_CONTROLLER_NAME = 40


@dataclass(frozen=True)
class EvaluationEpisodes:
    """The controllers an evaluation played, in its table's order, and how many episodes each: what its env ids
    stand for (`run_directory.evaluation_env_id` numbers them)."""

    controllers: tuple[str, ...]
    episodes: int

    def controller(self, env_id: int) -> str | None:
        """The controller that played env `env_id`; None for an id past the evaluation's envs."""
        position = env_id // self.episodes  # the inverse of `evaluation_env_id`
        return self.controllers[position] if 0 <= position < len(self.controllers) else None

    def label(self, env_id: int) -> str:
        """`env 4, heuristic episode 2`; an id past the evaluation's envs stays `env N`."""
        controller = self.controller(env_id)
        if controller is None:
            return f"env {env_id}"
        return f"env {env_id}, {controller} episode {env_id % self.episodes + 1}"


def evaluation_episodes(path: Path, config: Mapping[str, Any]) -> EvaluationEpisodes | None:
    """What an evaluation's env ids stand for: its `SCORES_FILENAME` names the controllers, config.json the episodes
    of each. None for another run, for an evaluation that has not written its table yet, and for damaged files."""
    episodes = config.get("episodes")
    if isinstance(episodes, bool) or not isinstance(episodes, int) or not 0 < episodes <= MAX_EVAL_EPISODES:
        return None
    try:
        table = json.loads(read_regular_file(path / SCORES_FILENAME, MAX_JSON_BYTES))
    except (OSError, ValueError, RecursionError):  # missing, not a regular file, too large, not JSON, too deep
        return None
    rows = table if isinstance(table, list) else []
    names = tuple(row["name"] for row in rows if isinstance(row, dict) and isinstance(row.get("name"), str)
                  and 0 < len(row["name"]) <= MAX_CONTROLLER_NAME)
    return EvaluationEpisodes(names, episodes) if names and len(names) == len(rows) else None


def nothing_kept(config: dict[str, Any], summary: dict[str, Any] | None) -> bool:
    """Whether a finished run asked for its final architecture from scratch and trained none because no seed was
    kept: that architecture is the host, so its from-scratch figures are the no-growth run's (as the run's seed lines
    and seeds.json give them)."""
    return (config.get("from_scratch") is True and isinstance(summary, dict) and "from_scratch" in summary
            and summary["from_scratch"] is None and isinstance(summary.get("grown"), dict))


#: The largest magnitude of a number read from a run's JSON (a figure of summary.json or seeds.json, an event's time):
#: nothing a run records comes near it (a float32 loss overflows at 3.4e38), and the sums and squares the figures
#: over seeds take of such numbers stay finite (past it, `statistics.fmean` stopped on an OverflowError).
MAX_MAGNITUDE = 1e100


def summary_number(table: object, key: str) -> float | None:
    """`table[key]` if `table` is a dict holding a finite number there, of magnitude at most `MAX_MAGNITUDE`
    (summary.json is untrusted), else None."""
    value = table.get(key) if isinstance(table, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past the float range
        return None
    return number if math.isfinite(number) and abs(number) <= MAX_MAGNITUDE else None


#: What summary.json's "score" may say the gates judged seeds by (anything else reads as "score").
CRITERIA = ("score", "loss", "relative_loss")


@dataclass(frozen=True)
class ScoreKind:
    """What a run's validation score is and what its seeds were judged by: summary.json's "score" table
    ({"name": ..., "criterion": ...}); accuracy judged by points where a run does not say (runs before it did)."""

    name: str = "accuracy"
    criterion: str = "score"

    @property
    def is_accuracy(self) -> bool:
        return self.name == "accuracy"

    @property
    def is_negative_loss(self) -> bool:
        """Whether the score is the validation loss negated (a task with its own loss and no metric): every view
        shows the loss itself, as `run`'s closing table does."""
        return self.name == NEGATIVE_LOSS

    @property
    def title(self) -> str:
        """The score's name for people: "loss" for a negated loss (shown as the loss), else its name."""
        return "loss" if self.is_negative_loss else self.name

    @property
    def label(self) -> str:
        """The score's name for a column or a chart, short for accuracy."""
        return "acc" if self.is_accuracy else self.title

    @property
    def axis(self) -> str:
        """The score's name on a chart's axis, with its unit for accuracy."""
        return "accuracy %" if self.is_accuracy else self.title

    def shown(self, value: float) -> float:
        """A score as a chart plots it: a negated loss as the loss, any other as it is."""
        return -value if self.is_negative_loss else value

    def format(self, value: float) -> str:
        """A score as a reader expects it: accuracy in percent, a negated loss as the loss, any other in four
        significant digits."""
        if self.is_negative_loss:
            return format_loss(-value)
        return f"{value:.2f}%" if self.is_accuracy else f"{value:.4g}"

    @property
    def contribution_unit(self) -> str:
        """The unit a seed's contribution is judged in: "points", "nats" or "% of loss"."""
        return {"loss": "nats", "relative_loss": "% of loss"}.get(self.criterion, "points")

    def contribution_value(self, story: SeedStory, *, predicted: bool = False) -> float | None:
        """What a seed was last measured to add (`predicted`: what its shadow said while it trained behind the
        host), in `contribution_unit`; None when not measured."""
        if self.criterion == "loss":
            return story.predicted_loss_contribution if predicted else story.loss_contribution
        if self.criterion == "relative_loss":
            share = story.predicted_relative_loss_contribution if predicted else story.relative_loss_contribution
            return None if share is None else 100 * share
        return story.predicted_contribution if predicted else story.contribution

    def contribution(self, story: SeedStory, *, predicted: bool = False) -> str:
        """`contribution_value` as text in its unit: "+0.0669 nats", "+1.25 pts", "-" when not measured."""
        value = self.contribution_value(story, predicted=predicted)
        return "-" if value is None else self.contribution_text(value)

    def contribution_text(self, value: float) -> str:
        """A contribution in `contribution_unit`, to the digits every view gives it: "+0.0669 nats", "+1.25 pts"."""
        text = {"loss": "{:+.4f} nats", "relative_loss": "{:+.2f}% of loss"}.get(self.criterion, "{:+.2f} pts")
        return text.format(value)


def score_kind(summary: Mapping[str, Any] | None, config: Mapping[str, Any] | None = None) -> ScoreKind:
    """The `ScoreKind` summary.json records (an untrusted file: a name of at most 100 characters, a known
    criterion); without it, the score `config` names (`task_metric`, judged by the gates' criterion where the
    config sets one, else by points); else accuracy judged by points."""
    table = (summary or {}).get("score")
    if not isinstance(table, dict):
        criterion = config_value(config or {}, "episode.slots.gates.criterion")
        return ScoreKind(score_name((config or {}).get("task_metric")),
                         criterion if criterion in CRITERIA else "score")
    criterion = table.get("criterion")
    return ScoreKind(score_name(table.get("name")), criterion if criterion in CRITERIA else "score")


def score_name(name: object) -> str:
    """A score's name as a run's file gives it (untrusted: a name of at most 100 characters), else "accuracy"."""
    return name if isinstance(name, str) and 0 < len(name) <= 100 else "accuracy"


def check_run_dir(run_dir: str | Path, *, without_events: bool = False) -> Path:
    """`run_dir` as a Path if it is a directory with an events file (or, with `without_events`, the
    config.json and summary.json of a run made with `--telemetry off`); else `RunDirectoryError` saying why."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RunDirectoryError(f"{path} is not a directory (expected a run directory under runs/)")
    events = path / EVENTS_FILENAME
    if without_events and not os.path.lexists(events) and is_summary_only_run(path):
        return path
    if not events.exists():
        if is_seeds_directory(path):
            raise RunDirectoryError(f"{path} holds a run over several seeds ({SEEDS_FILENAME}): name one of its "
                                    f"runs, {path}/seed_<s> (`morphogen report {path}` prints the figures over them)")
        if not (path / CONFIG_FILENAME).exists() and any((child / EVENTS_FILENAME).is_file()
                                                          for child in itertools.islice(path.iterdir(), 1000)):
            raise RunDirectoryError(f"{path} is a directory of runs, not one run: name one of them "
                                    f"({path}/<run>), or list them with `morphogen runs {path}`")
        if is_summary_only_run(path):
            raise RunDirectoryError(f"{path} has no {EVENTS_FILENAME}: it was made with --telemetry off, so only "
                                    f"`morphogen report {path}` (its summary.json, as text) and `morphogen runs` "
                                    "read it")
        raise RunDirectoryError(f"{path} has no {EVENTS_FILENAME} (was the run made with --telemetry off?)")
    if not events.is_file():
        raise RunDirectoryError(f"{events} is not a regular file")
    return path


def is_summary_only_run(path: Path) -> bool:
    """Whether `path` holds a run made with `--telemetry off`: its config.json and summary.json, no events."""
    return (not os.path.lexists(path / EVENTS_FILENAME) and (path / CONFIG_FILENAME).is_file()
            and (path / SUMMARY_FILENAME).is_file())


def load_run_files(run_dir: str | Path, *, without_events: bool = False) -> RunFiles:
    """Config, events (with times), the comparisons' events and summary of a run directory, skipping damage.

    `RunDirectoryError` when its own events cannot be read; the other files read as missing when damaged.
    With `without_events`, a run made with `--telemetry off` reads as its config and summary, with no events.
    """
    path = check_run_dir(run_dir, without_events=without_events)
    missing = without_events and is_summary_only_run(path)
    timed: list[TimedEvent] = []
    skipped = 0
    if not missing:
        events = EventTail(path / EVENTS_FILENAME)
        try:
            timed = events.read_new(final=True)
        except OSError as error:
            raise RunDirectoryError(f"{path}: cannot read its events: {error.strerror or error}") from None
        skipped = events.skipped
    unreadable: list[str] = []
    comparisons: dict[str, list[TimedEvent]] = {}
    for directory in (BASELINE_DIRNAME, FROM_SCRATCH_DIRNAME):
        tail = EventTail(path / directory / EVENTS_FILENAME)
        if missing and not os.path.lexists(path / directory / EVENTS_FILENAME):
            comparisons[directory] = []
            continue
        try:
            comparisons[directory] = tail.read_new(final=True)
        except (OSError, RunDirectoryError):
            comparisons[directory] = []
            unreadable.append(f"{directory}/{EVENTS_FILENAME}")
        skipped += tail.skipped
    objects = {name: read_json_object(path / name) for name in (CONFIG_FILENAME, SUMMARY_FILENAME)}
    unreadable += [name for name, value in objects.items() if value is None and os.path.lexists(path / name)]
    return RunFiles(path=path, config=objects[CONFIG_FILENAME] or {}, events=timed,
                    baseline_events=comparisons[BASELINE_DIRNAME],
                    from_scratch_events=comparisons[FROM_SCRATCH_DIRNAME], summary=objects[SUMMARY_FILENAME],
                    skipped=skipped, unreadable=tuple(unreadable), without_events=missing)


def round_cell(round_number: int) -> str:
    """A round as a table's round column shows it: its number, or "imit" for the imitation warm start's episodes."""
    return "imit" if round_number == IMITATION_ROUND else str(round_number)


def round_of_events(history: Iterable[Event]) -> Iterator[tuple[int, Event]]:
    """(round, event) for every event: 1 + the rounds completed before it (see the module docstring).

    A `RoundCompleted` itself, and the other per-round events, belong to the round they report; the events up
    to an `ImitationCompleted` that no round precedes (the episodes of the imitation warm start) to
    `IMITATION_ROUND`.
    """
    history = list(history)
    imitation_end = next((index for index, event in enumerate(history)
                          if isinstance(event, (ImitationCompleted, RoundCompleted))), None)
    if imitation_end is not None and not isinstance(history[imitation_end], ImitationCompleted):
        imitation_end = None
    completed = 0
    for index, event in enumerate(history):
        reported = getattr(event, "round", None)
        if imitation_end is not None and index <= imitation_end:
            yield IMITATION_ROUND, event
        else:
            yield (reported if isinstance(reported, int) else completed + 1), event
        if isinstance(event, RoundCompleted):
            completed = event.round


def events_by_round(history: Iterable[Event]) -> dict[int, list[Event]]:
    """The events of each round (`round_of_events`), rounds in order."""
    grouped: dict[int, list[Event]] = defaultdict(list)
    for round_number, event in round_of_events(history):
        grouped[round_number].append(event)
    return grouped


def config_value(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """`config["a"]["b"]` for "a.b", or `default` when a key is missing."""
    value: Any = config
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value


def task_label(config: Mapping[str, Any]) -> str | None:
    """The task a run's config names for people: its own name (`task_name`, which a user's task carries)
    before the name or import path it was loaded by (`task`); None when neither is a string.

    A `train` over several tasks (`tasks`, `[[mix]]`) is labelled by them, comma-separated in their order, each
    once: its `task` is then the default that no round played."""
    mix = config.get("mix")
    entries = [entry.get("task") for entry in mix if isinstance(entry, Mapping)] if isinstance(mix, list) and mix \
        else config.get("tasks")
    if isinstance(entries, list) and entries and all(isinstance(task, str) and task for task in entries):
        return ",".join(dict.fromkeys(entries))
    for key in ("task_name", "task"):
        value = config.get(key)
        if isinstance(value, str) and value:
            return value
    return None
