"""A user error is refused before anything is made: one line (or one exception from Python), no run directory (not
even an empty one), no `seeds_plan.json`, `config.json` or `.lock`, no worker process; a refused `--resume` leaves its
run as it was.

Every case is refused before any training: the fixture `nothing_trains` makes an episode, a training or a worker
process that starts anyway fail the test at once, and the settings are tiny besides, so that a refusal that breaks
fails fast instead of training."""

from __future__ import annotations

import hashlib
import io
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import morphogen
import morphogen.commands.evaluate as evaluate_module
import morphogen.commands.run as run_module
import morphogen.commands.train as train_module
import morphogen.over_seeds as over_seeds_module
from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.config import ConfigError
from morphogen.control.checkpoint import CheckpointError
from morphogen.core.blueprints import UnknownBlueprintError
from morphogen.core.hosts import UnknownSlotError
from morphogen.data import DataError, Task, load_task
from morphogen.run_directory import SCORES_FILENAME, SEEDS_FILENAME, SUMMARY_FILENAME

RUN = ["--epochs", "1", "--max-train-samples", "64", "--no-baseline", "--no-from-scratch", "--threads", "1"]
SEEDS = [*RUN, "--seeds", "2"]
TRAIN = ["--rounds", "1", "--envs", "1", "--episode-length", "1", "--max-train-samples", "64", "--hidden-size", "16",
         "--threads", "1"]
EVAL = ["--episodes", "1", "--episode-length", "1", "--max-train-samples", "64", "--threads", "1"]
#: Config files the cases name as {files}/NAME.
CONFIG_FILES = {
    "host.toml": "[host]\nbase_channels = 0\n",
    "blueprint.toml": '[heuristic]\nrotation = ["nope"]\n',
    "mix_unknown_task.toml": '[[mix]]\ntask = "digits"\n[[mix]]\ntask = "nope"\n',
    "mix_bad_host.toml": '[[mix]]\ntask = "digits"\nhost = { n_blocks = 0 }\n',
    "mix_slots.toml": 'slots = ["r9c9"]\n[[mix]]\ntask = "digits"\n[[mix]]\ntask = "mnist1d"\n',
    "mix_ignores_task.toml": 'task = "mnist1d"\n[[mix]]\ntask = "digits"\n',
}
#: The runs the resume and export cases name as {NAME}: each made once, and copied by a test that uses it.
RUN_NAMES = ("finished", "stopped", "trained", "seeds", "evaluated")


def case(name: str, argv: list[str], says: str, *, cuda: bool = False) -> Any:
    """One row: a command line and what its error line says; `cuda`: a device this test needs the machine to lack."""
    marks = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA") if cuda else ()
    return pytest.param(argv, says, id=name, marks=marks)


#: New runs into {run} (`--run-dir` where the command line names no {run} itself), which must not exist afterwards.
NEW_RUNS = [
    case("run-slot", ["run", *RUN, "--slots", "r9c9"], "unknown slot 'r9c9'"),
    case("run-task", ["run", *RUN, "--task", "nope"], "unknown task 'nope'"),
    case("run-host", ["run", *RUN, "--config", "{files}/host.toml"], "host.base_channels: must be >= 1"),
    case("run-blueprint", ["run", *RUN, "--config", "{files}/blueprint.toml"], "heuristic.rotation: unknown cnn"),
    case("run-cuda", ["run", *RUN, "--device", "cuda"], "device: 'cuda' requested but", cuda=True),
    case("run-device", ["run", *RUN, "--device", "tpu"], "device: 'tpu' is not a device"),
    case("run-data-dir", ["run", *RUN, "--task", "cifar10", "--data-dir", "{files}/missing"], "CIFAR-10 data"),
    case("run-text-file", ["run", *RUN, "--task", "text", "--text-file", "{files}/missing.txt"], "does not exist"),
    case("seeds-slot", ["run", *SEEDS, "--slots", "r9c9"], "unknown slot 'r9c9'"),
    case("seeds-task", ["run", *SEEDS, "--task", "nope"], "unknown task 'nope'"),
    case("seeds-blueprint", ["run", *SEEDS, "--config", "{files}/blueprint.toml"], "unknown cnn blueprint"),
    case("seeds-data-dir", ["run", *SEEDS, "--task", "cifar10", "--data-dir", "{files}/missing"], "CIFAR-10 data"),
    case("seeds-cuda", ["run", *SEEDS, "--device", "cuda"], "device: 'cuda' requested but", cuda=True),
    case("seeds-policy-slot", ["run", *SEEDS, "--policy", "default", "--slots", "r9c9"], "unknown slot 'r9c9'"),
    case("seeds-jobs-slot", ["run", *SEEDS, "--jobs", "2", "--slots", "r9c9"], "unknown slot 'r9c9'"),
    case("seeds-jobs", ["run", *SEEDS, "--jobs", "0"], "jobs must be >= 1"),
    case("compare-size", ["run", *RUN, "--compare", "a=n_blocks=0"], "compare_with: 'a': n_blocks: must be >= 1"),
    case("compare-key", ["run", *RUN, "--compare", "a=width=3"], "compare_with: 'a': width: unknown key"),
    case("compare-import", ["run", *RUN, "--compare", "a=no_such_module:host"], "compare_with: 'a': cannot import"),
    case("policy-not-torch", ["run", *RUN, "--policy", "{files}/not_a_policy.pt"], "not_a_policy.pt"),
    case("policy-format", ["run", *RUN, "--policy", "{files}/other_format.pt"], "is not a morphogen checkpoint"),
    case("policy-directory", ["run", *RUN, "--policy", "{files}"], "no checkpoint at"),
    case("policy-slot", ["run", *RUN, "--policy", "default", "--slots", "r9c9"], "unknown slot 'r9c9'"),
    case("train-slot", ["train", *TRAIN, "--slots", "r9c9"], "unknown slot 'r9c9'"),
    case("train-task", ["train", *TRAIN, "--task", "nope"], "unknown task 'nope'"),
    case("train-host", ["train", *TRAIN, "--config", "{files}/host.toml"], "host.base_channels: must be >= 1"),
    case("train-cuda", ["train", *TRAIN, "--device", "cuda"], "device: 'cuda' requested but", cuda=True),
    case("train-devices", ["train", *TRAIN, "--devices", "cpu,cuda"], "devices: 'cuda' requested but", cuda=True),
    case("train-data-dir", ["train", *TRAIN, "--task", "cifar10", "--data-dir", "{files}/missing"], "CIFAR-10 data"),
    case("tasks-unknown", ["train", *TRAIN, "--tasks", "digits,nope"], "unknown task 'nope'"),
    case("tasks-slot", ["train", *TRAIN, "--tasks", "digits,mnist1d", "--slots", "r9c9"], "unknown slot 'r9c9'"),
    case("mix-unknown-task", ["train", *TRAIN, "--config", "{files}/mix_unknown_task.toml"], "unknown task 'nope'"),
    case("mix-host", ["train", *TRAIN, "--config", "{files}/mix_bad_host.toml"], "n_blocks: must be >= 1"),
    case("mix-slot", ["train", *TRAIN, "--config", "{files}/mix_slots.toml"], "unknown slot 'r9c9'"),
    case("mix-ignored-key", ["train", *TRAIN, "--config", "{files}/mix_ignores_task.toml"], "mnist1d would be ignored"),
    case("eval-slot", ["eval", *EVAL, "--policy", "default", "--slots", "r9c9"], "unknown slot 'r9c9'"),
    case("eval-jobs-slot", ["eval", *EVAL, "--policy", "default", "--slots", "r9c9", "--jobs", "2"], "unknown slot"),
    case("eval-task", ["eval", *EVAL, "--policy", "default", "--task", "nope"], "unknown task 'nope'"),
    case("eval-cuda", ["eval", *EVAL, "--policy", "default", "--device", "cuda"], "device: 'cuda' requested",
         cuda=True),
    case("eval-policy-format", ["eval", *EVAL, "--policy", "{files}/other_format.pt"], "is not a morphogen checkpoint"),
    case("eval-data-dir", ["eval", *EVAL, "--policy", "default", "--task", "cifar10", "--data-dir", "{files}/missing"],
         "CIFAR-10 data directory"),
    case("run-resume-missing", ["run", "--resume", "{run}"], "holds no run of `morphogen run` to resume"),
    case("train-resume-missing", ["train", "--resume", "{run}", "--rounds", "2"], "no checkpoint at"),
    case("eval-resume-missing", ["eval", "--resume", "{run}"], "holds no evaluation"),
    case("export-no-model", ["export", "{trained}", "--output", "{run}/model.pt2"], "no saved model"),
    case("export-from-scratch", ["export", "{finished}", "--from-scratch", "--output", "{run}/model.pt2"],
         "trained no final architecture from scratch"),
    case("export-suffix", ["export", "{finished}", "--output", "{run}/model.onnx"], "names an ONNX model"),
    case("export-dims", ["export", "{finished}", "--output", "{run}/model.pt2", "--dynamic-dims", "x"],
         "--dynamic-dims"),
]

#: Commands on an existing run (resumes, an export), which must leave it as it was.
ON_A_RUN = [
    case("run-cuda", ["run", "--resume", "{stopped}", "--device", "cuda"], "device: 'cuda' requested but", cuda=True),
    case("run-flag", ["run", "--resume", "{stopped}", "--slots", "r9c9"], "not --slots"),
    case("run-policy", ["run", "--resume", "{stopped}", "--policy", "{files}/other_format.pt"], "not a morphogen"),
    case("seeds-cuda", ["run", "--resume", "{seeds}", "--device", "cuda"], "device: 'cuda' requested but", cuda=True),
    case("seeds-jobs", ["run", "--resume", "{seeds}", "--jobs", "0"], "jobs must be >= 1"),
    case("seeds-flag", ["run", "--resume", "{seeds}", "--epochs", "2"], "not --epochs"),
    case("train-finished", ["train", "--resume", "{trained}", "--rounds", "1"], "already finished all 1 of its rounds"),
    case("train-cuda", ["train", "--resume", "{trained}", "--rounds", "2", "--device", "cuda"], "device: 'cuda'",
         cuda=True),
    case("train-flag", ["train", "--resume", "{trained}", "--slots", "r9c9"], "only --rounds"),
    case("train-task", ["train", "--resume", "{trained}", "--task", "mnist1d"], "cannot change task"),
    case("eval-cuda", ["eval", "--resume", "{evaluated}", "--device", "cuda"], "device: 'cuda' requested", cuda=True),
    case("eval-jobs", ["eval", "--resume", "{evaluated}", "--jobs", "0"], "jobs: must be >= 1"),
    case("eval-flag", ["eval", "--resume", "{evaluated}", "--episodes", "3"], "not --episodes"),
    case("export-dims", ["export", "{finished}", "--dynamic-dims", "0"], "--dynamic-dims"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny run of each kind to resume or export (tests copy them), and the files the cases name."""
    root = tmp_path_factory.mktemp("runs")
    files = root / "files"
    files.mkdir()
    for name, text in CONFIG_FILES.items():
        (files / name).write_text(text)
    (files / "not_a_policy.pt").write_bytes(b"not a checkpoint")
    torch.save({"weights": torch.zeros(2)}, files / "other_format.pt")
    made = {name: root / name for name in RUN_NAMES}
    assert main(["run", *RUN, "--run-dir", str(made["finished"])]) == 0
    shutil.copytree(made["finished"], made["stopped"])
    (made["stopped"] / SUMMARY_FILENAME).unlink()  # as a run stopped before its summary
    assert main(["train", *TRAIN, "--run-dir", str(made["trained"])]) == 0
    assert main(["run", *SEEDS, "--run-dir", str(made["seeds"])]) == 0
    (made["seeds"] / SEEDS_FILENAME).unlink()  # as a run over seeds stopped before its figures: every seed finished
    assert main(["eval", *EVAL, "--policy", "default", "--run-dir", str(made["evaluated"])]) == 0
    (made["evaluated"] / SCORES_FILENAME).unlink()  # as an evaluation stopped before its table
    return {**made, "files": files}


def _started(what: str) -> Callable[..., Any]:
    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError(f"{what} started: a user error was not refused before it")
    return refuse


@pytest.fixture
def nothing_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    """An episode, a training or a worker process that starts fails the test at once, instead of running."""
    monkeypatch.setattr(run_module, "run_episode", _started("an episode"))
    monkeypatch.setattr(evaluate_module, "run_episode", _started("an episode"))
    monkeypatch.setattr(train_module, "train", _started("a training"))
    monkeypatch.setattr(over_seeds_module, "spawned_workers", _started("a worker process"))
    monkeypatch.setattr(evaluate_module, "spawned_workers", _started("a worker process"))


def _contents(directory: Path) -> dict[str, str]:
    """Every path under `directory` with the digest of its bytes ("" for a directory)."""
    return {str(path.relative_to(directory)): "" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*"))}


def _refused(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`argv` exits with the user-error status and one stderr line, of its command, that says `says`; no output."""
    capsys.readouterr()
    assert main(argv) == EXIT_USER_ERROR
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"morphogen {argv[0]}: error: "), captured.err
    assert says in lines[0]
    assert captured.out == ""


@pytest.mark.usefixtures("nothing_trains")
@pytest.mark.parametrize(("argv", "says"), NEW_RUNS)
def test_a_refused_new_run_makes_no_run_directory(argv: list[str], says: str, runs: dict[str, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "new" / "run"
    if not any("{run}" in part for part in argv):
        argv = [*argv, "--run-dir", "{run}"]
    before = {name: _contents(runs[name]) for name in RUN_NAMES if f"{{{name}}}" in argv}
    _refused([part.format(run=run_dir, **runs) for part in argv], says, capsys)
    assert not (tmp_path / "new").exists()  # nor its parent: nothing was made
    assert {name: _contents(runs[name]) for name in before} == before


@pytest.mark.usefixtures("nothing_trains")
@pytest.mark.parametrize(("argv", "says"), ON_A_RUN)
def test_a_refused_command_on_a_run_changes_nothing_in_it(argv: list[str], says: str, runs: dict[str, Path],
                                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copies = {name: Path(shutil.copytree(runs[name], tmp_path / name)) for name in RUN_NAMES if f"{{{name}}}" in argv}
    before = {name: _contents(path) for name, path in copies.items()}
    _refused([part.format(**{**runs, **copies}) for part in argv], says, capsys)
    assert {name: _contents(path) for name, path in copies.items()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(copies)  # nothing made beside it


@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task("digits", max_train_samples=64)


#: Settings under which an episode that started anyway would be over at once.
TINY = {"baseline": False, "from_scratch": False, "episode": {"max_epochs": 1}}
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
#: (keyword arguments of `grow` and `grow_over_seeds`, the error, what it says).
GROW_ERRORS = [
    pytest.param({"config": {**TINY, "slots": ["r9c9"]}}, UnknownSlotError, "unknown slot 'r9c9'", id="slot"),
    pytest.param({"config": {**TINY, "heuristic": {"rotation": ["nope"]}}}, UnknownBlueprintError, "unknown cnn",
                 id="blueprint"),
    pytest.param({"config": {**TINY, "nope": 1}}, ConfigError, "nope: unknown key", id="config-key"),
    pytest.param({"config": TINY, "policy": "{files}/other_format.pt"}, CheckpointError, "not a morphogen checkpoint",
                 id="policy"),
    pytest.param({"config": TINY, "compare_with": {"a": 3}}, DataError, "compare_with: 'a'", id="compare"),
    pytest.param({"config": TINY, "epochs": 0}, ValueError, "epochs must be >= 1", id="epochs"),
    pytest.param({"config": TINY, "device": "cuda"}, ConfigError, "use device='cpu'", id="cuda", marks=NO_CUDA),
]


@pytest.mark.usefixtures("nothing_trains")
@pytest.mark.parametrize("over_seeds", [None, 1, 2], ids=["grow", "grow_over_seeds", "grow_over_seeds-jobs"])
@pytest.mark.parametrize(("options", "error", "says"), GROW_ERRORS)
def test_grow_refuses_before_it_makes_a_run_directory(options: dict[str, Any], error: type[Exception], says: str,
                                                      over_seeds: int | None, digits: Task, runs: dict[str, Path],
                                                      tmp_path: Path) -> None:
    """`over_seeds`: None calls `grow`, else `grow_over_seeds` with that many jobs."""
    options = {key: value.format(**runs) if isinstance(value, str) else value for key, value in options.items()}
    run_dir = str(tmp_path / "new" / "run")
    with pytest.raises(error) as raised:
        if over_seeds is None:
            morphogen.grow(digits, run_dir=run_dir, out=io.StringIO(), **options)
        else:
            morphogen.grow_over_seeds(digits, seeds=2, jobs=over_seeds, run_dir=run_dir, out=io.StringIO(), **options)
    assert says in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "new").exists()


def test_grow_over_seeds_refuses_an_option_grow_lacks_before_it_makes_a_run_directory(digits: Task,
                                                                                      tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'epoch'"):
        morphogen.grow_over_seeds(digits, seeds=2, run_dir=str(tmp_path / "run"), out=io.StringIO(), config=TINY,
                                  epoch=1)
    assert not (tmp_path / "run").exists()


def _own_host() -> morphogen.SegmentedHost:
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
    return morphogen.host_from_module(model, slots=["2"], example_input=torch.zeros(2, 1, 8, 8))


@pytest.mark.parametrize(("options", "error", "says"), [
    pytest.param({"slots": ["nope"]}, UnknownSlotError, "unknown slot 'nope'", id="slot"),
    pytest.param({"config": {"heuristic": {"rotation": ["nope"]}}}, UnknownBlueprintError, "unknown mlp",
                 id="blueprint"),
    pytest.param({"config": {"nope": 1}}, ConfigError, "nope: unknown key", id="config-key"),
    pytest.param({"policy": "{files}/other_format.pt"}, CheckpointError, "not a morphogen checkpoint", id="policy"),
    pytest.param({"optimizer": torch.optim.SGD}, TypeError, "optimizer", id="optimizer"),
])
def test_grower_refuses_in_one_line(options: dict[str, Any], error: type[Exception], says: str, digits: Task,
                                    runs: dict[str, Path]) -> None:
    options = {key: value.format(**runs) if isinstance(value, str) else value for key, value in options.items()}
    with pytest.raises(error) as raised:
        morphogen.Grower(_own_host(), (torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))), epochs=1, **options)
    assert says in str(raised.value) and "\n" not in str(raised.value)
