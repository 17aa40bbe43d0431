"""`morphogen dashboard RUN_DIR`: a live terminal view of a run (Textual), or a replay of a finished one.

It reads only the run directory: `config.json` for the run's shape and `events.jsonl`, tailed every
`poll_seconds` (complete lines only, so a run being written is read safely). Live mode shows what was
written so far, then follows; `--replay` starts empty and feeds the recorded events at `replay_rate`
events per second, to watch a finished run unfold.

Layout: a header (task, round, elapsed, env-steps/s, ETA, mode), a grid with one row per env (round,
epoch, accuracy, parameters, each slot as a cell coloured by stage with its alpha), policy health (entropy
per head, KL, value loss, explained variance), reward components, an anomaly strip and the event log.
Keys: q quit, p pause/resume, d details of the env under the cursor, ? help.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, RichLog, Static

from morphogen.run_directory import CONFIG_FILENAME, EVENTS_FILENAME, read_json_object
from morphogen.ui.live_state import EnvView, RunView, round_tag
from morphogen.ui.run_files import EventTail, RunDirectoryError, TimedEvent, check_run_dir, round_cell
from morphogen.ui.stages import stage_colour, stage_short
from morphogen.ui.terminal_text import printable_fields
from morphogen.ui.units import counted

POLL_SECONDS = 0.5
"""How often the dashboard reads new events."""

REPLAY_RATE = 40.0
"""Events per second fed by `--replay`."""

HELP = """[b]morphogen dashboard[/b]

  q   quit
  p   pause / resume reading events (the view freezes; the run goes on)
  d   details of the env under the cursor (slots, last action, last reward)
  ?   this help
  escape closes a window

Slot cells: stage (GERM, TRAIN, BLEND, HOLD, FOSSIL, PRUNED, EMBARGO, RESET) and alpha, coloured by stage.
The dashboard reads only the run directory; it never touches the run."""


def _duration(seconds: float | None) -> str:
    """Seconds as `h:mm:ss` (`m:ss` under an hour); "?" when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def header_text(view: RunView, mode: str) -> Text:
    """The header line: task, round, elapsed, env-steps/s, ETA and the mode (LIVE, REPLAY, PAUSED, ...)."""
    speed = view.env_steps_per_second
    parts = [f"morphogen {'train' if view.training else 'run'}  task {view.task}"]
    if view.training:
        parts.append("imitation" if view.imitating else f"round {view.round}/{view.rounds_total or '?'}")
    parts += [f"elapsed {_duration(view.elapsed)}", f"{speed:.2f} env-steps/s" if speed else "- env-steps/s",
              f"ETA {_duration(view.eta_seconds)}"]
    if view.telemetry_level is not None:
        parts.append(f"telemetry {view.telemetry_level}")
    text = Text("  ·  ".join(parts))
    text.append(f"   [{mode}]", style="bold reverse")
    return text


def slot_cell(view: EnvView, slot_id: str) -> Text:
    """A slot as the grid shows it: short stage name and alpha on the stage's colour."""
    slot = next((s for s in view.slots if s.slot == slot_id), None)
    if slot is None or slot.stage == "dormant":
        return Text("-", style="dim")
    label = stage_short(slot.stage) if slot.blueprint is None else (
        f"{stage_short(slot.stage)} {slot.blueprint} a{slot.alpha:.2f}")
    return Text(label, style=f"black on {stage_colour(slot.stage)}")


def policy_text(view: RunView) -> Text:
    if view.ppo is None:
        return Text("policy health: no PPO update yet" if view.training else "policy health: heuristic run (no PPO)",
                    style="dim")
    ppo = view.ppo
    text = Text(f"policy health (round {ppo.round})\n", style="bold")
    text.append(f"KL {ppo.approx_kl:.4f}  clip {ppo.clip_fraction:.2f}  value loss {ppo.value_loss:.4f}  "
                f"explained var {ppo.explained_variance:+.2f}\n")
    text.append("entropy: " + "  ".join(f"{head} {value:.2f}" for head, value in ppo.entropy_per_head))
    return text


def reward_text(view: RunView) -> Text:
    """Reward components summed over the round in progress (or the last finished round, between rounds)."""
    if view.heuristic:  # as the report: its reward steered nothing
        return Text("reward: none steers this run (the heuristic reads no reward)", style="dim")
    rewards, which = view.round_rewards, "this round"
    if not rewards and view.previous_round_rewards:
        rewards, which = view.previous_round_rewards, f"round {view.rounds_completed}"
    own = ", each env's own: the twin's not subtracted" if view.paired_baseline else ""
    text = Text("reward components " + (f"({which}, all envs{own})\n" if view.training else "(this episode)\n"),
                style="bold")
    if not rewards:
        text.append("none yet", style="dim")
    for name, value in rewards.items():
        text.append(f"{name:<12}{value:+9.3f}\n", style="green" if value > 0 else "red" if value < 0 else "")
    return text


def anomaly_text(view: RunView) -> Text:
    if not view.alerts:
        return Text("no anomalies, no rollbacks", style="bold green")
    text = Text(f"{len(view.alerts)} alert(s): ", style="bold red")
    text.append("  |  ".join(f"{round_tag(a.round)} e{a.epoch} {a.where} {a.kind}" for a in view.alerts[-4:]))
    return text


def env_detail_text(view: RunView, env: EnvView) -> Text:
    text = Text(f"env {env.env_id}: round {round_cell(env.round)}, epoch {env.epoch}/{view.episode_length or '?'}\n\n",
                style="bold")
    accuracy = "-" if env.val_accuracy is None else view.score.format(env.val_accuracy)
    parameters = "-" if env.param_count is None else f"{env.param_count:,}"
    text.append(f"val {view.score.title} {accuracy}   parameters {parameters}   "
                f"episodes done {env.episodes_completed}\n")
    outcome = "ok" if env.action_succeeded else "refused"
    text.append(f"last action {env.action or '-'} ({outcome})\n\nslots:\n")
    for slot in env.slots:
        text.append(f"  {slot.slot:<6}{slot.blueprint or '-':<12}")
        text.append(f" {slot.stage:<11}", style=f"black on {stage_colour(slot.stage)}")
        text.append(f" alpha {slot.alpha:.2f}\n")
    if env.last_reward and not view.heuristic:  # as the reward pane: the heuristic's reward steered nothing
        text.append("\nlast reward: " + "  ".join(f"{k} {v:+.3f}" for k, v in env.last_reward.items()) + "\n")
    text.append("\n(escape to close)", style="dim")
    return text


def _cell_content(cell: Text | str) -> tuple[str, str]:
    """A grid cell's text and style, to tell whether it changed since the table last showed it."""
    return (cell.plain, str(cell.style)) if isinstance(cell, Text) else (cell, "")


class DashboardStopped(RunDirectoryError):
    """The dashboard app ended on an error (Textual has shown it); the command exits with status 2."""


class InfoScreen(ModalScreen[None]):
    """A window over the dashboard (help, env details); escape or q closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss", "close"), Binding("q", "dismiss", "close")]
    DEFAULT_CSS = """
    InfoScreen { align: center middle; }
    InfoScreen > Static { width: 90; height: auto; border: round $accent; padding: 1 2; background: $panel; }
    """

    def __init__(self, content: Text | str, name: str) -> None:
        super().__init__(name=name)
        self.content = content

    def compose(self) -> ComposeResult:
        yield Static(self.content, id="info")


class Dashboard(App[None]):
    """The dashboard app; `poll_seconds` and `replay_rate` are parameters so tests can run it fast."""

    TITLE = "morphogen dashboard"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"), Binding("p", "toggle_pause", "pause"),
        Binding("d", "env_detail", "env detail"), Binding("question_mark", "help", "help"),
    ]
    DEFAULT_CSS = """
    #header { height: 1; background: $boost; padding: 0 1; }
    #envs { height: auto; max-height: 45%; }
    #middle { height: auto; max-height: 9; }
    #policy, #rewards { width: 1fr; height: auto; border: round $primary-darken-2; padding: 0 1; }
    #anomalies { height: 1; padding: 0 1; }
    #log { height: 1fr; border: round $primary-darken-2; }
    """

    def __init__(self, run_dir: str | Path, *, replay: bool = False, poll_seconds: float = POLL_SECONDS,
                 replay_rate: float = REPLAY_RATE) -> None:
        super().__init__()
        self.run_dir = check_run_dir(run_dir)
        self.replay, self.poll_seconds, self.replay_rate = replay, poll_seconds, replay_rate
        self.paused = False
        self.tail = EventTail(self.run_dir / EVENTS_FILENAME)
        self.view = RunView.from_config(self._read_config())
        self._pending: list[TimedEvent] = []
        self._slot_columns: list[str] = []
        self._shown_cells: dict[int, list[tuple[str, str]]] = {}
        """What each env's row shows, cell by cell (`_cell_content`): a redraw updates only the cells that changed."""
        self.stopped_on: str | None = None
        """Why the dashboard stopped by itself (the command's error line), or None."""

    def _read_config(self) -> dict[str, object]:
        return read_json_object(self.run_dir / CONFIG_FILENAME) or {}  # damaged: the view shows '?'

    @property
    def mode(self) -> str:
        if self.paused:
            return "PAUSED"
        if self.view.finished and not self._pending:
            return "FINISHED"
        return "REPLAY" if self.replay else "LIVE"

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        yield DataTable(id="envs", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="middle"):
            yield Static(id="policy")
            yield Static(id="rewards")
        yield Static(id="anomalies")
        with Vertical(id="log-box"):
            yield RichLog(id="log", max_lines=2000, wrap=False, markup=False)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#envs", DataTable)
        table.add_columns("env", "round", "epoch", Text(f"val {self.view.score.label}"), "params")
        self.poll()
        self.set_interval(self.poll_seconds, self.poll)

    # ---------------------------------------------------------------- reading
    def poll(self) -> None:
        """Read new events (live) or the next slice of the recording (replay), then redraw."""
        if self.paused or not self.is_running:
            return  # not running: the app is shutting down and its widgets may already be gone (NoMatches)
        cuts, skipped = self.tail.cuts, self.tail.skipped
        try:
            new = self.tail.read_new()
        except RunDirectoryError as error:  # the events file was replaced by something unreadable
            self._stop(str(error))
            return
        except OSError as error:
            self._stop(f"cannot read {self.tail.path}: {error.strerror or error}")
            return
        if self.tail.cuts != cuts:
            self._start_again()
            skipped = 0  # the count starts again with the file
        if self.tail.skipped > skipped:  # said where the reader looks, as `report` says it in its header
            self.query_one("#log", RichLog).write(
                f"{counted(self.tail.skipped - skipped, 'line')} of {EVENTS_FILENAME} skipped: not an event (torn, "
                "damaged or too long)")
        self._pending.extend(TimedEvent(timed.time, printable_fields(timed.event)) for timed in new)
        if self.replay:
            count = max(1, int(self.replay_rate * self.poll_seconds))
            batch, self._pending = self._pending[:count], self._pending[count:]
        else:
            batch, self._pending = self._pending, []
        log = self.query_one("#log", RichLog)
        for timed in batch:
            line = self.view.apply(timed)
            if line is not None:
                log.write(line)
        self.refresh_view()

    def _start_again(self) -> None:
        """Forget what was shown: the events file was cut back (a resumed run drops its interrupted round's events),
        so the view is folded again from the file's start."""
        self.view = RunView.from_config(self._read_config())
        self._pending.clear()
        self._shown_cells.clear()
        self.query_one("#envs", DataTable).clear()
        log = self.query_one("#log", RichLog)
        log.clear()
        log.write(f"{EVENTS_FILENAME} was cut back (the run was resumed): read again from its start")

    def _stop(self, reason: str) -> None:
        """End the app with exit status 2; `dashboard_command` prints `reason` as the command's one line."""
        self.stopped_on = reason
        self.exit(return_code=2)

    # ---------------------------------------------------------------- drawing
    def refresh_view(self) -> None:
        view = self.view
        self.query_one("#header", Static).update(header_text(view, self.mode))
        self._refresh_table()
        self.query_one("#policy", Static).update(policy_text(view))
        self.query_one("#rewards", Static).update(reward_text(view))
        self.query_one("#anomalies", Static).update(anomaly_text(view))

    def _refresh_table(self) -> None:
        table = self.query_one("#envs", DataTable)
        widths_asked: dict[object, int] = {}  # by column: the widest cell it was asked to widen to in this redraw
        for slot_id in self.view.slot_ids():
            if slot_id not in self._slot_columns:
                table.add_column(Text(slot_id), key=f"slot:{slot_id}")  # Text: a slot id is never markup
                self._slot_columns.append(slot_id)
        for env_id in sorted(self.view.envs):
            env = self.view.envs[env_id]
            accuracy = "-" if env.val_accuracy is None else self.view.score.format(env.val_accuracy)
            parameters = "-" if env.param_count is None else f"{env.param_count:,}"
            epoch = f"{env.epoch}/{self.view.episode_length or '?'}"
            cells: list[Text | str] = [str(env_id), round_cell(env.round), epoch, accuracy, parameters,
                                       *(slot_cell(env, slot_id) for slot_id in self._slot_columns)]
            shown = [_cell_content(cell) for cell in cells]
            key = str(env_id)
            if key in table.rows:
                before = self._shown_cells.get(env_id, [])
                for index, (column, cell) in enumerate(zip(table.columns.values(), cells, strict=True)):
                    if index < len(before) and before[index] == shown[index]:
                        continue  # only what changed: a redraw of 1,024 envs took minutes
                    # A cell may outgrow its column. The table measures the column again for each cell whose width
                    # it is asked to check (the whole column for one narrower than it): only a cell wider than the
                    # column, and than any cell asking before it, asks; a column keeps its width.
                    width = cell_len(shown[index][0])
                    widens = width > max(column.content_width, widths_asked.get(column.key, 0))
                    if widens:
                        widths_asked[column.key] = width
                    table.update_cell(key, column.key, cell, update_width=widens)
            else:
                table.add_row(*cells, key=key)
            self._shown_cells[env_id] = shown

    # ---------------------------------------------------------------- keys
    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self.refresh_view()

    def action_help(self) -> None:
        self.push_screen(InfoScreen(Text.from_markup(HELP), name="help"))

    def action_env_detail(self) -> None:
        table = self.query_one("#envs", DataTable)
        if not self.view.envs:
            self.notify("no env has finished an epoch yet")
            return
        row = min(max(table.cursor_row, 0), len(self.view.envs) - 1)
        env_id = sorted(self.view.envs)[row]
        self.push_screen(InfoScreen(env_detail_text(self.view, self.view.envs[env_id]), name="env-detail"))


def dashboard_command(run_dir: str | Path, *, replay: bool = False) -> None:
    """Run the dashboard on `run_dir` until the user quits (a bad run directory raises `RunDirectoryError`)."""
    app = Dashboard(run_dir, replay=replay)
    app.run()
    if app.stopped_on is not None:
        raise DashboardStopped(app.stopped_on)
    if app.return_code:  # Textual printed what stopped it; the exit status must say so too
        raise DashboardStopped(f"the dashboard of {run_dir} stopped on an error (exit status {app.return_code})")
