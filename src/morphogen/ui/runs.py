"""`morphogen runs [DIR]`: every run under a directory as one table, queried with DuckDB over the files as
they are (no import step, no database file): each run directory's `events.jsonl`, `config.json` and
`summary.json` are read in place by `read_json`, so a run still being written shows what it wrote so far.

Views (`run` is the run directory's name everywhere):

- `events`: every event of every run, one row per JSON line; columns are the union of all event fields
  (`event`, `time`, `epoch`, `env_id`, `round`, `val_accuracy`, ...), NULL where an event lacks one.
- `epochs`: `epoch_completed` events: run, env_id, round, epoch, val_accuracy, val_loss, train_loss,
  param_count, action. `round` is NULL here (epochs carry no round); `rounds` has the per-round means.
- `episodes`: `episode_completed` events: run, env_id, epoch, final_accuracy, param_count, host_param_count,
  fossilized, pruned, episode_return.
- `rounds`: `round_completed` events: run, round, mean_return, mean_final_accuracy, mean_parameters_added,
  seconds.
- `configs`: each run's resolved config (nested settings as DuckDB structs: `configs.episode.max_epochs`).
- `runs`: one row per run: run, command (run or train), task, seed, episodes, epochs, rounds,
  final_accuracy (the last episode's in a run, the last round's mean in a training run), parameters,
  baseline_accuracy and baseline_parameters (a run's no-growth episode, from summary.json), events,
  started (UTC), seconds (first to last event).

`--where` filters `runs` with any SQL condition over its columns, e.g. `--where "task = 'digits' AND
final_accuracy > 95"`. Only this module imports duckdb; the other commands never need it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.table import Column, Table

from morphogen.run_directory import CONFIG_FILENAME, EVENTS_FILENAME, SUMMARY_FILENAME
from morphogen.ui.progress import LINE_WIDTH
from morphogen.ui.run_files import check_run_dir

RUN_COLUMNS = ("run", "command", "task", "seed", "episodes", "epochs", "rounds", "final_accuracy", "parameters",
               "baseline_accuracy", "events", "started", "seconds")
"""Columns of `runs` printed by `morphogen runs` (the view has a few more: see the module docstring)."""


class RunsQueryError(ValueError):
    """A `--where` condition or a `--compare` run that cannot be used; the message says why."""


def _run_name(column: str = "filename") -> str:
    return f"regexp_extract({column}, '([^/\\\\]+)[/\\\\][^/\\\\]+$', 1)"


def _json_source(root: Path, filename: str, json_format: str = "auto") -> str | None:
    """A `read_json` over `root/*/filename`, or None when no run directory holds that file."""
    if not any(root.glob(f"*/{filename}")):
        return None
    pattern = str(root / "*" / filename).replace("'", "''")
    return (f"read_json('{pattern}', format='{json_format}', union_by_name=true, filename=true, "
            "maximum_object_size=67108864)")


def connect(root: str | Path) -> Any:
    """An in-memory DuckDB connection with the views of the module docstring over the runs under `root`.

    A file DuckDB cannot read (say, a truncated config) is a `RunsQueryError` naming it.
    """
    import duckdb

    try:
        return _create_views(duckdb.connect(), Path(root))
    except duckdb.Error as error:
        raise RunsQueryError(f"cannot read the runs under {root}: {str(error).splitlines()[0]}") from None


def _create_views(connection: Any, root: Path) -> Any:
    if not root.is_dir():
        raise RunsQueryError(f"{root} is not a directory (expected the parent of run directories, e.g. runs/)")
    events = _json_source(root, EVENTS_FILENAME, "newline_delimited")
    if events is None:
        raise RunsQueryError(f"no run under {root}: no {root}/*/{EVENTS_FILENAME}")
    connection.execute(f"CREATE VIEW events AS SELECT {_run_name()} AS run, * EXCLUDE (filename) FROM {events}")
    columns = {row[0] for row in connection.execute("DESCRIBE events").fetchall()}

    def column(name: str) -> str:
        """`name` in a select list, as NULL when no event has that field."""
        return name if name in columns else f"NULL AS {name}"

    def value(name: str) -> str:
        """`name` in an expression, NULL when no event has that field."""
        return name if name in columns else "NULL"

    connection.execute(f"""CREATE VIEW epochs AS SELECT run, env_id, {column('round')}, epoch, val_accuracy,
        val_loss, train_loss, param_count, action FROM events WHERE event = 'epoch_completed'""")
    connection.execute(f"""CREATE VIEW episodes AS SELECT run, env_id, epoch, final_accuracy, param_count,
        host_param_count, {column('fossilized')}, {column('pruned')}, episode_return
        FROM events WHERE event = 'episode_completed'""")
    round_columns = ", ".join(column(c) for c in ("round", "mean_return", "mean_final_accuracy",
                                                   "mean_parameters_added", "seconds"))
    connection.execute(f"CREATE VIEW rounds AS SELECT run, {round_columns} FROM events "
                       "WHERE event = 'round_completed'")
    configs = _json_source(root, CONFIG_FILENAME)
    if configs is not None:
        connection.execute(f"CREATE VIEW configs AS SELECT {_run_name()} AS run, * EXCLUDE (filename) FROM {configs}")
    else:
        connection.execute("CREATE VIEW configs AS SELECT NULL::VARCHAR AS run WHERE false")
    config_columns = {row[0] for row in connection.execute("DESCRIBE configs").fetchall()}
    summaries = _json_source(root, SUMMARY_FILENAME)
    baseline = "NULL::DOUBLE AS baseline_accuracy, NULL::BIGINT AS baseline_parameters"
    if summaries is not None:
        connection.execute(f"CREATE VIEW summaries AS SELECT {_run_name()} AS run, * EXCLUDE (filename) "
                           f"FROM {summaries}")
        baseline = ("s.baseline.final_accuracy::DOUBLE AS baseline_accuracy, "
                    "s.baseline.parameters::BIGINT AS baseline_parameters")
    join_summary = "LEFT JOIN summaries s USING (run)" if summaries is not None else ""

    def config(name: str, cast: str) -> str:
        return f"c.{name}::{cast}" if name in config_columns else f"NULL::{cast}"

    connection.execute(f"""CREATE VIEW runs AS
        WITH per_run AS (
            SELECT run, count(*) AS events, min(time) AS first_time, max(time) AS last_time,
                   count(*) FILTER (WHERE event = 'episode_completed') AS episodes,
                   count(*) FILTER (WHERE event = 'epoch_completed') AS epochs,
                   max({value('round')}) FILTER (WHERE event = 'round_completed') AS rounds
            FROM events GROUP BY run),
        last_episode AS (SELECT run, arg_max(final_accuracy, time) AS accuracy, arg_max(param_count, time) AS params
            FROM episodes JOIN (SELECT run, time, event, epoch, env_id FROM events WHERE event = 'episode_completed')
            USING (run, epoch, env_id) GROUP BY run),
        last_round AS (SELECT run, arg_max(mean_final_accuracy, round) AS accuracy FROM rounds GROUP BY run)
        SELECT p.run,
               CASE WHEN p.rounds IS NOT NULL OR {config('rounds', 'BIGINT')} IS NOT NULL THEN 'train' ELSE 'run' END
                   AS command,
               {config('task', 'VARCHAR')} AS task, {config('seed', 'BIGINT')} AS seed,
               p.episodes, p.epochs, p.rounds,
               round(coalesce(r.accuracy, e.accuracy), 2) AS final_accuracy, e.params AS parameters,
               {baseline}, p.events,
               date_trunc('second', to_timestamp(p.first_time)::TIMESTAMP) AS started,
               round(p.last_time - p.first_time, 1) AS seconds
        FROM per_run p LEFT JOIN configs c USING (run) LEFT JOIN last_episode e USING (run)
        LEFT JOIN last_round r USING (run) {join_summary}""")
    return connection


def query_runs(root: str | Path, where: str | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, rows) of `runs` under `root`, filtered by the SQL condition `where`, oldest first."""
    import duckdb

    connection = connect(root)
    condition = f"WHERE {where}" if where else ""
    try:
        cursor = connection.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs {condition} ORDER BY started, run")
    except duckdb.Error as error:
        raise RunsQueryError(f"--where {where!r}: {str(error).splitlines()[0]}") from None
    return [d[0] for d in cursor.description], cursor.fetchall()


def compare_runs(run_a: str | Path, run_b: str | Path) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Two runs' curves side by side: per epoch (env 0) for runs, per round for training runs."""
    paths = [check_run_dir(run_a), check_run_dir(run_b)]
    if paths[0].parent.resolve() != paths[1].parent.resolve():
        raise RunsQueryError("--compare needs two runs under the same directory (e.g. runs/A runs/B)")
    connection = connect(paths[0].parent)
    names = [path.name for path in paths]
    rounds = connection.execute("SELECT count(*) FROM rounds WHERE run IN (?, ?)", names).fetchone()
    a, b = names
    if rounds is not None and rounds[0] > 0:
        sql = """SELECT round, max(mean_final_accuracy) FILTER (WHERE run = $a) AS accuracy_a,
                        max(mean_final_accuracy) FILTER (WHERE run = $b) AS accuracy_b,
                        max(mean_return) FILTER (WHERE run = $a) AS return_a,
                        max(mean_return) FILTER (WHERE run = $b) AS return_b
                 FROM rounds WHERE run IN ($a, $b) GROUP BY round ORDER BY round"""
        header = ["round", f"acc % {a}", f"acc % {b}", f"return {a}", f"return {b}"]
    else:
        sql = """SELECT epoch, max(val_accuracy) FILTER (WHERE run = $a), max(val_accuracy) FILTER (WHERE run = $b),
                        max(param_count) FILTER (WHERE run = $a), max(param_count) FILTER (WHERE run = $b)
                 FROM epochs WHERE run IN ($a, $b) AND env_id = 0 GROUP BY epoch ORDER BY epoch"""
        header = ["epoch", f"acc % {a}", f"acc % {b}", f"params {a}", f"params {b}"]
    return header, connection.execute(sql, {"a": a, "b": b}).fetchall()


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    return str(value)


def print_table(header: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO) -> None:
    numeric = [all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) for i in range(len(header))]
    columns = [Column(name, justify="right" if is_number else "left") for name, is_number in zip(header, numeric,
                                                                                                strict=True)]
    table = Table(*columns, box=None, pad_edge=False, header_style="bold")
    for row in rows:
        table.add_row(*(_cell(value) for value in row))
    Console(file=out, width=max(LINE_WIDTH, 200), highlight=False).print(table)


def runs_command(root: str | Path = "runs", *, where: str | None = None, compare: Sequence[str] | None = None,
                 out: TextIO | None = None) -> None:
    """Print the runs table (or, with `compare`, two runs' curves side by side) to `out`."""
    out = sys.stdout if out is None else out
    if compare:
        header, rows = compare_runs(*compare)
    else:
        header, rows = query_runs(root, where)
    if not rows:
        print("no runs match" if where else "no runs", file=out)
        return
    print_table(header, rows, out)
