"""`morphogen runs [DIR]`: every run under a directory as one table, queried with DuckDB.

Each run directory under DIR (its direct subdirectories holding an `events.jsonl`, the `seed_<s>` runs inside a
run over seeds, named `<dir>/seed_<s>`, and runs made with `--telemetry off`, read from their config.json and
summary.json alone) is read with the tolerant readers of `run_files`: damaged lines are skipped and counted, a
damaged `config.json` or `summary.json` reads as missing, and a run with no readable event is left out and named,
so one bad run never hides the others. What was read is loaded into an in-memory DuckDB database; then DuckDB's
access to files and the network is switched off and its configuration locked.

Views (`run` is the run directory's name everywhere):

- `events`: every event of every run, one row per event; columns are the union of all event fields
  (`event`, `time`, `epoch`, `env_id`, `round`, `val_accuracy`, ...), NULL where an event lacks one.
  Non-finite numbers (written as "NaN", "Infinity") and integers past 64 bits read as NULL.
- `epochs`: `epoch_completed` events: run, env_id, round, epoch, val_accuracy, val_loss, train_loss,
  param_count, action. `round` is NULL here (epochs carry no round); `rounds` has the per-round means.
- `episodes`: `episode_completed` events: run, env_id, epoch, final_accuracy, param_count, host_param_count,
  fossilized, pruned, episode_return.
- `rounds`: `round_completed` events: run, round, mean_return, mean_final_accuracy, mean_parameters_added,
  seconds.
- `configs`: each run's resolved config (nested settings as DuckDB structs: `configs.episode.max_epochs`;
  a setting whose type differs between runs is a JSON column).
- `runs`: one row per run: run, command (run, train or eval), task, seed, episodes, epochs, rounds,
  final_accuracy (the last episode's in a run, the last round's mean in a training run, the learned policy's
  mean over an evaluation's episodes from its eval.json), parameters,
  gflops (a run's training FLOPs in billions, unrounded: host, seeds, shadow passes and validation; from summary.json),
  score (what final_accuracy is: "accuracy", "negative loss" for a task with its own loss, or the name of a
  user's metric) and final_loss (the grown model's final validation loss; both from a run's summary.json),
  baseline_accuracy and baseline_parameters (a run's no-growth episode, from summary.json),
  from_scratch_accuracy and from_scratch_parameters (the grown model's final architecture trained from
  scratch, from summary.json; where no seed was kept, `nothing_kept`, that architecture is the host and these are
  the no-growth run's, as the run's seed lines and seeds.json give them), nothing_kept, events, started (UTC),
  seconds (the grown model's training time from summary.json, as the run's closing table gives it; first to last
  event for a run without one, a training run or a run still going).

`--where` is one SQL expression over the columns of `runs`, e.g. `--where "task = 'digits' AND
final_accuracy > 95"`: a second statement, a `SET`, and any function that reaches files (`read_text`,
`COPY`, `ATTACH`, ...) are refused with one line. `--compare RUN RUN` loads only those two runs, by the same
readers: any two run directories, or runs as the table of DIR names them. Only this module imports duckdb; the
other commands never need it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from morphogen.run_directory import (
    EVENTS_FILENAME,
    MAX_JSON_BYTES,
    SCORES_FILENAME,
    is_seeds_directory,
    read_regular_file,
)
from morphogen.telemetry.events import Event
from morphogen.ui.progress import LINE_WIDTH
from morphogen.ui.run_files import (
    RunDirectoryError,
    RunFiles,
    ScoreKind,
    check_run_dir,
    is_summary_only_run,
    load_run_files,
    nothing_kept,
    score_kind,
    summary_number,
    task_label,
)
from morphogen.ui.terminal_text import printable, printable_cut

RUN_COLUMNS = ("run", "command", "task", "seed", "episodes", "epochs", "rounds", "final_accuracy", "parameters",
               "gflops", "baseline_accuracy", "from_scratch_accuracy", "events", "started", "seconds")
"""Columns of `runs` printed by `morphogen runs` (the view has a few more: see the module docstring)."""
NOTHING_KEPT_NOTE = ("* nothing kept: no seed was blended in, so the final architecture is the host and its from "
                     "scratch accuracy is the no-growth run's (as the run's seed lines and seeds.json give it)")
"""The note under a table in which some run kept no seed."""
MAX_CONFIG_DEPTH = 16
"""Config settings nested deeper than this read as NULL (real configs nest three deep)."""
MAX_CONFIG_SETTINGS = 2_000
"""Distinct settings (dotted key paths) of all runs' configs in the `configs` view: each is a DuckDB column,
and 50,000 of them took 30 s and 1.4 GB. A config that would pass the cap is left out of `configs` and
named (a run's config has about 120; a few versions of them together stay far below)."""
_INT64 = 2**63


class RunsQueryError(ValueError):
    """A `--where` condition or a `--compare` run that cannot be used; the message says why."""


@dataclasses.dataclass
class Runs:
    """An in-memory DuckDB connection with the views of the module docstring, and what reading left out."""

    connection: Any
    skipped_runs: list[str]
    """Run directories left out, each with why."""
    damaged_runs: dict[str, str]
    """Runs shown in spite of damage (or unfinished), by name, each with what was skipped or is missing."""

    def notes(self, shown: Collection[str] | None = None) -> list[str]:
        """Lines saying which runs were left out and which were read in part: of the latter, only those `shown`
        where a filter left some out (a note under a table on a run it does not list would read as its own)."""
        notes = [f"skipped run {note}" for note in self.skipped_runs]
        return notes + [f"run {printable(name)}: {note}" for name, note in self.damaged_runs.items()
                        if shown is None or name in shown]


def _json_value(value: Any, depth: int = 0) -> Any:
    """`value` with non-finite floats and integers past 64 bits as None, and anything deeper than
    `MAX_CONFIG_DEPTH` as None: what DuckDB can type."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if -_INT64 <= value < _INT64 else None
    if depth >= MAX_CONFIG_DEPTH:
        return None
    if isinstance(value, list):
        return [_json_value(item, depth + 1) for item in value]
    if isinstance(value, dict):
        seen: set[str] = set()
        table = {}
        for key, item in value.items():
            if key and key.lower() not in seen:  # DuckDB's struct fields are case-insensitive and never empty
                seen.add(key.lower())
                table[key] = _json_value(item, depth + 1)
        return table
    return None


def _setting_paths(value: Any, prefix: str = "", depth: int = 0) -> Iterator[str]:
    """The dotted path of every key of `value` at any depth (lists looked into, as `[]`): DuckDB's columns."""
    if depth >= MAX_CONFIG_DEPTH:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{str(key).lower()}"
            yield path
            yield from _setting_paths(item, path, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _setting_paths(item, f"{prefix}[]", depth + 1)


def _config_rows(runs: Sequence[tuple[str, RunFiles]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The `configs` rows of `runs`, and a note for each run whose config was left out for its size."""
    rows: list[dict[str, Any]] = []
    notes: dict[str, str] = {}
    columns: set[str] = set()
    for name, files in runs:
        paths: set[str] = set()
        for path in _setting_paths(files.config):
            if path not in columns:
                paths.add(path)
            if len(columns) + len(paths) > MAX_CONFIG_SETTINGS:
                notes[name] = (f"config.json left out of configs (with the other runs' settings it passes "
                               f"{MAX_CONFIG_SETTINGS:,} columns)")
                break
        else:
            columns |= paths
            rows.append({**_json_value(files.config), "run": name})
    return rows, notes


def _event_row(run: str, time: float, event: Event) -> dict[str, Any]:
    record = event.to_dict()
    for item in dataclasses.fields(event):
        value = getattr(event, item.name)
        if isinstance(value, float | int) and not isinstance(value, bool):
            record[item.name] = _json_value(value)  # the "NaN" tokens of to_dict, and huge integers, as NULL
    return {"run": run, "time": time, **record}


def _run_row(run: str, files: RunFiles) -> dict[str, Any]:
    """What `runs` takes from a run's config and summary, typed here so that damage reads as NULL."""
    config, summary = files.config, files.summary or {}
    grown = summary.get("grown")
    task, seed = task_label(config), config.get("seed")
    flops = summary_number(grown.get("flops") if isinstance(grown, dict) else None, "total")
    evaluation = "episodes" in config and "policy" in config and "rounds" not in config  # `eval --run-dir`
    row = {"run": run, "task": task,
           "seed": _json_value(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None,
           "has_rounds": "rounds" in config, "is_eval": evaluation,
           "eval_accuracy": _learned_accuracy(files.path) if evaluation else None,
           "gflops": None if flops is None else flops / 1e9,  # exact: rounded once, where it is printed
           "score": score_kind(summary).name if grown else None, "final_loss": summary_number(grown, "final_loss"),
           "grown_accuracy": summary_number(grown, "final_accuracy"),
           "grown_seconds": summary_number(grown, "seconds"),
           "grown_parameters": _whole_number(summary_number(grown, "parameters"))}
    kept_none = nothing_kept(config, files.summary)
    row["nothing_kept"] = kept_none
    # As the run's seed lines and seeds.json say: where nothing was kept, from scratch is the no-growth run.
    for column, key in (("baseline", "baseline"), ("from_scratch", "baseline" if kept_none else "from_scratch")):
        parameters = summary_number(summary.get(key), "parameters")
        row[f"{column}_accuracy"] = summary_number(summary.get(key), "final_accuracy")
        row[f"{column}_parameters"] = _whole_number(parameters)
    return row


def _whole_number(value: float | None) -> int | None:
    """A count read from summary.json as an integer DuckDB can hold (None where it is missing or too large)."""
    return None if value is None else _json_value(int(value))


def _learned_accuracy(run_dir: Path) -> float | None:
    """The learned policy's mean final accuracy in an evaluation's `eval.json` (None where it is missing or not
    the table `eval` writes)."""
    try:
        table = json.loads(read_regular_file(run_dir / SCORES_FILENAME, MAX_JSON_BYTES))
    except (OSError, ValueError):
        return None
    rows = table if isinstance(table, list) else []
    learned = next((row for row in rows if isinstance(row, dict) and row.get("name") == "learned"), None)
    accuracies = learned.get("accuracies") if learned is not None else None
    if not isinstance(accuracies, list) or not accuracies or not all(
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            for value in accuracies):
        return None
    return round(sum(accuracies) / len(accuracies), 2)


def _write_lines(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    count = 0
    with path.open("w", encoding="utf-8") as file:
        for row in rows:
            line = json.dumps(row, allow_nan=False, ensure_ascii=False)
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate, which DuckDB refuses: the load of every run would fail
                line = json.dumps(_without_lone_surrogates(row), allow_nan=False, ensure_ascii=False)
            file.write(line + "\n")
            count += 1
    return count


def _without_lone_surrogates(value: Any) -> Any:
    """`value` with each lone surrogate in its strings written as a `\\udcff`-style escape. A run's JSON may hold
    one (`"\\ud800"` parses), and so may a run's name (a directory name not in UTF-8: `os.fsdecode`'s surrogates)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_without_lone_surrogates(key): _without_lone_surrogates(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_lone_surrogates(item) for item in value]
    return value


def _run_paths(root: Path) -> Iterator[tuple[str, Path]]:
    """(name, path) of every run directly under `root`, and of each seed's run inside a run over seeds
    (named `<dir>/seed_<s>`); a run made with `--telemetry off` counts by its config and summary."""
    for path in sorted(root.iterdir()):
        if is_seeds_directory(path):
            for seed_run in sorted(child for child in path.iterdir() if child.name.startswith("seed_")):
                if (seed_run / EVENTS_FILENAME).is_file() or is_summary_only_run(seed_run):
                    yield f"{path.name}/{seed_run.name}", seed_run
        elif (path / EVENTS_FILENAME).is_file() or is_summary_only_run(path):
            yield path.name, path


def read_runs(root: Path) -> tuple[list[tuple[str, RunFiles]], list[str]]:
    """(name, files) of every readable run under `root` (see `_run_paths`), and the names of those left out
    with why."""
    if not root.is_dir():
        raise RunsQueryError(f"{root} is not a directory (expected the parent of run directories, e.g. runs/)")
    if (root / EVENTS_FILENAME).is_file() or is_summary_only_run(root):  # its baseline/ would be listed as runs
        shown = printable(str(root))
        raise RunsQueryError(f"{shown} is one run, not a directory of runs: `morphogen report {shown}` tells it, "
                             f"`morphogen runs {printable(str(root.parent))}` lists it with the others")
    runs, skipped = [], []
    for name, path in _run_paths(root):
        try:
            files = load_run_files(path, without_events=True)
        except RunDirectoryError as error:
            skipped.append(f"{printable(name)} ({error})")
            continue
        if not files.events and not files.without_events:
            skipped.append(f"{printable(name)} (no readable event"
                           f"{'; ' + str(files.damage_note()) if files.skipped else ''})")
        else:
            runs.append((name, files))
    if not runs and not skipped:
        raise RunsQueryError(f"no run under {root}: no {root}/*/{EVENTS_FILENAME}")
    return runs, skipped


def _load_table(connection: Any, name: str, path: Path, rows: int, empty: str) -> None:
    """Table `name` from the JSON lines file `path` (morphogen's own clean copy), or `empty` when it has no rows."""
    if rows == 0:
        connection.execute(f"CREATE TABLE {name} ({empty})")
        return
    source = str(path).replace("'", "''")
    connection.execute(f"CREATE TABLE {name} AS SELECT * FROM read_json('{source}', format='newline_delimited', "
                       "sample_size=-1, maximum_object_size=16777216)")


def connect(root: str | Path) -> Any:
    """An in-memory DuckDB connection with the views of the module docstring over the runs under `root`."""
    return open_runs(Path(root)).connection


def open_runs(root: Path) -> Runs:
    """Read the runs under `root` into DuckDB (see the module docstring); `RunsQueryError` if there are none."""
    runs, skipped = read_runs(root)
    return _load_runs(runs, skipped, f"the runs under {root}")


def _load_runs(runs: Sequence[tuple[str, RunFiles]], skipped: list[str], what: str) -> Runs:
    """`runs` (name, files) in DuckDB with the views of the module docstring; `what` names them in an error."""
    import duckdb

    configs, config_notes = _config_rows(runs)
    connection = duckdb.connect()
    with tempfile.TemporaryDirectory(prefix="morphogen-runs-") as scratch:
        folder = Path(scratch)
        tables = {
            "events": ([_event_row(name, t.time, t.event) for name, files in runs for t in files.events],
                       "run VARCHAR, time DOUBLE, event VARCHAR"),
            "configs": (configs, "run VARCHAR"),
            "run_files": ([_run_row(name, files) for name, files in runs],
                          "run VARCHAR, task VARCHAR, seed BIGINT, has_rounds BOOLEAN, is_eval BOOLEAN, "
                          "eval_accuracy DOUBLE, gflops DOUBLE, "
                          "score VARCHAR, final_loss DOUBLE, grown_accuracy DOUBLE, grown_seconds DOUBLE, "
                          "grown_parameters BIGINT, "
                          "baseline_accuracy DOUBLE, baseline_parameters BIGINT, "
                          "from_scratch_accuracy DOUBLE, from_scratch_parameters BIGINT, nothing_kept BOOLEAN"),
        }
        try:
            for table, (rows, empty) in tables.items():
                count = _write_lines(folder / f"{table}.jsonl", rows)
                _load_table(connection, table, folder / f"{table}.jsonl", count, empty)
        except duckdb.Error as error:
            raise RunsQueryError(f"cannot load {what}: {str(error).splitlines()[0]}") from None
    _create_views(connection)
    connection.execute("SET enable_external_access = false")  # no file or network from here on
    connection.execute("SET lock_configuration = true")  # ... and no SET to undo that
    notes = {name: [files.damage_note(), config_notes.get(name)] for name, files in runs}
    damaged = {name: ", ".join(note for note in parts if note) for name, parts in notes.items() if any(parts)}
    return Runs(connection, skipped, damaged)


def _create_views(connection: Any) -> None:
    columns = {row[0] for row in connection.execute("DESCRIBE events").fetchall()}

    def column(name: str) -> str:
        """`name` in a select list, as NULL when no event has that field."""
        return name if name in columns else f"NULL AS {name}"

    def value(name: str) -> str:
        """`name` in an expression, NULL when no event has that field."""
        return name if name in columns else "NULL"

    connection.execute(f"""CREATE VIEW epochs AS SELECT run, {column('env_id')}, {column('round')}, {column('epoch')},
        {column('val_accuracy')}, {column('val_loss')}, {column('train_loss')}, {column('param_count')},
        {column('action')} FROM events WHERE event = 'epoch_completed'""")
    connection.execute(f"""CREATE VIEW episodes AS SELECT run, {column('env_id')}, {column('epoch')},
        {column('final_accuracy')}, {column('param_count')}, {column('host_param_count')}, {column('fossilized')},
        {column('pruned')}, {column('episode_return')} FROM events WHERE event = 'episode_completed'""")
    round_columns = ", ".join(column(c) for c in ("round", "mean_return", "mean_final_accuracy",
                                                   "mean_parameters_added", "seconds"))
    connection.execute(f"CREATE VIEW rounds AS SELECT run, {round_columns} FROM events "
                       "WHERE event = 'round_completed'")
    # Times far outside 1970..9999 (a damaged run) would make to_timestamp fail the whole query: NULL instead.
    connection.execute(f"""CREATE VIEW runs AS
        WITH per_run AS (
            SELECT run, count(*) AS events, min(time) AS first_time, max(time) AS last_time,
                   count(*) FILTER (WHERE event = 'episode_completed') AS episodes,
                   count(*) FILTER (WHERE event = 'epoch_completed') AS epochs,
                   max({value('round')}) FILTER (WHERE event = 'round_completed') AS rounds
            FROM events GROUP BY run),
        last_episode AS (SELECT run, arg_max({value('final_accuracy')}, time) AS accuracy,
                                arg_max({value('param_count')}, time) AS params
            FROM events WHERE event = 'episode_completed' GROUP BY run),
        last_round AS (SELECT run, arg_max(mean_final_accuracy, round) AS accuracy FROM rounds GROUP BY run)
        SELECT f.run,
               CASE WHEN p.rounds IS NOT NULL OR f.has_rounds THEN 'train' WHEN f.is_eval THEN 'eval'
                    ELSE 'run' END AS command,
               f.task, f.seed, p.episodes, p.epochs, p.rounds,
               round(coalesce(f.eval_accuracy, r.accuracy, e.accuracy, f.grown_accuracy), 2) AS final_accuracy,
               coalesce(e.params, f.grown_parameters) AS parameters,
               f.gflops, f.score, f.final_loss, f.baseline_accuracy, f.baseline_parameters, f.from_scratch_accuracy,
               f.from_scratch_parameters, f.nothing_kept, coalesce(p.events, 0) AS events,
               CASE WHEN p.first_time BETWEEN 0 AND 253402300799  -- UTC: to_timestamp(...)::TIMESTAMP is local time
                    THEN date_trunc('second', epoch_ms(CAST(floor(p.first_time * 1000) AS BIGINT))) END AS started,
               round(coalesce(f.grown_seconds, p.last_time - p.first_time), 2) AS seconds
        FROM run_files f LEFT JOIN per_run p USING (run) LEFT JOIN last_episode e USING (run)
        LEFT JOIN last_round r USING (run)""")


def _one_expression(where: str, columns: Sequence[str]) -> str:
    """The SELECT of `columns` that filters `runs` by `where`; `RunsQueryError` unless that is one SELECT
    statement."""
    import duckdb

    sql = f"SELECT {', '.join(columns)} FROM runs WHERE ({where}\n) ORDER BY started, run"
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as error:
        raise RunsQueryError(f"--where {printable(where)!r}: {str(error).splitlines()[0]}") from None
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        raise RunsQueryError(f"--where {printable(where)!r}: one SQL expression over the columns of runs, "
                             "e.g. \"task = 'digits'\" (no ';', no second statement)")
    return sql


def query_runs(root: str | Path, where: str | None = None, columns: Sequence[str] = RUN_COLUMNS,
               ) -> tuple[list[str], list[tuple[Any, ...]], list[str]]:
    """(column names, rows, notes on what was skipped) of `runs` under `root`: its `columns` (default those
    `morphogen runs` prints), filtered by the SQL condition `where`, oldest first."""
    import duckdb

    runs = open_runs(Path(root))
    sql = (f"SELECT {', '.join(columns)} FROM runs ORDER BY started, run" if where is None
           else _one_expression(where, columns))
    try:
        cursor = runs.connection.execute(sql)
        rows = cursor.fetchall()
    except duckdb.Error as error:
        shown = "" if where is None else f"--where {printable(where)!r}: "
        described = runs.connection.execute("SELECT column_name FROM (DESCRIBE runs)").fetchall()
        hint = f" (the columns of runs: {', '.join(name for (name,) in described)})" \
            if isinstance(error, duckdb.BinderException) else ""
        raise RunsQueryError(f"{shown}{str(error).splitlines()[0]}{hint}") from None
    header = [d[0] for d in cursor.description]
    listed = None if where is None or "run" not in header else {row[header.index("run")] for row in rows}
    return header, rows, runs.notes(listed)


def _compared_run(run: str | Path, root: Path) -> Path:
    """The run directory `--compare` names: a path, or a run's name as `morphogen runs root` lists it
    (`seed_0`, `cos30/seed_0`); `RunsQueryError` naming both places where it is neither."""
    path = Path(run)
    if not path.is_dir() and (root / path).is_dir():
        path = root / path
    if not path.is_dir():
        shown = printable(str(root))
        raise RunsQueryError(f"--compare {printable(str(run))}: no such run directory, here or under {shown} (name "
                             f"a run's directory, or a run as `morphogen runs {shown}` lists it)")
    return check_run_dir(path)


def _labels(paths: Sequence[Path]) -> list[str]:
    """The names two compared runs go by: their directories' names, with as many parents as tell them apart
    (`a/seed_0` and `b/seed_0`)."""
    labels = [path.name for path in paths]
    for depth in range(2, max(len(path.parts) for path in paths) + 1):
        if labels[0] != labels[1]:
            break
        labels = ["/".join(path.parts[-depth:]) for path in paths]
    return labels


def compare_runs(run_a: str | Path, run_b: str | Path, root: str | Path = "runs",
                 ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Two runs' curves side by side: per epoch (env 0) for runs, per round for training runs. Each is any run
    directory (a seed's, a comparison's `baseline`), or a run's name under `root`; only those two are read. Each
    run's score is headed by its own name ("acc %", "loss", "R2") and a negated loss is shown as the loss, as
    `report` shows them."""
    paths = [_compared_run(run_a, Path(root)), _compared_run(run_b, Path(root))]
    names = _labels(paths)
    runs = [(name, load_run_files(path)) for name, path in zip(names, paths, strict=True)]
    kinds = ["a training run (curves per round)" if files.is_training else "a run (curves per epoch)"
             for _, files in runs]
    if kinds[0] != kinds[1]:  # one's column would be all '-': nothing lines up
        raise RunsQueryError(f"--compare: {printable(names[0])} is {kinds[0]} and {printable(names[1])} {kinds[1]}; "
                             "compare two of one kind")
    connection = _load_runs(runs, [], " and ".join(printable(name) for name in names)).connection
    rounds = connection.execute("SELECT count(*) FROM rounds WHERE run IN (?, ?)", names).fetchone()
    a, b = names
    scores = (runs[0][1].score, runs[1][1].score)
    scored = [f"{_score_header(score)} {name}" for score, name in zip(scores, names, strict=True)]
    if rounds is not None and rounds[0] > 0:
        sql = """SELECT round, max(mean_final_accuracy) FILTER (WHERE run = $a) AS accuracy_a,
                        max(mean_final_accuracy) FILTER (WHERE run = $b) AS accuracy_b,
                        max(mean_return) FILTER (WHERE run = $a) AS return_a,
                        max(mean_return) FILTER (WHERE run = $b) AS return_b
                 FROM rounds WHERE run IN ($a, $b) GROUP BY round ORDER BY round"""
        header = ["round", *scored, f"return {a}", f"return {b}"]
    else:
        sql = """SELECT epoch, max(val_accuracy) FILTER (WHERE run = $a), max(val_accuracy) FILTER (WHERE run = $b),
                        max(param_count) FILTER (WHERE run = $a), max(param_count) FILTER (WHERE run = $b)
                 FROM epochs WHERE run IN ($a, $b) AND env_id = 0 GROUP BY epoch ORDER BY epoch"""
        header = ["epoch", *scored, f"params {a}", f"params {b}"]
    rows = [(step, *(None if value is None else score.shown(value) for score, value in zip(scores, (x, y),
                                                                                            strict=True)), *rest)
            for step, x, y, *rest in connection.execute(sql, {"a": a, "b": b}).fetchall()]
    return header, rows


def _score_header(score: ScoreKind) -> str:
    """A compared run's score column's name: "acc %" for accuracy, "loss" for a negated loss, else the metric's."""
    return "acc %" if score.is_accuracy else score.label


def _three_digits(value: float) -> str:
    """A positive figure to three significant digits without an exponent, as `format_flops` prints it: 5.23, 11.5,
    0.00939 (9.39 MFLOP in GFLOP; two decimals would print 0.01); 100 and above whole, with separators."""
    if not math.isfinite(value) or value <= 0:
        return f"{value:.2f}"
    decimals = max(0, 2 - math.floor(math.log10(value)))
    return f"{value:,.{decimals}f}"


#: The most columns a string cell of the runs table shows (a task's import path, a mix of tasks): cut here, between
#: whole escapes, so that the table is never wide enough for Rich to cut a cell inside one.
MAX_TEXT_CELL = 60


def _is_parameter_count(column: str) -> bool:
    """Whether a column holds parameter counts (`parameters`, `baseline_parameters`, `--compare`'s `params a`),
    printed with thousands separators as `run` prints them (1,442)."""
    return column.endswith("parameters") or column.startswith("params ")


def _cell(value: Any, three_digits: bool = False, parameter_count: bool = False) -> Text:
    """A table cell as plain text: strings from a run are never read as Rich markup or control sequences, and are
    cut to `MAX_TEXT_CELL` columns; a float of a `three_digits` column to three significant digits; a
    `parameter_count` with thousands separators."""
    if value is None:
        return Text("-")
    if three_digits and isinstance(value, float):
        return Text(_three_digits(value))
    if isinstance(value, float):
        return Text(f"{value:.2f}" if not math.isfinite(value) or abs(value) < 1e6 else f"{value:,.0f}")
    if isinstance(value, int):
        return Text(f"{value:,}" if parameter_count or abs(value) >= 10_000 else str(value))
    return Text(printable_cut(str(value), MAX_TEXT_CELL))


def print_table(header: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO,
                marked: Collection[tuple[int, int]] = (), three_digits: Collection[str] = ("gflops",)) -> None:
    """`rows` under `header` as an aligned table, numbers right-aligned; the cells `marked` (row, column) end in
    `*`, which a note under the table explains; the columns named in `three_digits` (training GFLOPs) are printed
    to three significant digits, as the run printed them."""
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) for i in range(len(header))]
    columns = [Column(Text(printable(name)), justify="right" if is_number else "left")
               for name, is_number in zip(header, numeric, strict=True)]
    table = Table(*columns, box=None, pad_edge=False, header_style="bold")
    starred = {column for _, column in marked}  # their other cells end in a space, to keep the digits aligned
    for index, row in enumerate(rows):
        table.add_row(*(_cell(value, header[column] in three_digits, _is_parameter_count(header[column]))
                        + ("*" if (index, column) in marked else " " if column in starred else "")
                        for column, value in enumerate(row)))
    # As wide as the table needs: the cells are cut already, and a cut of Rich's could fall inside an escape.
    Console(file=out, width=max(LINE_WIDTH, 200, Console(width=100_000).measure(table).maximum),
            highlight=False).print(table)


def runs_command(root: str | Path = "runs", *, where: str | None = None, compare: Sequence[str] | None = None,
                 out: TextIO | None = None) -> None:
    """Print the runs table (or, with `compare`, two runs' curves side by side) to `out`."""
    out = sys.stdout if out is None else out
    notes: list[str] = []
    marked: set[tuple[int, int]] = set()
    if compare:
        run_a, run_b = compare
        header, rows = compare_runs(run_a, run_b, root)
    else:
        header, rows, notes = query_runs(root, where, (*RUN_COLUMNS, "nothing_kept"))
        scratch = header.index("from_scratch_accuracy")
        marked = {(index, scratch) for index, row in enumerate(rows) if row[-1] and row[scratch] is not None}
        header, rows = header[:-1], [row[:-1] for row in rows]
        notes = ([NOTHING_KEPT_NOTE] if marked else []) + notes
    if not rows:
        print("no runs match" if where else "no runs", file=out)
    else:
        print_table(header, rows, out, marked)
    for note in notes:
        print(note, file=out)
