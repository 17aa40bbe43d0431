"""`morphogen dashboard`: driven headless with Textual's pilot, on finished runs and on a run still being written."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, RichLog, Static

from morphogen.cli import main
from morphogen.run_directory import EVENTS_FILENAME
from morphogen.telemetry.events import ALL_ENVS, ActionTaken, ImitationCompleted, RewardComputed, RoundCompleted
from morphogen.ui.dashboard import Dashboard, env_detail_text, header_text, reward_text
from morphogen.ui.live_state import RunView
from morphogen.ui.run_files import IMITATION_ROUND, EventTail, TimedEvent

POLL = 0.05


def _text(app: Dashboard, selector: str) -> str:
    return str(app.query_one(selector, Static).render())


def _log_lines(app: Dashboard) -> list[str]:
    return [strip.text for strip in app.query_one("#log", RichLog).lines]


async def _wait_for(pilot: Pilot[None], condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Let the app's own timer run until `condition()` holds (a loaded CI machine may need many ticks)."""
    for _ in range(int(seconds / POLL)):
        if condition():
            return
        await pilot.pause(POLL)
    assert condition(), "the view did not update in time"


def _row(app: Dashboard, env_id: int) -> list[str]:
    table = app.query_one("#envs", DataTable)
    return [str(cell) for cell in table.get_row(str(env_id))]


def test_a_run_still_being_written_updates_the_view(trained_run: Path, tmp_path: Path) -> None:
    """Half of a training run's lines are there at start; the rest are appended while the dashboard runs."""
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(trained_run / "config.json", live / "config.json")
    lines = (trained_run / EVENTS_FILENAME).read_text().splitlines(keepends=True)
    first_update = next(i for i, line in enumerate(lines) if '"ppo_update_completed"' in line)
    first_round_end = next(i for i, line in enumerate(lines) if '"round_completed"' in line) + 1
    (live / EVENTS_FILENAME).write_text("".join(lines[:first_update]))  # round 1's episodes, not its update

    async def drive() -> None:
        app = Dashboard(live, poll_seconds=POLL)
        async with app.run_test(size=(140, 40)) as pilot:
            await _wait_for(pilot, lambda: 1 in app.view.envs and app.view.envs[1].epoch == 4)
            assert "round 1/2" in _text(app, "#header") and "[LIVE]" in _text(app, "#header")
            assert _row(app, 0)[:3] == ["0", "1", "4/4"] and _row(app, 1)[:3] == ["1", "1", "4/4"]
            assert "no PPO update yet" in _text(app, "#policy")
            # The run goes on: the rest of round 1 arrives, then round 2, the last record cut mid-line.
            with (live / EVENTS_FILENAME).open("a") as events:
                events.write("".join(lines[first_update:first_round_end]))
                events.flush()
                await _wait_for(pilot, lambda: "round 2/2" in _text(app, "#header"))
                assert "policy health (round 1)" in _text(app, "#policy")
                assert any("round 1 done" in line for line in _log_lines(app))
                rest = "".join(lines[first_round_end:])
                events.write(rest[:-10])  # the last record is cut mid-line: it must wait
                events.flush()
                await _wait_for(pilot, lambda: _row(app, 0)[:2] == ["0", "2"])
                app.poll()
                assert "[FINISHED]" not in _text(app, "#header")
                events.write(rest[-10:])
                events.flush()
            await _wait_for(pilot, lambda: "[FINISHED]" in _text(app, "#header"))
            assert "round 2/2" in _text(app, "#header") and _row(app, 0)[:3] == ["0", "2", "4/4"]
            assert any("round 2 done" in line for line in _log_lines(app))

    asyncio.run(drive())


def test_keys_pause_help_detail_and_quit(grown_run: Path) -> None:
    async def drive() -> None:
        app = Dashboard(grown_run, poll_seconds=POLL)
        async with app.run_test(size=(140, 40)) as pilot:
            await _wait_for(pilot, lambda: "[FINISHED]" in _text(app, "#header"))
            header = _text(app, "#header")
            assert "morphogen run  task digits" in header and "[FINISHED]" in header
            row = _row(app, 0)
            assert row[:3] == ["0", "1", "8/8"] and len(row) == 5 + 2, "env, round, epoch, acc, params, 2 slots"
            assert "heuristic run" in _text(app, "#policy") and "reads no reward" in _text(app, "#rewards")
            assert any("GERMINATE" in line for line in _log_lines(app))
            await pilot.press("p")
            assert app.paused and "[PAUSED]" in _text(app, "#header")
            await pilot.press("p")
            assert not app.paused
            await pilot.press("question_mark")
            assert app.screen.name == "help" and "p   pause" in str(app.screen.query_one("#info", Static).render())
            await pilot.press("escape")
            await pilot.press("d")
            assert app.screen.name == "env-detail"
            detail = str(app.screen.query_one("#info", Static).render())
            assert "env 0: round 1, epoch 8/8" in detail and "r0c0" in detail and "r0c1" in detail
            await pilot.press("escape")
            await pilot.press("q")
        assert app.return_code == 0

    asyncio.run(drive())


def test_a_score_other_than_accuracy_is_shown_by_its_name(grown_run: Path, tmp_path: Path) -> None:
    """A task with its own loss or metric (config.json's `task_metric`): its scores are not read as percent."""
    run = tmp_path / "run"
    shutil.copytree(grown_run, run)
    config = json.loads((run / "config.json").read_text())
    assert config["task_metric"] == "accuracy"  # `run` records what the task's score is
    config["task_metric"] = "negative loss\x1b[2J"  # an untrusted file: shown as text
    (run / "config.json").write_text(json.dumps(config))

    async def drive() -> None:
        app = Dashboard(run, poll_seconds=POLL)
        async with app.run_test(size=(140, 40)) as pilot:
            await _wait_for(pilot, lambda: "[FINISHED]" in _text(app, "#header"))
            table = app.query_one("#envs", DataTable)
            assert str(list(table.columns.values())[3].label) == "val negative loss\\x1b[2J"
            score = _row(app, 0)[3]
            assert not score.endswith("%") and float(score) > 0  # an accuracy here, shown as the named score is
            assert any("episode done, negative loss" in line for line in _log_lines(app))
            await pilot.press("q")

    asyncio.run(drive())


def test_replay_feeds_a_finished_run_progressively(grown_run: Path) -> None:
    total = len(EventTail(grown_run / EVENTS_FILENAME).read_new(final=True))
    per_tick, slow_timer = 10, 600.0  # the timer never fires in the test: ticks are driven by hand

    async def drive() -> None:
        app = Dashboard(grown_run, replay=True, poll_seconds=slow_timer, replay_rate=per_tick / slow_timer)
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.pause()
            assert "[REPLAY]" in _text(app, "#header")
            assert len(app._pending) == total - per_tick, "mounting feeds the first slice only"
            ticks = 0
            while app._pending:
                app.poll()
                ticks += 1
            await pilot.pause()
            assert ticks == -(-(total - per_tick) // per_tick)
            assert "[FINISHED]" in _text(app, "#header")

    asyncio.run(drive())


def test_view_speed_and_eta_count_env_steps(trained_run: Path) -> None:
    view = RunView.from_config(json.loads((trained_run / "config.json").read_text()))
    assert (view.training, view.rounds_total, view.n_envs, view.episode_length) == (True, 2, 2, 4)
    events = EventTail(trained_run / EVENTS_FILENAME).read_new(final=True)
    half = [timed for timed in events][: len(events) // 2]
    for timed in half:
        view.apply(timed)
    assert view.total_env_steps == 2 * 2 * 4
    assert view.env_steps_per_second is not None and view.eta_seconds is not None
    assert view.eta_seconds == pytest.approx((16 - view.env_steps) / view.env_steps_per_second)


def test_the_imitation_warm_start_is_shown_as_imitation_not_as_round_1(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    assert main(["train", "--envs", "1", "--rounds", "1", "--episode-length", "3", "--imitate-rounds", "1",
                 "--max-train-samples", "200", "--hidden-size", "16", "--run-dir", str(directory)]) == 0
    view = RunView.from_config(json.loads((directory / "config.json").read_text()))
    assert view.total_env_steps == (1 + 1) * 1 * 3  # the watched episodes are env-steps too
    events = EventTail(directory / EVENTS_FILENAME).read_new(final=True)
    end = next(index for index, timed in enumerate(events) if isinstance(timed.event, ImitationCompleted))
    lines = [line for timed in events[:end] if (line := view.apply(timed)) is not None]
    assert view.round == IMITATION_ROUND and view.envs[0].round == IMITATION_ROUND
    assert "imitation" in header_text(view, "LIVE").plain and "round 1/1" not in header_text(view, "LIVE").plain
    assert lines and all(line.startswith("imitation epoch ") for line in lines)
    assert "agreement with the heuristic" in (view.apply(events[end]) or "")
    for timed in events[end + 1:]:
        view.apply(timed)
    assert (view.round, view.envs[0].round, view.env_steps) == (1, 1, view.total_env_steps)
    assert "round 1/1" in header_text(view, "LIVE").plain


def test_dashboard_of_something_that_is_not_a_run_is_one_line_and_exit_2(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("morphogen dashboard: error:") and "events.jsonl" in err[0]


def test_damaged_input_is_skipped_and_strings_are_shown_as_text(grown_run: Path, tmp_path: Path) -> None:
    """Torn and unknown lines, a non-finite time, Rich markup and escapes in strings, a broken config.json."""
    run = tmp_path / "run"
    shutil.copytree(grown_run, run)
    text = (run / EVENTS_FILENAME).read_text().replace('"r0c1"', '"[/x]\\u001b[2J"')
    lines = text.splitlines(keepends=True)
    lines[2:2] = ['{"time": 1.0, "event": "from_the_future"}\n', '{"time": "Infinity", "event": "epoch_completed"}\n',
                  '{"torn": \n', "[" * 50_000 + "\n"]
    (run / EVENTS_FILENAME).write_text("".join(lines))
    (run / "config.json").write_text("{not json")

    async def drive() -> None:
        app = Dashboard(run, replay=True, poll_seconds=POLL, replay_rate=200)  # a slot's cell grows as it goes
        async with app.run_test(size=(200, 40)) as pilot:
            await _wait_for(pilot, lambda: "[FINISHED]" in _text(app, "#header"))
            assert "task ?" in _text(app, "#header")
            table = app.query_one("#envs", DataTable)
            labels = [str(column.label) for column in table.columns.values()]
            assert "[/x]\\x1b[2J" in labels

            def cut_columns() -> list[str]:
                return [f"{column.label} cut to {column.content_width}"
                        for column, cell in zip(table.columns.values(), table.get_row("0"), strict=True)
                        if column.content_width < len(str(cell))]

            # The table widens a column when it next lays itself out, which a loaded machine may not have done
            # by the time the header says FINISHED.
            await _wait_for(pilot, lambda: not cut_columns())
            assert not cut_columns()
            await pilot.press("q")
        assert app.return_code == 0

    asyncio.run(drive())


def test_an_events_file_turned_unreadable_stops_the_dashboard_with_one_line(grown_run: Path, tmp_path: Path) -> None:
    """A FIFO put in place of the events file while the dashboard follows it: one line and exit 2, no wait."""
    run = tmp_path / "run"
    shutil.copytree(grown_run, run)

    async def drive() -> Dashboard:
        app = Dashboard(run, poll_seconds=POLL)
        async with app.run_test(size=(140, 40)) as pilot:
            await _wait_for(pilot, lambda: bool(app.view.envs))
            (run / EVENTS_FILENAME).unlink()
            os.mkfifo(run / EVENTS_FILENAME)
            await _wait_for(pilot, lambda: not app.is_running)
        return app

    app = asyncio.run(asyncio.wait_for(drive(), timeout=60))
    assert app.return_code == 2
    assert app.stopped_on == f"cannot read {run / EVENTS_FILENAME}: not a regular file"


def test_a_heuristic_run_shows_no_reward_and_a_training_run_does(grown_run: Path, trained_run: Path) -> None:
    # As the report says: the heuristic computes the reward's components but never reads them.
    grown = RunView.from_config(json.loads((grown_run / "config.json").read_text()))
    assert grown.heuristic and "the heuristic reads no reward" in reward_text(grown).plain
    trained = RunView.from_config(json.loads((trained_run / "config.json").read_text()))
    assert not trained.heuristic and reward_text(trained).plain.startswith("reward components")


def test_a_paired_training_run_shows_its_round_return_net_of_the_twins_and_its_rewards_as_the_envs_own(
        trained_run: Path) -> None:
    """With `paired_baseline` a round's return subtracts each env's no-growth twin's, the reward components summed
    over the round do not (as the report says); a run without a twin is not told of one."""
    config = json.loads((trained_run / "config.json").read_text())
    round_done = TimedEvent(1.0, RoundCompleted(4, ALL_ENVS, 1, 0.94, 95.0, 1240.0, 2.5))
    for paired in (False, True):
        view = RunView.from_config({**config, "paired_baseline": paired})
        view.apply(TimedEvent(0.5, RewardComputed(4, 0, 47.5, (("terminal", 47.5),))))
        log = view.apply(round_done)
        assert log is not None and ("return over the no-growth twins +0.940, " in log) is paired
        assert (", each env's own: the twin's not subtracted)" in reward_text(view).plain) is paired
        assert paired or ("return +0.940, " in log and "twin" not in reward_text(view).plain)


def test_a_negated_loss_is_shown_as_the_loss_as_the_report_and_the_closing_table_show_it(tmp_path: Path) -> None:
    """A task with its own loss and no metric is scored by its negated loss: the dashboard shows the loss itself
    under "val loss" (2.5668), not "val negative loss -2.567", and so does the HTML report's chart."""
    from morphogen.telemetry.events import EpochCompleted
    from morphogen.ui.html_report import render_html

    (tmp_path / "config.json").write_text(json.dumps({"task_name": "sinreg", "task_metric": "negative loss",
                                                      "policy": None}))
    events = [EpochCompleted(epoch, 0, 2.7, loss, -loss, 769, (), "WAIT", True)
              for epoch, loss in ((1, 3.1), (2, 2.5668))]
    (tmp_path / EVENTS_FILENAME).write_text(
        "".join(json.dumps({"time": 1.0 + index, **e.to_dict()}) + "\n" for index, e in enumerate(events)))

    async def drive() -> None:
        app = Dashboard(tmp_path, poll_seconds=POLL)
        async with app.run_test(size=(140, 40)) as pilot:
            await _wait_for(pilot, lambda: app.query_one("#envs", DataTable).row_count == 1
                            and _row(app, 0)[2].startswith("2"))
            table = app.query_one("#envs", DataTable)
            assert str(list(table.columns.values())[3].label) == "val loss"
            assert _row(app, 0)[3] == "2.5668"
            await pilot.press("q")

    asyncio.run(drive())
    page = render_html(tmp_path)
    assert 'aria-label="validation loss"' in page and "<title>grown: 2, 2.567</title>" in page
    assert "negative loss" not in page


def _with_times(source: Path, destination: Path, first: float, last: float) -> Path:
    """A copy of the run `source` whose first and last events claim the wall-clock times `first` and `last`."""
    shutil.copytree(source, destination)
    lines = (destination / EVENTS_FILENAME).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    records[0]["time"], records[-1]["time"] = first, last
    (destination / EVENTS_FILENAME).write_text("".join(json.dumps(record) + "\n" for record in records))
    return destination


def test_times_that_span_past_the_float_range_show_elapsed_and_eta_as_unknown(trained_run: Path) -> None:
    """Times ±1.7e308 apart: their span is infinite (the header stopped on an OverflowError rounding it). A run's
    file cannot hold them any more (a time past 1e100 skips its line), but the view does not rely on that."""
    view = RunView.from_config(json.loads((trained_run / "config.json").read_text()))
    events = EventTail(trained_run / EVENTS_FILENAME).read_new(final=True)
    for index, timed in enumerate(events):
        view.apply(TimedEvent(-1.7e308 if index == 0 else 1.7e308, timed.event))
    assert view.elapsed is None and view.env_steps_per_second is None and view.eta_seconds == 0.0  # finished
    view.finished = False
    assert view.eta_seconds is None
    assert "elapsed ?" in header_text(view, "LIVE").plain


def test_times_that_go_backwards_show_elapsed_and_eta_as_unknown(trained_run: Path, tmp_path: Path) -> None:
    """An edited run whose last event is older than its first: the header says "?" (it showed a negative elapsed
    time)."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    records = [json.loads(line) for line in (run / EVENTS_FILENAME).read_text().splitlines()]
    records[0]["time"], records[-1]["time"] = 2e9, 1.0
    (run / EVENTS_FILENAME).write_text("".join(json.dumps(record) + "\n" for record in records))

    async def drive() -> Dashboard:
        app = Dashboard(run, replay=True, poll_seconds=POLL, replay_rate=2000)
        async with app.run_test(size=(140, 40)) as pilot:
            await _wait_for(pilot, lambda: "[FINISHED]" in _text(app, "#header"))
            header = _text(app, "#header")
            assert "elapsed ?" in header and "- env-steps/s" in header
            await pilot.press("q")
        return app

    assert asyncio.run(drive()).return_code == 0


def test_a_redraw_updates_only_the_cells_that_changed(trained_run: Path, tmp_path: Path) -> None:
    """Every redraw updated every cell of every env, each asking the table to measure its whole column again: with
    1,024 envs (`train --envs 1024`) one redraw took minutes. Now an unchanged view updates nothing, and a changed
    cell asks for a new width only when it is wider than its column."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(trained_run / "config.json", run / "config.json")
    records = [json.loads(line) for line in (trained_run / EVENTS_FILENAME).read_text().splitlines()]
    epoch = next(record for record in records if record["event"] == "epoch_completed" and record["epoch"] == 1)

    def append(**changes: object) -> None:
        with (run / EVENTS_FILENAME).open("a") as events:
            events.write(json.dumps({**epoch, **changes}) + "\n")

    for env_id in range(3):
        append(env_id=env_id)

    async def drive() -> None:
        app = Dashboard(run, poll_seconds=600.0)  # the timer never fires in the test: polls are driven by hand
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.pause()
            table = app.query_one("#envs", DataTable)
            assert table.row_count == 3
            updates: list[tuple[str, str, bool]] = []
            update_cell = table.update_cell

            def recorded(row: Any, column: Any, value: Any, *, update_width: bool = False) -> None:
                updates.append((str(row.value if hasattr(row, "value") else row),
                                str(column.value if hasattr(column, "value") else column), update_width))
                update_cell(row, column, value, update_width=update_width)

            table.update_cell = recorded  # type: ignore[method-assign]
            app.poll()
            assert updates == [], "nothing new: nothing to update"
            append(env_id=1, epoch=2)
            app.poll()
            assert len(updates) == 1 and updates[0][0] == "1" and not updates[0][2]
            assert _row(app, 1)[2] == "2/4" and _row(app, 0)[2] == "1/4"
            updates.clear()
            slot = epoch["slots"][0]["slot"]
            append(env_id=1, epoch=3, slots=[{**epoch["slots"][0], "stage": "training", "blueprint": "wider",
                                              "alpha": 0.0}, *epoch["slots"][1:]])
            app.poll()
            assert [(row, width) for row, column, width in updates if column == f"slot:{slot}"] == [("1", True)]
            await pilot.pause()
            column = table.columns[next(key for key in table.columns if key.value == f"slot:{slot}")]
            assert column.content_width >= len("TRAIN wider a0.00")
            await pilot.press("q")

    asyncio.run(drive())


def test_an_events_file_cut_back_by_a_resume_is_read_again_from_its_start(trained_run: Path, tmp_path: Path) -> None:
    """`train --resume` cuts events.jsonl back to the last checkpointed round and writes that round again. The
    dashboard following it read on from where it had stopped: into the middle of a line of the new round, with the
    interrupted round's events still counted. It now shows the run as the file holds it."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(trained_run / "config.json", run / "config.json")
    lines = (trained_run / EVENTS_FILENAME).read_text().splitlines(keepends=True)
    round_one = next(i for i, line in enumerate(lines) if '"round_completed"' in line) + 1
    episode_of_round_two = next(i for i, line in enumerate(lines) if i > round_one and '"episode_completed"' in line)
    (run / EVENTS_FILENAME).write_text("".join(lines[:episode_of_round_two + 1]))  # killed in round 2

    def written_again(line: str) -> str:  # the resumed run writes round 2 again, at later times
        record = json.loads(line)
        record["time"] += 1234.5678
        return json.dumps(record) + "\n"

    async def drive() -> Dashboard:
        app = Dashboard(run, poll_seconds=POLL)
        async with app.run_test(size=(140, 40)) as pilot:
            await _wait_for(pilot, lambda: app.view.envs[0].episodes_completed == 2)
            with (run / EVENTS_FILENAME).open("r+") as events:  # as `cut_events_to_round`, in place
                events.truncate(len("".join(lines[:round_one]).encode()))
            with (run / EVENTS_FILENAME).open("a") as events:
                events.write("".join(written_again(line) for line in lines[round_one:]))
            await _wait_for(pilot, lambda: "[FINISHED]" in _text(app, "#header"))
            assert [app.view.envs[env].episodes_completed for env in (0, 1)] == [2, 2]
            assert app.tail.skipped == 0 and app.tail.cuts == 1
            assert "events.jsonl was cut back (the run was resumed)" in _log_lines(app)[0]
            assert _row(app, 0)[:3] == ["0", "2", "4/4"]
            await pilot.press("q")
        return app

    assert asyncio.run(drive()).return_code == 0


def test_a_round_written_again_to_lines_of_the_same_length_is_seen_as_a_cut(tmp_path: Path) -> None:
    """A resumed round plays again to the same figures: its lines can have the lengths and the last bytes of the
    interrupted ones, and differ only by the time at their start."""
    def line(time: float, epoch: int) -> str:
        return json.dumps({"time": time, "event": "action_taken", "schema_version": 2, "epoch": epoch, "env_id": 0,
                           "op": "WAIT", "slot": None, "blueprint": None, "succeeded": True,
                           "reason": "waited"}) + "\n"

    path = tmp_path / EVENTS_FILENAME
    path.write_text(line(1000.25, 1) + line(1001.25, 2))
    tail = EventTail(path)
    assert [timed.time for timed in tail.read_new()] == [1000.25, 1001.25]
    path.write_text(line(1000.25, 1) + line(2001.25, 2))  # round 2 cut and written again, as long as before
    assert [timed.time for timed in tail.read_new()] == [1000.25, 2001.25]
    assert tail.cuts == 1
    assert tail.read_new() == [] and tail.cuts == 1  # nothing new: no cut


def test_the_event_log_gives_a_taken_actions_reason_as_a_refused_ones() -> None:
    """A germination or an advance is logged with why the controller took it (the gate's figure and threshold for
    a refusal, the heuristic's measured reason for a taken action), not the bare action, at an epoch in words (the
    alerts' strip, short of room, tags it `e7`)."""
    view = RunView.from_config({"task": "digits", "policy": None})
    germinated = view.apply(TimedEvent(1.0, ActionTaken(7, 0, "GERMINATE", "r0c0", "wider", True,
                                                        "germinated wider in r0c0: the best growth signal per FLOP")))
    refused = view.apply(TimedEvent(2.0, ActionTaken(12, 0, "ADVANCE", "r0c0", None, False,
                                                     "blended in, the seed would add -0.0674 nats < 0.005")))
    bare = view.apply(TimedEvent(3.0, ActionTaken(13, 0, "PRUNE", "r0c1", None, True, "pruned r0c1")))
    assert germinated == ("epoch 7 env 0: GERMINATE r0c0 wider (germinated wider in r0c0: the best growth signal per "
                          "FLOP)")
    assert refused == "epoch 12 env 0: ADVANCE r0c0 refused: blended in, the seed would add -0.0674 nats < 0.005"
    assert bare == "epoch 13 env 0: PRUNE r0c1"


def test_damaged_lines_are_said_in_the_log_not_skipped_in_silence(grown_run: Path, tmp_path: Path) -> None:
    """Two lines that are not events, one at the start and one appended while the view follows: the log says how many
    were skipped each time, as `report` says it in its header."""
    run = shutil.copytree(grown_run, tmp_path / "run")
    lines = (run / EVENTS_FILENAME).read_text().splitlines(keepends=True)
    (run / EVENTS_FILENAME).write_text("".join(["{torn\n", *lines[:5]]))

    async def drive() -> None:
        app = Dashboard(run, poll_seconds=POLL)
        async with app.run_test(size=(140, 40)) as pilot:
            await _wait_for(pilot, lambda: bool(_log_lines(app)))
            assert _log_lines(app)[0] == "1 line of events.jsonl skipped: not an event (torn, damaged or too long)"
            with (run / EVENTS_FILENAME).open("a") as events:
                events.write("".join(["\x00\x01 not json\n", *lines[5:]]))
            await _wait_for(pilot, lambda: "[FINISHED]" in _text(app, "#header"))
            assert sum("line of events.jsonl skipped" in line for line in _log_lines(app)) == 2
            await pilot.press("q")

    asyncio.run(drive())


def test_a_heuristic_runs_reward_is_shown_nowhere(grown_run: Path) -> None:
    """The reward pane said none steers a heuristic run, while the env's details listed its last reward and the log
    its episode's return: the heuristic computes them but never reads them."""
    view = RunView.from_config(json.loads((grown_run / "config.json").read_text()))
    lines = [line for timed in EventTail(grown_run / EVENTS_FILENAME).read_new(final=True)
             if (line := view.apply(timed)) is not None]
    assert view.heuristic and view.envs[0].last_reward, "the run wrote rewards the view read"
    done = next(line for line in lines if "episode done" in line)
    assert done.endswith(" pruned") and "return" not in done
    assert "reward" not in env_detail_text(view, view.envs[0]).plain
