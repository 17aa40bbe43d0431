"""A command stopped by a signal: Ctrl-C (SIGINT) and a scheduler's SIGTERM both end in one line that says how to go
on (`--resume`), with the run directory's lock released, and exit 130 and 143 as a shell reports those signals."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from morphogen.exit_status import EXIT_INTERRUPTED, EXIT_TERMINATED
from morphogen.run_directory import LOCK_NAME

# Runs `morphogen COMMAND` whose work, inside the lock of argv[1] (when given), sends this process the signal argv[2]
# as a scheduler or a terminal would, mid-work.
STOPPED = textwrap.dedent("""
    import contextlib, os, signal, sys, time
    import morphogen.cli as cli
    from morphogen.run_directory import hold_run_directory

    directory, signal_name, command = sys.argv[1:4]

    def work(args):
        with hold_run_directory(directory) if directory else contextlib.nullcontext():
            os.kill(os.getpid(), getattr(signal, signal_name))
            time.sleep(60)

    cli.COMMANDS[command] = work
    sys.exit(cli.main([command, *sys.argv[4:]]))
""")


def stop(directory: Path | None, signal_name: str, command: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", STOPPED, str(directory or ""), signal_name, command, *argv],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("signal_name", "status", "said"), [("SIGINT", EXIT_INTERRUPTED, "interrupted"),
                                                               ("SIGTERM", EXIT_TERMINATED, "stopped by SIGTERM")])
def test_a_stopped_run_says_how_to_resume_it_and_leaves_no_lock(tmp_path: Path, signal_name: str, status: int,
                                                                said: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    result = stop(run, signal_name, "run", "--threads", "1")
    assert result.returncode == status, result.stderr
    assert result.stderr == f"morphogen run: {said}; `morphogen run --resume {run}` goes on from its last save\n"
    assert not (run / LOCK_NAME).exists()  # released on the way out, not left for the next command to take over


def test_a_stopped_command_that_holds_no_run_directory_names_no_resume(tmp_path: Path) -> None:
    result = stop(None, "SIGTERM", "eval", "--policy", "default", "--threads", "1")
    assert (result.returncode, result.stderr) == (EXIT_TERMINATED, "morphogen eval: stopped by SIGTERM\n")


def _terminated_in_place(args: object) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)  # the handler runs at once, in this thread


def _installs_its_own_handler(args: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a `--distributed` rank does, to keep its exit status 4


def test_sigterm_is_handled_only_while_a_command_runs(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import morphogen.cli as cli

    before = signal.getsignal(signal.SIGTERM)
    try:
        assert cli.main(["list", "tasks"]) == 0
        assert signal.getsignal(signal.SIGTERM) is before  # a program calling main() keeps its own handler
        monkeypatch.setitem(cli.COMMANDS, "list", _terminated_in_place)
        assert cli.main(["list", "tasks"]) == EXIT_TERMINATED
        assert capsys.readouterr().err == "morphogen list: stopped by SIGTERM\n"  # nothing of `list` to resume
        assert signal.getsignal(signal.SIGTERM) is before  # given back after it fired, too
        monkeypatch.setitem(cli.COMMANDS, "list", _installs_its_own_handler)
        assert cli.main(["list", "tasks"]) == 0
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # a command's own handler stays till the exit
    finally:
        signal.signal(signal.SIGTERM, before)


def test_every_exit_status_has_one_definition_in_the_torch_free_module() -> None:
    """`cli.py` (no torch) and `commands/workers.py` (torch) report an interruption with one number, defined once."""
    source = Path(__file__).resolve().parents[1] / "src" / "morphogen"
    defined = sorted(f"{path.relative_to(source)}: {target.id}" for path in source.rglob("*.py")
                     for node in ast.parse(path.read_text()).body if isinstance(node, ast.Assign | ast.AnnAssign)
                     for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                     if isinstance(target, ast.Name) and target.id.startswith("EXIT_"))
    assert defined and all(line.startswith("exit_status.py: ") for line in defined), defined
