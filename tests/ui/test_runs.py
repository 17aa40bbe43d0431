"""`morphogen runs`: DuckDB over the run directories' files, with documented views, filters and comparisons."""

from __future__ import annotations

import datetime
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from morphogen.cli import main
from morphogen.telemetry.events import EpochCompleted, RoundCompleted
from morphogen.telemetry.sinks import read_events
from morphogen.ui.runs import MAX_CONFIG_SETTINGS, NOTHING_KEPT_NOTE, connect, print_table, query_runs
from morphogen.ui.terminal_text import printable_cut
from morphogen.ui.units import format_flops


@pytest.fixture(scope="module")
def runs_root(grown_run: Path, trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    shutil.copytree(grown_run, root / "grown")
    shutil.copytree(trained_run, root / "trained")
    return root


def test_runs_can_be_queried_by_what_their_score_is(runs_root: Path) -> None:
    # A run's summary names its score: `--where "score = 'negative loss'"` finds the regressions.
    summary = json.loads((runs_root / "grown" / "summary.json").read_text())
    _, rows, _ = query_runs(runs_root, where="score = 'accuracy' AND final_loss > 0")
    assert [row[0] for row in rows] == ["grown"]  # a training run has no summary of a grown model
    _, none, _ = query_runs(runs_root, where=f"final_loss > {summary['grown']['final_loss'] + 1e-6}")
    assert none == []


def test_runs_table_has_one_row_per_run_with_its_results(runs_root: Path) -> None:
    header, rows, _ = query_runs(runs_root)
    table = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert set(table) == {"grown", "trained"}
    summary = json.loads((runs_root / "grown" / "summary.json").read_text())
    grown = table["grown"]
    assert (grown["command"], grown["task"], grown["episodes"], grown["epochs"]) == ("run", "digits", 1, 8)
    assert grown["final_accuracy"] == pytest.approx(summary["grown"]["final_accuracy"], abs=0.005)
    assert grown["parameters"] == summary["grown"]["parameters"]
    assert grown["baseline_accuracy"] == pytest.approx(summary["baseline"]["final_accuracy"])
    assert grown["from_scratch_accuracy"] == pytest.approx(summary["from_scratch"]["final_accuracy"])
    assert grown["gflops"] == pytest.approx(summary["grown"]["flops"]["total"] / 1e9, abs=0.0005)
    trained = table["trained"]
    last_round = [e for e in read_events(runs_root / "trained" / "events.jsonl") if isinstance(e, RoundCompleted)][-1]
    assert (trained["command"], trained["rounds"], trained["episodes"]) == ("train", 2, 4)
    assert trained["final_accuracy"] == pytest.approx(last_round.mean_final_accuracy, abs=0.005)
    assert trained["gflops"] is None  # a training run writes no summary.json


def test_views_are_the_events_as_written(runs_root: Path) -> None:
    connection = connect(runs_root)
    written = [e for e in read_events(runs_root / "trained" / "events.jsonl") if isinstance(e, EpochCompleted)]
    count = connection.execute("SELECT count(*) FROM epochs WHERE run = 'trained'").fetchone()
    assert count == (len(written),)
    depth = connection.execute("SELECT episode.max_epochs FROM configs WHERE run = 'trained'").fetchone()
    assert depth == (4,), "nested config settings are structs"


def test_where_filters_and_bad_sql_is_one_line_and_exit_2(runs_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", str(runs_root), "--where", "command = 'train' AND rounds >= 2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["run", "command", "task"] and [line.split()[0] for line in lines[1:]] == ["trained"]
    assert main(["runs", str(runs_root), "--where", "no_such_column > 1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("morphogen runs: error: --where") and "no_such_column" in err[0]
    assert err[0].endswith("(the columns of runs: run, command, task, seed, episodes, epochs, rounds, final_accuracy, "
                           "parameters, gflops, score, final_loss, baseline_accuracy, baseline_parameters, "
                           "from_scratch_accuracy, from_scratch_parameters, nothing_kept, events, started, seconds)")
    assert main(["runs", str(runs_root / "nothing-here")]) == 2


def test_compare_puts_two_runs_curves_side_by_side(runs_root: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(runs_root / "grown", tmp_path / "a")
    shutil.copytree(runs_root / "grown", tmp_path / "b")
    assert main(["runs", "--compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["epoch", "acc", "%", "a", "acc", "%", "b", "params", "a", "params", "b"]
    rows = [line.split() for line in lines[1:]]
    assert [row[0] for row in rows] == [str(epoch) for epoch in range(1, 9)]
    assert all(row[1] == row[2] and row[3] == row[4] for row in rows), "the same run twice gives equal columns"



def test_compare_of_a_training_run_and_a_run_is_one_line_and_exit_2(runs_root: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A training run's curves are per round and a run's per epoch: side by side, one column was all '-'."""
    assert main(["runs", str(runs_root), "--compare", "trained", "grown"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == ("morphogen runs: error: --compare: trained is a training run (curves per "
                                         "round) and grown a run (curves per epoch); compare two of one kind")

@pytest.mark.parametrize("where", [
    "(SELECT count(*) FROM read_text('/etc/hostname')) > 0",
    "(SELECT count(*) FROM glob('/*')) > 0",
    "task = 'digits'; COPY (SELECT 1) TO 'copied.csv'",
    "true); SET enable_external_access = true; SELECT (1",
    "task = 'digits'; SELECT 1",
])
def test_where_is_one_expression_that_reaches_no_file(runs_root: Path, where: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["runs", str(runs_root), "--where", where]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith("morphogen runs: error: --where")
    assert list(tmp_path.iterdir()) == []


def test_the_connection_cannot_be_reopened_to_files(runs_root: Path, tmp_path: Path) -> None:
    import duckdb

    connection = connect(runs_root)
    for statement in ("SET enable_external_access = true", f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'",
                      f"ATTACH '{tmp_path / 'x.db'}'", "SELECT * FROM read_text('/etc/hostname')"):
        with pytest.raises(duckdb.Error):
            connection.execute(statement)
    assert list(tmp_path.iterdir()) == []


def test_damaged_runs_are_read_in_part_or_named_and_never_hide_the_others(
        runs_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs[1]"  # glob characters in the root select nothing else
    shutil.copytree(runs_root / "grown", root / "grown")
    shutil.copytree(runs_root / "grown", tmp_path / "runs1" / "other")
    damaged = root / "[bold red]x"
    shutil.copytree(runs_root / "grown", damaged)
    lines = (damaged / "events.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["time"] = "NaN"
    lines[0] = json.dumps(record)
    lines[1:1] = ['{"time": 1, "event": "from_the_future"}', '{"torn": ', "[" * 100_000]
    (damaged / "events.jsonl").write_text("\n".join(lines) + '\n{"time": ')
    config = json.loads((damaged / "config.json").read_text())
    config["task"] = config["task_name"] = "[/bad]\x1b]52;c;aGk=\x07"
    (damaged / "config.json").write_text(json.dumps(config))
    (damaged / "summary.json").write_text('{"baseline": {"final_accuracy": "high", "parameters": 1e999}}')
    (root / "empty").mkdir()
    (root / "empty" / "events.jsonl").write_text('{"time": 1, "event"')
    assert main(["runs", str(root)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    rows = out.splitlines()
    # Rows go by start time, and the damaged run lost its first event's time: either may come first.
    shown = {row.split()[0]: row for row in rows[1:3]}
    assert sorted(shown) == ["[bold", "grown"] and "other" not in out
    assert "[/bad]\\x1b]52;c;aGk=\\x07" in shown["[bold"] and "\x1b" not in out
    assert rows[3:] == ["skipped run empty (no readable event; 1 line skipped)",
                        "run [bold red]x: 5 lines skipped"]


def test_a_filtered_table_notes_the_damage_of_the_runs_it_lists_only(
        runs_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--where "run = 'intact'"` listed one intact run and, under it, `run torn: 1 line skipped`: a note that reads as
    the listed run's. A run that could not be read at all is still named, whatever the filter."""
    shutil.copytree(runs_root / "grown", tmp_path / "intact")
    torn = shutil.copytree(runs_root / "grown", tmp_path / "torn")
    with (torn / "events.jsonl").open("a") as events:
        events.write("{torn\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "events.jsonl").write_text("{torn\n")
    assert main(["runs", str(tmp_path), "--where", "run = 'intact'"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [row.split()[0] for row in rows[1:]] == ["intact", "skipped"]
    assert rows[-1] == "skipped run empty (no readable event; 1 line skipped)"
    assert main(["runs", str(tmp_path)]) == 0 and "run torn: 1 line skipped" in capsys.readouterr().out


def test_started_is_utc_whatever_the_local_time_zone(runs_root: Path, tmp_path: Path) -> None:
    """DuckDB's `to_timestamp(...)::TIMESTAMP` is local time: in Tokyo, `started` read nine hours past UTC."""
    shutil.copytree(runs_root / "grown", tmp_path / "grown")
    first_time = json.loads((tmp_path / "grown" / "events.jsonl").read_text().splitlines()[0])["time"]
    utc = datetime.datetime.fromtimestamp(first_time, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    environment = {**os.environ, "TZ": "Asia/Tokyo", "PYTHONPATH": os.pathsep.join(sys.path)}
    listed = subprocess.run([sys.executable, "-m", "morphogen", "runs", str(tmp_path)], env=environment,
                            capture_output=True, text=True, check=True, timeout=120).stdout
    assert utc in listed.splitlines()[1]


def test_one_run_named_as_the_directory_of_runs_is_one_line_and_exit_2(
        grown_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`morphogen runs RUN` listed the run's baseline/ and from_scratch/ as two runs of no task, their seconds the
    span of their events, not the wall time the run printed for them."""
    assert main(["runs", str(grown_run)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == (f"morphogen runs: error: {grown_run} is one run, not a directory of runs: "
                                         f"`morphogen report {grown_run}` tells it, `morphogen runs "
                                         f"{grown_run.parent}` lists it with the others")


def test_lone_surrogates_in_a_runs_strings_or_name_hide_no_run(runs_root: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`"\\ud800"` parses as JSON, and a directory name not in UTF-8 decodes to surrogates, but DuckDB refuses a lone
    surrogate: one such string made the load of every run fail. Each shows as its escape, the other runs beside it."""
    root = tmp_path / "runs"
    shutil.copytree(runs_root / "grown", root / "grown")
    damaged = root / "damaged"
    shutil.copytree(runs_root / "grown", damaged)
    config = json.loads((damaged / "config.json").read_text())
    config["task_name"] = "odd\ud800"
    (damaged / "config.json").write_text(json.dumps(config))
    lines = (damaged / "events.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["event_key\udfff"] = "\udfff"
    lines[0] = json.dumps(record)
    (damaged / "events.jsonl").write_text("\n".join(lines) + "\n")
    shutil.copytree(runs_root / "grown", Path(os.fsdecode(bytes(root) + b"/latin\xe9")))
    assert main(["runs", str(root)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    shown = {row.split()[0]: row for row in out.splitlines()[1:4]}
    assert sorted(shown) == ["damaged", "grown", "latin\\udce9"]
    assert "odd\\ud800" in shown["damaged"]


def test_a_root_whose_every_run_is_unreadable_names_them_and_exits_0(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "events.jsonl").write_text('{"time": 1, "event"')
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "events.jsonl").write_text("")
    assert main(["runs", str(tmp_path)]) == 0
    assert main(["runs", str(tmp_path), "--where", "task = 'digits'"]) == 0
    out, err = capsys.readouterr()
    notes = ["skipped run empty (no readable event)", "skipped run torn (no readable event; 1 line skipped)"]
    assert err == "" and out.splitlines() == ["no runs", *notes, "no runs match", *notes]


def test_a_config_with_too_many_settings_is_left_out_of_configs_and_named(
        runs_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every distinct setting is a DuckDB column: 50,000 of them took 30 s and 1.4 GB before this cap."""
    shutil.copytree(runs_root / "grown", tmp_path / "grown")
    shutil.copytree(runs_root / "grown", tmp_path / "wide")
    config = json.loads((tmp_path / "wide" / "config.json").read_text())
    config["extra"] = [{f"setting{index}": index} for index in range(MAX_CONFIG_SETTINGS)]
    (tmp_path / "wide" / "config.json").write_text(json.dumps(config))
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:3]] == ["grown", "wide"]
    assert out[3] == (f"run wide: config.json left out of configs (with the other runs' settings it passes "
                      f"{MAX_CONFIG_SETTINGS:,} columns)")
    connection = connect(tmp_path)
    assert connection.execute("SELECT run FROM configs").fetchall() == [("grown",)]
    assert len(connection.execute("DESCRIBE configs").fetchall()) < 200


def test_an_evaluation_is_listed_as_eval_with_the_learned_policys_mean_accuracy(grown_run: Path,
                                                                              tmp_path: Path) -> None:
    shutil.copytree(grown_run, tmp_path / "evaluation", ignore=shutil.ignore_patterns("summary.json"))
    (tmp_path / "evaluation" / "config.json").write_text(json.dumps({"policy": "default", "episodes": 2, "seed": 0,
                                                                     "task": "digits"}))
    (tmp_path / "evaluation" / "eval.json").write_text(json.dumps([
        {"name": "learned", "accuracies": [95.5, 95.0]}, {"name": "heuristic", "accuracies": [90.0, 91.0]}]))
    header, rows, _ = query_runs(tmp_path)
    row = dict(zip(header, rows[0], strict=True))
    assert (row["command"], row["task"], row["final_accuracy"]) == ("eval", "digits", 95.25)
    (tmp_path / "evaluation" / "eval.json").write_text('[{"name": "learned", "accuracies": [NaN]}]')  # damaged
    header, rows, _ = query_runs(tmp_path)
    assert dict(zip(header, rows[0], strict=True))["command"] == "eval"  # its last episode's accuracy instead


def test_runs_lists_the_seeds_of_a_run_over_seeds_and_runs_made_without_telemetry(
        grown_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `run --seeds N` writes one run per seed inside its directory; `--telemetry off` writes no events.jsonl.
    # Both are runs a user made and looks for in the table.
    summary = json.loads((grown_run / "summary.json").read_text())
    over_seeds = tmp_path / "over-seeds"
    over_seeds.mkdir()
    (over_seeds / "seeds.json").write_text("{}")
    shutil.copytree(grown_run, over_seeds / "seed_0")
    shutil.copytree(grown_run, over_seeds / "seed_1")
    quiet = tmp_path / "quiet"
    shutil.copytree(grown_run, quiet)
    for events in quiet.rglob("events.jsonl"):
        events.unlink()
    header, rows, notes = query_runs(tmp_path)
    table = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert set(table) == {"over-seeds/seed_0", "over-seeds/seed_1", "quiet"}
    assert table["over-seeds/seed_1"]["events"] > 0
    quiet_row = table["quiet"]
    assert (quiet_row["command"], quiet_row["task"], quiet_row["events"], quiet_row["epochs"]) == ("run", "digits", 0,
                                                                                                   None)
    assert quiet_row["final_accuracy"] == pytest.approx(summary["grown"]["final_accuracy"], abs=0.005)
    assert quiet_row["parameters"] == summary["grown"]["parameters"]
    assert quiet_row["baseline_accuracy"] == pytest.approx(summary["baseline"]["final_accuracy"])
    assert notes == ["run quiet: no events.jsonl: made with --telemetry off, its figures are summary.json's"]
    # The seed runs are rows of their own; --where reaches them by name.
    assert main(["runs", str(tmp_path), "--where", "run LIKE 'over-seeds/%'"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]] == [
        "over-seeds/seed_0", "over-seeds/seed_1"]  # no note on `quiet`, which the filter leaves out


def test_gflops_are_printed_from_the_exact_count_as_the_run_prints_them(
        grown_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Rounded to 3 decimals first, 1,785,448,832 FLOPs read 1.785 and printed 1.78; the run printed 1.79 GFLOP.
    shutil.copytree(grown_run, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary["grown"]["flops"]["total"] = 1_785_448_832
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    header, rows, _ = query_runs(tmp_path)
    assert dict(zip(header, rows[0], strict=True))["gflops"] == 1.785448832
    assert main(["runs", str(tmp_path)]) == 0
    assert format_flops(1_785_448_832) == "1.79 GFLOP"
    assert capsys.readouterr().out.splitlines()[1].split()[9] == "1.79"


@pytest.mark.parametrize(("flops", "printed"), [(9_390_000, "0.00939"), (11_540_000_000, "11.5"),
                                                (123_456_000_000, "123")])
def test_gflops_keep_the_three_digits_the_run_printed_however_small(
        grown_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flops: int, printed: str) -> None:
    # A user's small MLP trained for 9.39 MFLOP; with two decimals `runs` printed its GFLOPs as 0.01.
    shutil.copytree(grown_run, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary["grown"]["flops"]["total"] = flops
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    assert main(["runs", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[9] == printed


def test_seconds_are_the_grown_models_training_time_the_run_printed(runs_root: Path) -> None:
    # The span from the first event to the last, rounded to 0.1 s, is not the wall time the run printed (1.5
    # where it printed 1.52): summary.json's figure is, where there is one.
    header, rows, _ = query_runs(runs_root)
    table = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    summary = json.loads((runs_root / "grown" / "summary.json").read_text())
    assert table["grown"]["seconds"] == round(summary["grown"]["seconds"], 2)
    times = [json.loads(line)["time"] for line in (runs_root / "trained" / "events.jsonl").read_text().splitlines()]
    assert table["trained"]["seconds"] == pytest.approx(max(times) - min(times), abs=0.005)  # no summary.json


def test_a_run_that_kept_no_seed_lists_no_growths_figures_as_from_scratch_marked_nothing_kept(
        grown_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # As the run's seed lines and seeds.json say: its final architecture is the host, trained as no growth.
    shutil.copytree(grown_run, tmp_path / "kept")
    shutil.copytree(grown_run, tmp_path / "none")
    summary = json.loads((tmp_path / "none" / "summary.json").read_text())
    summary["from_scratch"] = None
    (tmp_path / "none" / "summary.json").write_text(json.dumps(summary))
    row = connect(tmp_path).execute("SELECT from_scratch_accuracy, from_scratch_parameters, nothing_kept FROM runs "
                                    "WHERE run = 'none'").fetchone()
    assert row == (summary["baseline"]["final_accuracy"], summary["baseline"]["parameters"], True)
    assert main(["runs", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    cells = {line.split()[0]: line.split()[11] for line in lines[1:3]}
    scratch = json.loads((grown_run / "summary.json").read_text())["from_scratch"]
    assert cells == {"kept": f"{scratch['final_accuracy']:.2f}",
                     "none": f"{summary['baseline']['final_accuracy']:.2f}*"}
    assert lines[3:] == [NOTHING_KEPT_NOTE]


def test_compare_takes_any_two_run_directories_or_runs_as_the_table_names_them(
        grown_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Runs under different directories, a run beside its own no-growth training, and names under DIR.
    shutil.copytree(grown_run, tmp_path / "a" / "seed_0")
    shutil.copytree(grown_run, tmp_path / "b" / "seed_0")
    for argv in (["runs", "--compare", str(tmp_path / "a" / "seed_0"), str(tmp_path / "b" / "seed_0")],
                 ["runs", str(tmp_path), "--compare", "a/seed_0", "b/seed_0"]):
        assert main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split() == ["epoch", "acc", "%", "a/seed_0", "acc", "%", "b/seed_0", "params", "a/seed_0",
                                    "params", "b/seed_0"]
        assert len(lines) == 9 and all(row.split()[1] == row.split()[2] for row in lines[1:])
    assert main(["runs", str(tmp_path / "a"), "--compare", "seed_0", str(tmp_path / "a" / "seed_0" / "baseline")]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == ["epoch", "acc", "%", "seed_0", "acc", "%", "baseline",
                                                               "params", "seed_0", "params", "baseline"]
    assert main(["runs", str(tmp_path / "a"), "--compare", "seed_0", "seed_1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"morphogen runs: error: --compare seed_1: no such run directory, here or under {tmp_path / 'a'} (name a "
        f"run's directory, or a run as `morphogen runs {tmp_path / 'a'}` lists it)"]


def test_compare_heads_each_runs_score_by_its_name_and_shows_a_negated_loss_as_the_loss(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two runs of tasks of one's own, a regression scored by its negated loss and a segmentation by its pixel
    accuracy: their curves are headed "loss" and "pixel accuracy", not "acc %", and the loss reads 2.57, not -2.57."""
    for name, metric, score in (("regression", "negative loss", -2.5668), ("segmentation", "pixel accuracy", 80.08)):
        run = tmp_path / name
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"task_name": name, "task_metric": metric, "seed": 0}))
        event = EpochCompleted(1, 0, 2.7, 2.5668, score, 769, (), "WAIT", True)
        (run / "events.jsonl").write_text(json.dumps({"time": 1.0, **event.to_dict()}) + "\n")
    assert main(["runs", str(tmp_path), "--compare", "regression", "segmentation"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [part.strip() for part in lines[0].split("  ") if part.strip()] == [
        "epoch", "loss regression", "pixel accuracy segmentation", "params regression", "params segmentation"]
    assert lines[1].split() == ["1", "2.57", "80.08", "769", "769"]


def test_a_policy_trained_over_several_tasks_is_listed_by_them_not_by_the_default_task(grown_run: Path,
                                                                                       tmp_path: Path) -> None:
    """A `train` with `[[mix]]` or `--tasks` keeps `task = "digits"` (the default) in its config.json; the runs
    table, `report` and the dashboard named that task, which no round of the run played."""
    for name, settings in (("mix", {"mix": [{"task": "my_task:make_task"}, {"task": "mnist1d"},
                                            {"task": "my_task:make_task", "weight": 0.5}]}),
                           ("tasks", {"tasks": ["mnist1d", "text"], "mix": []})):
        shutil.copytree(grown_run, tmp_path / name, ignore=shutil.ignore_patterns("summary.json"))
        (tmp_path / name / "config.json").write_text(json.dumps({"task": "digits", "seed": 0, **settings}))
    header, rows, _ = query_runs(tmp_path)
    assert {row[0]: dict(zip(header, row, strict=True))["task"] for row in rows} == {
        "mix": "my_task:make_task,mnist1d", "tasks": "mnist1d,text"}


def test_parameter_counts_carry_thousands_separators_as_run_prints_them() -> None:
    # `run` prints 1,442 parameters; the table printed 1442 (separators only from 10,000), seeds stay bare.
    out = io.StringIO()
    print_table(["run", "seed", "parameters", "baseline_parameters"], [("a", 1234, 1442, 980)], out)
    assert out.getvalue().splitlines()[1].split() == ["a", "1234", "1,442", "980"]
    out = io.StringIO()
    print_table(["epoch", "params a", "params b"], [(1, 1442, 2026)], out)
    assert out.getvalue().splitlines()[1].split() == ["1", "1,442", "2,026"]


def test_a_long_task_cell_is_cut_between_whole_escapes_never_inside_one() -> None:
    # Rich cut the widest cell to fit 200 columns, wherever that fell: `\x1` then an ellipsis.
    out = io.StringIO()
    task = "digits" + "\x1b" * 60
    print_table(["run", "task", "notes"], [("a", task, "y" * 150)], out)
    cell = out.getvalue().splitlines()[1].split()[1]
    assert cell.endswith("…") and cell.startswith("digits\\x1b")
    assert cell[len("digits"):-1] == "\\x1b" * ((len(cell) - len("digits") - 1) // 4), "only whole escapes"
    assert printable_cut(task, 11) == "digits\\x1b…" and printable_cut("ab\x07", 10) == "ab\\x07"
