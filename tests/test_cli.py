"""Tests for the `morphogen` command: a tiny real `run`, and user errors as one line with exit code 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.data import DEFAULT_OPTIMIZERS
from morphogen.telemetry import events
from morphogen.telemetry.sinks import read_events


def test_run_prints_the_comparison_and_writes_the_run_directory(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    code = main(["run", "--epochs", "3", "--max-train-samples", "200", "--slots", "r0c0,r0c1",
                 "--run-dir", str(run_dir)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "grown" in out and "no growth" in out
    assert "final val accuracy" in out and "parameters" in out
    assert out.count("epoch ") >= 3 and "epoch   3/3" in out

    config = json.loads((run_dir / "config.json").read_text())
    assert config["episode"]["max_epochs"] == 3
    assert config["max_train_samples"] == 200
    assert config["slots"] == ["r0c0", "r0c1"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["baseline"] is not None
    assert 0.0 <= summary["grown"]["final_accuracy"] <= 100.0
    for outcome in (summary["grown"], summary["baseline"]):
        flops = outcome["flops"]
        parts = ("training", "shadow", "validation", "counterfactual", "probe")
        assert flops["total"] == sum(flops[key] for key in parts) > 0
    assert "training FLOPs" in out and "MFLOP" in out  # 3 epochs of 200 digits: about 600 MFLOP
    written = read_events(run_dir / "events.jsonl")
    assert [e.epoch for e in written if isinstance(e, events.EpochCompleted)] == [1, 2, 3]
    assert isinstance(written[-2], events.EpisodeCompleted)
    assert isinstance(written[-1], events.PhaseTimes)  # the phase breakdown closes the run


def test_run_on_mnist1d_for_one_epoch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    code = main(["run", "--task", "mnist1d", "--epochs", "1", "--no-baseline", "--run-dir", str(run_dir)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "task mnist1d (cnn1d host, 4000 train / 1000 validation), 1 epoch, seed 0" in out and "epoch   1/1" in out
    config = json.loads((run_dir / "config.json").read_text())
    assert config["task"] == "mnist1d"
    assert config["host"] == {"n_blocks": 2, "base_channels": 8, "kernel_size": 5}


def test_host_table_sets_the_host_size_and_is_saved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_file = write(tmp_path, "run.toml", 'task = "mnist1d"\n[host]\nbase_channels = 4\n')
    run_dir = tmp_path / "run"
    code = main(["run", "--config", config_file, "--epochs", "1", "--max-train-samples", "200", "--no-baseline",
                 "--run-dir", str(run_dir)])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads((run_dir / "config.json").read_text())["host"] == {"n_blocks": 2, "base_channels": 4,
                                                                        "kernel_size": 5}
    # Conv1d 1->4->8 (kernel 5, no bias) + batch norms + Linear(8 -> 10)
    expected = (1 * 4 * 5 + 4 * 8 * 5) + 2 * (4 + 8) + (8 * 10 + 10)
    assert json.loads((run_dir / "summary.json").read_text())["grown"]["host_parameters"] == expected


def run_expecting_user_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI, check exit code 2 and a single traceback-free stderr line, and return that line."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == EXIT_USER_ERROR, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(f"morphogen {argv[0]}: error: ")
    return lines[0]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_unknown_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--task", "mnist", "--run-dir", str(tmp_path / "r")], capsys)
    assert "unknown task 'mnist'" in line and "digits, cifar10, text" in line
    assert line.endswith("or module:function for a task of your own (my_task:make_task)")  # a module without :function
    assert not (tmp_path / "r").exists()


def test_unknown_slot_leaves_no_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "r"
    line = run_expecting_user_error(["run", "--slots", "r9c9", "--max-train-samples", "64", "--run-dir",
                                     str(run_dir)], capsys)
    assert "unknown slot 'r9c9'" in line and "this host has: r0c0, r0c1 (" in line
    assert not run_dir.exists()


@pytest.mark.parametrize(("flags", "valid"), [
    ([], "r0c0, r0c1 (and r1c0, r1c1 after its pooling layers, with pool_slots=True: --pool-slots on the command "
         "line)"),
    (["--pool-slots"], "r0c0, r1c0, r0c1, r1c1"),
])
def test_an_unknown_slot_names_the_valid_ones_and_the_pool_slots_that_need_pool_slots(
        flags: list[str], valid: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slot = "r1c0" if not flags else "r0c9"
    line = run_expecting_user_error(["run", "--task", "mnist1d", "--slots", slot, *flags, "--run-dir",
                                     str(tmp_path / "r")], capsys)
    assert line == f"morphogen run: error: unknown slot {slot!r}; this host has: {valid}"


def test_empty_slot_list(capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--slots", " , "], capsys)
    assert "--slots needs at least one name" in line


def test_duplicate_slots(capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--slots", "r0c1,r0c1"], capsys)
    assert "slots: names a slot more than once: r0c1, r0c1" in line


def test_negative_seed(capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--seed", "-1"], capsys)
    assert "seed: must be >= 0, got -1" in line


def test_missing_cifar_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--task", "cifar10", "--data-dir", "/nonexistent",
                                     "--run-dir", str(tmp_path / "r")], capsys)
    assert "/nonexistent" in line and "cifar-10-batches-py" in line


def test_broken_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--config", write(tmp_path, "run.toml", 'task = "digits\n')], capsys)
    assert "is not valid TOML" in line and "run.toml" in line


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--config", str(tmp_path / "none.toml")], capsys)
    assert "does not exist" in line


def test_unknown_config_key_names_its_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, "run.toml", "[episode.optimizer]\nbogus = 1\n")
    line = run_expecting_user_error(["run", "--config", config], capsys)
    assert "episode.optimizer.bogus: unknown key" in line and "host_lr" in line


@pytest.mark.parametrize(("table", "expected"), [
    ('name = "lion"', "episode.optimizer.name: must be one of sgd, adamw, got 'lion'"),
    ("betas = [0.9, 1.5]", "episode.optimizer.betas: must be two numbers in [0, 1), got [0.9, 1.5]"),
    ('host_lr = "fast"', "episode.optimizer.host_lr: expected a finite number"),
])
def test_bad_optimizer_value_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str,
                                         expected: str) -> None:
    config = write(tmp_path, "run.toml", f'task = "text"\n[episode.optimizer]\n{table}\n')
    line = run_expecting_user_error(["run", "--config", config], capsys)
    assert expected in line


def test_an_optimizer_table_on_text_keeps_the_task_default_it_does_not_name(tmp_path: Path) -> None:
    from morphogen.cli import build_parser, run_config_from_args

    config = write(tmp_path, "run.toml", 'task = "text"\n[episode.optimizer]\nhost_lr = 0.0005\n')
    resolved = run_config_from_args(build_parser().parse_args(["run", "--config", config])).episode.optimizer
    assert resolved is not None and resolved.name == "adamw" and resolved.host_lr == 0.0005
    assert resolved.seed_lr == DEFAULT_OPTIMIZERS["text"]["seed_lr"]


@pytest.mark.parametrize(("task", "name"), [("text", "adamw"), ("digits", "sgd")])
def test_the_run_config_records_the_task_default_optimizer(task: str, name: str) -> None:
    """Without an `[episode.optimizer]` table the config holds the task's default, resolved, so that the
    run's config.json records it and a resumed run keeps it."""
    from morphogen.cli import build_parser, run_config_from_args

    resolved = run_config_from_args(build_parser().parse_args(["run", "--task", task])).episode.optimizer
    assert resolved is not None and resolved.name == name


def test_bad_config_value_names_its_path_and_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, "run.toml", "[episode]\nmax_epochs = 0\n")
    line = run_expecting_user_error(["run", "--config", config], capsys)
    assert "episode.max_epochs: must be >= 1, got 0" in line


def test_ablations_per_epoch_is_a_positive_count_or_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from morphogen.commands.run import RunConfig
    from morphogen.config import build_config

    config = write(tmp_path, "run.toml", "[episode]\nablations_per_epoch = 0\n")
    line = run_expecting_user_error(["run", "--config", config], capsys)
    assert "episode.ablations_per_epoch: must be >= 1, got 0" in line
    assert build_config(RunConfig, {"episode": {"ablations_per_epoch": None}}).episode.ablations_per_epoch is None


def test_bad_enum_value_lists_the_choices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, "run.yaml", "episode:\n  slots:\n    gates:\n      mode: lenient\n")
    line = run_expecting_user_error(["run", "--config", config], capsys)
    assert "episode.slots.gates.mode: 'lenient' is not one of 'strict', 'permissive'" in line


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("foo = 1", "host.foo: unknown key; accepted: n_blocks, base_channels, kernel_size"),
        ("base_channels = 0", "host.base_channels: must be >= 1, got 0"),
        ("kernel_size = 4", "host.kernel_size: must be odd and >= 1, got 4"),
        ('n_blocks = "two"', "host.n_blocks: expected an integer, got 'two'"),
    ],
)
@pytest.mark.parametrize("command", ["run", "train"])
def test_bad_host_table_is_one_line_naming_the_key(command: str, table: str, message: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, "config.toml", f"[host]\n{table}\n")
    run_dir = tmp_path / "r"
    line = run_expecting_user_error([command, "--config", config, "--run-dir", str(run_dir)], capsys)
    assert line == f"morphogen {command}: error: {message}"
    assert not run_dir.exists()


def test_zero_epochs_flag(capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--epochs", "0"], capsys)
    assert "--epochs must be >= 1, got 0" in line


def test_unknown_blueprint_in_heuristic_rotation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, "run.toml", '[heuristic]\nrotation = ["conv_light", "nope"]\n')
    run_dir = tmp_path / "r"
    line = run_expecting_user_error(["run", "--config", config, "--max-train-samples", "64",
                                     "--run-dir", str(run_dir)], capsys)
    assert "heuristic.rotation" in line and "'nope'" in line and "valid: " in line and "conv_light" in line
    assert not run_dir.exists()


def test_unknown_device(capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--device", "gpu0"], capsys)
    assert "device: 'gpu0' is not a device" in line and "cpu, cuda" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_requested_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--device", "cuda"], capsys)
    assert "CUDA is not available" in line and "--device cpu" in line


def test_run_directory_that_cannot_be_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = run_expecting_user_error(["run", "--max-train-samples", "64", "--run-dir", str(blocker / "run")], capsys)
    assert "run_dir: cannot create" in line


def test_a_second_run_into_a_run_directory_is_refused_and_leaves_it_untouched(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    tiny = ["--epochs", "1", "--max-train-samples", "64", "--no-from-scratch"]
    assert main(["run", *tiny, "--run-dir", str(run_dir)]) == 0
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    capsys.readouterr()
    line = run_expecting_user_error(["run", *tiny, "--run-dir", str(run_dir)], capsys)
    assert line.endswith(f"run_dir: {run_dir} already holds another run (config.json, events.jsonl, summary.json, "
                         "model.pt, baseline); choose another --run-dir")
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == before


@pytest.mark.parametrize("place", ["/", "/etc"])
def test_run_directory_in_a_system_directory_is_refused(place: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = run_expecting_user_error(["run", "--max-train-samples", "64", "--run-dir", place], capsys)
    assert f"run_dir: {place} is" in line and "directory of its own" in line


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--threads", "100000"], "--threads must be <= 1,024"),
    (["train", "--distributed", "--dist-timeout", "inf"], "--dist-timeout must be > 0 and <= 604,800 seconds, got inf"),
    (["train", "--distributed", "--dist-timeout", "1e20"], "--dist-timeout must be > 0 and <= 604,800 seconds"),
    (["train", "--distributed", "--dist-timeout", "nan"], "--dist-timeout must be > 0 and <= 604,800 seconds"),
])
def test_numeric_flags_have_upper_bounds(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert message in run_expecting_user_error(argv, capsys)


@pytest.mark.parametrize(("table", "message"), [
    ("[ppo]\nepochs = 1000000", "ppo.epochs: must be <= 10,000"),
    ("seed = 100000000000000000000", "seed: must fit in 64 bits"),
])
def test_config_values_have_upper_bounds(table: str, message: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text(table)
    assert message in run_expecting_user_error(["train", "--config", str(config)], capsys)


def test_a_yaml_alias_bomb_is_quoted_in_one_short_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Eight levels of nine aliases: 43 million strings if anything expanded the value to quote it."""
    anchors = '["x","x","x","x","x","x","x","x","x"]'
    for level in range(8):
        anchors = f"&l{level} {anchors}" if level == 0 else f"[{anchors}{f',*l{level - 1}' * 8}]"
        anchors = anchors if level == 0 else f"&l{level} {anchors}"
    config = tmp_path / "bomb.yaml"
    config.write_text(f"host:\n  base_channels: {anchors}\n")
    line = run_expecting_user_error(["run", "--config", str(config)], capsys)
    assert "host.base_channels: expected an integer, got [[[[" in line
    assert len(line) < 200, "the value is quoted in at most 80 characters"


class _ClosedPipe:
    """A stdout whose reader went away (`morphogen list tasks | head -1` after head's line)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:  # where stdout is sent once the pipe is closed: nowhere
        return os.open(os.devnull, os.O_WRONLY)


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from morphogen.cli import EXIT_BROKEN_PIPE

    run_dir = tmp_path / "run"
    assert main(["run", "--epochs", "1", "--max-train-samples", "64", "--no-baseline", "--no-from-scratch",
                 "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()

    for argv in (["list", "tasks"], ["report", str(run_dir)]):  # through rich's console, and through print
        monkeypatch.setattr("sys.stdout", _ClosedPipe())
        assert main(argv) == EXIT_BROKEN_PIPE == 141
        monkeypatch.undo()
        assert capsys.readouterr().err == ""  # no traceback


@pytest.mark.parametrize("argv", [
    ["run", "--config", "~/c.toml", "--data-dir", "~/cifar", "--text-file", "~/t.txt", "--run-dir", "~/runs/a",
     "--policy", "~/runs/p"],
    ["run", "--resume", "~/runs/a"],
    ["train", "--config", "~/c.toml", "--data-dir", "~/cifar", "--text-file", "~/t.txt", "--run-dir", "~/runs/a"],
    ["train", "--resume", "~/runs/a"],
    ["eval", "--config", "~/c.toml", "--policy", "~/runs/p", "--data-dir", "~/cifar", "--text-file", "~/t.txt",
     "--run-dir", "~/runs/e"],
    ["eval", "--resume", "~/runs/e"],
    ["report", "~/runs/a", "--output=~/report.html"],
    ["dashboard", "~/runs/a"],
    ["runs", "~/runs", "--compare", "~/runs/a", "~/runs/b"],
    ["export", "~/runs/a", "--out=~/x.pt2"],  # `--out=`: no shell expands a `~` there
])
def test_every_path_argument_expands_the_home_directory(argv: list[str], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from morphogen.cli import build_parser, parse_arguments

    monkeypatch.setenv("HOME", str(tmp_path))
    args = parse_arguments(build_parser(), argv)
    given = [argument.split("=", 1)[-1] for argument in argv if "~" in argument]
    parsed = [value for value in vars(args).values() for value in (value if isinstance(value, list) else [value])
              if isinstance(value, str) and "/" in value]  # the paths: no other argument here has a slash
    assert sorted(parsed) == sorted(f"{tmp_path}{path[1:]}" for path in given)
