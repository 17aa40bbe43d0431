"""`--compile` on the command line: `run`, `train` (and `--resume`), `eval` and `run --policy` complete
with it and record it; a bad mode or backend is one line and exit code 2. The fast tests trace with the
aot_eager backend; the inductor build (a C++ compiler) runs in a slow test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from morphogen.cli import EXIT_USER_ERROR, build_parser, main, run_config_from_args

TINY_RUN = ["--epochs", "2", "--max-train-samples", "120", "--slots", "r0c1", "--no-baseline", "--no-from-scratch"]
TINY_TRAIN = ["--envs", "2", "--episode-length", "2", "--max-train-samples", "120", "--hidden-size", "16",
              "--slots", "r0c1", "--telemetry", "minimal"]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_run_with_compile_completes_and_records_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    code = main(["run", *TINY_RUN, "--compile", "--compile-backend", "aot_eager", "--run-dir", str(run_dir)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "epoch   2/2" in out
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["compile"], config["compile_mode"], config["compile_backend"]) == (True, "auto", "aot_eager")


@pytest.mark.slow  # about 20 s: a training run, its resume, an eval and a run --policy, each tracing its graphs
def test_train_resume_eval_and_run_policy_with_compile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "train"
    compiled = ["--compile", "--compile-backend", "aot_eager"]
    assert main(["train", *TINY_TRAIN, *compiled, "--rounds", "1", "--run-dir", str(run_dir)]) == 0
    assert json.loads((run_dir / "config.json").read_text())["compile"] is True
    # Compiling changes speed, not the run: a resumed run may switch it.
    assert main(["train", "--resume", str(run_dir), "--rounds", "2", "--compile-backend", "eager"]) == 0
    assert main(["eval", "--policy", str(run_dir), "--episodes", "1", *compiled]) == 0
    assert main(["run", "--policy", str(run_dir), "--max-train-samples", "120", "--no-baseline",
                 "--no-from-scratch", "--run-dir", str(tmp_path / "run"), *compiled]) == 0
    out = capsys.readouterr().out
    assert "learned" in out and "round   2" in out


def test_unknown_compile_mode_in_a_config_file_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.toml"
    config.write_text('compile = true\ncompile_mode = "fast"\n')
    code = main(["run", "--config", str(config), "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR
    assert err.count("\n") == 1 and "compile_mode" in err and "reduce-overhead" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # inductor generates and builds C++ kernels for every graph: tens of seconds on 2 cores
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor on CPU needs a C++ compiler (g++ or c++ on PATH)")
def test_run_with_inductor_completes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", *TINY_RUN, "--compile", "--run-dir", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "epoch   2/2" in out


def test_compile_and_batched_envs_are_refused_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--compile", "--batch-envs", "--run-dir", str(tmp_path / "run")]) == EXIT_USER_ERROR
    error = capsys.readouterr().err.strip().splitlines()
    assert error == ["morphogen train: error: compile: does not combine with episode.batch_identical "
                     "(--batch-envs) yet: the batched path runs the eager forward under vmap; choose one"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("argv", "flags"), [
    (["run", "--compile-mode", "max-autotune"], "--compile-mode applies"),
    (["train", "--compile-backend", "eager"], "--compile-backend applies"),
    (["eval", "--policy", "default", "--compile-mode", "default", "--compile-backend", "eager"],
     "--compile-mode and --compile-backend apply"),
])
def test_a_compile_mode_or_backend_without_compile_is_refused_in_one_line(
        argv: list[str], flags: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Alone they would be recorded and change nothing: the user asked for a compiled run and would not get one."""
    assert main([*argv, "--run-dir", str(tmp_path / "run")]) == EXIT_USER_ERROR
    error = capsys.readouterr().err.strip().splitlines()
    assert error == [f"morphogen {argv[0]}: error: {flags} to a compiled run; add --compile (or compile = true in "
                     "the config)"]
    assert not (tmp_path / "run").exists()


def test_a_compile_backend_beside_compile_in_the_config_file_is_taken(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("compile = true\n")
    built = run_config_from_args(build_parser().parse_args(["run", "--config", str(config), "--compile-backend",
                                                            "aot_eager"]))
    assert (built.compile, built.compile_backend) == (True, "aot_eager")
