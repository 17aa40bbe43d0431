"""`morphogen export RUN_DIR` on a built-in task: the program needs only torch (or ONNX Runtime) and matches the
grown model; bad input (no saved model, a damaged, hostile or forged model.pt, an unwritable output, a task built
in Python) is one line and exit 2, and leaves every file of the run directory as it was."""

from __future__ import annotations

import copy
import io
import json
import pickle
import shutil
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import morphogen
from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.commands.run import RunConfig, RunResult, run_command
from morphogen.control.heuristic import HeuristicConfig
from morphogen.control.integrity import state_checksum
from morphogen.core.lifecycle import GateConfig, GateMode, Stage
from morphogen.core.slot import SlotConfig
from morphogen.data import load_task
from morphogen.env.episode import EpisodeConfig
from morphogen.run_directory import MODEL_FILENAME


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """A 6-epoch digits run whose one slot ends with a seed HOLDING (settings that grow at once)."""
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=1)
    config = RunConfig(
        task="digits", max_train_samples=300, slots=("r0c0",), baseline=False, from_scratch=False,
        run_dir=str(tmp_path_factory.mktemp("export") / "run"),
        episode=EpisodeConfig(max_epochs=6, slots=SlotConfig(gates=gates, blend_epochs=3)),
        heuristic=HeuristicConfig(warmup_epochs=0, plateau_epochs=1, plateau_threshold=1e9, min_training_epochs=1,
                                  choice="rotation"))  # conv_heavy first: the seed these tests damage and forge
    result = run_command(config, out=io.StringIO())
    assert result.model.slot("r0c0").stage is Stage.HOLDING
    return result


def validation_inputs(count: int = 7) -> torch.Tensor:
    return load_task("digits").validation.inputs[:count]


def contents(run: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(run.iterdir()) if path.is_file()}


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_both_formats_load_without_morphogen_and_match_the_grown_model(
        grown: RunResult, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        run_without_morphogen: Callable[..., list[torch.Tensor]]) -> None:
    run = Path(shutil.copytree(grown.run_dir, tmp_path / "run"))
    assert main(["export", str(run)]) == 0
    assert main(["export", str(run), "--format", "onnx", "--output", str(tmp_path / "elsewhere" / "grown.onnx")]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and "seeds folded in: conv_heavy in r0c0 (holding)" in out
    assert "torch.export.load(" in out and "onnxruntime.InferenceSession(" in out
    inputs = validation_inputs()  # 7 samples: not the batch size the program was traced with
    with torch.no_grad():
        expected = grown.model.eval()(inputs)
        torch.testing.assert_close(morphogen.load_grown_model(run).eval()(inputs), expected, rtol=0, atol=0)
    outputs = run_without_morphogen([run / "model.pt2", tmp_path / "elsewhere" / "grown.onnx"], inputs)
    for output in outputs:
        torch.testing.assert_close(output, expected, rtol=0, atol=1e-5)


def forge(run: Path, change: Callable[[dict[str, object]], None]) -> None:
    """Rewrite the run's model.pt with `change` applied, with a checksum that matches (as a forger would)."""
    payload = torch.load(run / MODEL_FILENAME, weights_only=True)
    payload.pop("checksum")
    change(payload["model"])
    payload["checksum"] = state_checksum(payload)
    torch.save(payload, run / MODEL_FILENAME)


def slot_state(state: dict[str, object]) -> dict[str, object]:
    extra = state["seed_slots.r0c0._extra_state"]
    assert isinstance(extra, dict)
    return extra


def blending(state: dict[str, object]) -> None:
    slot_state(state)["lifecycle"]["stage"] = "blending"  # type: ignore[index]
    slot_state(state)["alpha"]["alpha"] = 0.5  # type: ignore[index]


def other_blueprint(state: dict[str, object]) -> None:
    slot_state(state)["blueprint"] = "widen_x8"


def huge_option(state: dict[str, object]) -> None:
    slot_state(state)["blueprint_options"] = {"rank": 10**12}


def damaged(run: Path) -> None:
    """One weight changed, as a bad disk or copy would (the stored checksum no longer matches)."""
    payload = torch.load(run / MODEL_FILENAME, weights_only=True)
    payload["model"]["seed_slots.r0c0.seed.body.0.weight"].view(-1)[0] = 1.29e29
    torch.save(payload, run / MODEL_FILENAME)


def truncated(run: Path) -> None:
    data = (run / MODEL_FILENAME).read_bytes()
    (run / MODEL_FILENAME).write_bytes(data[:len(data) // 2])


class Hostile:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this must never run",))


def hostile(run: Path) -> None:
    (run / MODEL_FILENAME).write_bytes(pickle.dumps({"kind": Hostile()}, protocol=2))


def python_task(run: Path) -> None:
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "task": "python"}))


@pytest.mark.parametrize(("prepare", "arguments", "message"), [
    (lambda run: (run / MODEL_FILENAME).unlink(), [], "no saved model at"),
    (damaged, [], "is damaged: its contents do not match the checksum"),
    (truncated, [], "is unreadable (truncated or corrupt?)"),
    (hostile, [], "was refused: it holds"),
    (lambda run: forge(run, other_blueprint), [], "slot r0c0's seed 'widen_x8' does not match the weights saved"),
    (lambda run: forge(run, huge_option), [], "slot r0c0's seed 'conv_heavy' cannot be built here"),
    (python_task, [], "grew a task built in Python (morphogen.grow)"),
    (lambda run: (run / "file").write_text(""), ["--output", "{run}/file/model.pt2"],
     "cannot write {run}/file/model.pt2: {run}/file is not a directory"),  # the OS said only "File exists"
    (lambda run: None, ["--output", "{run}/config.json"], "would replace the config.json of the run in"),
    (lambda run: None, ["--output", "{run}/../exports/"],  # it wrote a file named exports
     "cannot write {run}/../exports/: it ends in /, which names a directory; name the file, e.g. "
     "{run}/../exports/model.pt2"),
    (lambda run: None, ["--format", "tflite"], None),
    (lambda run: None, ["--dynamic-dims", "2"], "dimensions [2] cannot stay dynamic in the grown network"),
    (lambda run: None, ["--dynamic-dims", "one"], "--dynamic-dims takes dimensions after the batch's"),
    (lambda run: None, ["--output", "{run}/../grown.onnx"], "ends in .onnx, which names an ONNX model, but the format "
                                                            "is 'torch-export': pass format='onnx' (morphogen export: "
                                                            "--format onnx), or name the file *.pt2"),
], ids=["missing", "damaged", "truncated", "hostile", "forged-blueprint", "forged-option", "python-task",
        "unwritable", "run-file", "directory-name", "format", "fixed-image-size", "dims-not-numbers", "onnx-suffix"])
def test_bad_input_is_one_line_exit_2_and_the_run_directory_is_untouched(
        grown: RunResult, tmp_path: Path, capsys: pytest.CaptureFixture[str], prepare: Callable[[Path], None],
        arguments: list[str], message: str | None) -> None:
    run = Path(shutil.copytree(grown.run_dir, tmp_path / "run"))
    prepare(run)
    before = contents(run)
    if message is None:  # argparse refuses the flag itself, with the subcommand's usage
        with pytest.raises(SystemExit) as exit_info:
            main(["export", str(run), *arguments])
        assert exit_info.value.code == EXIT_USER_ERROR
    else:
        assert main(["export", str(run), *(argument.format(run=run) for argument in arguments)]) == EXIT_USER_ERROR
        err = one_line(capsys)
        assert err.startswith("morphogen export: error: ") and message.format(run=run) in err, err
    assert contents(run) == before and not (tmp_path / "exports").exists()
    assert "this must never run" not in capsys.readouterr().out


def test_export_never_replaces_a_file_of_a_run_nor_a_directory_behind_a_link(
        grown: RunResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A comparison's model inside the run, another run's model, or a link to a directory: one line, nothing written.
    run = Path(shutil.copytree(grown.run_dir, tmp_path / "run"))
    (run / "from_scratch").mkdir()
    (run / "from_scratch" / MODEL_FILENAME).write_bytes(b"the from-scratch model")
    other = Path(shutil.copytree(grown.run_dir, tmp_path / "other"))
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    (tmp_path / "shelf-link").symlink_to(shelf)
    kept = {path: path.read_bytes() for path in [run / "from_scratch" / MODEL_FILENAME, other / MODEL_FILENAME]}
    for output, message in [(run / "from_scratch" / MODEL_FILENAME, "would replace the model.pt of the run in"),
                            (other / MODEL_FILENAME, "would replace the model.pt of the run in"),
                            (tmp_path / "shelf-link", "it is a directory (a link to one); name the file")]:
        assert main(["export", str(run), "--output", str(output)]) == EXIT_USER_ERROR
        assert message in one_line(capsys)
    assert {path: path.read_bytes() for path in kept} == kept
    assert (tmp_path / "shelf-link").is_symlink() and list(shelf.iterdir()) == []
    assert main(["export", str(run), "--output", str(tmp_path / "shelf-link" / "grown.pt2")]) == 0  # into it: fine
    assert (shelf / "grown.pt2").is_file()


def test_a_blending_seed_goes_in_at_its_alpha_or_can_be_left_out(grown: RunResult, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    run = Path(shutil.copytree(grown.run_dir, tmp_path / "run"))
    forge(run, blending)
    assert main(["export", str(run)]) == 0
    assert "seeds folded in: conv_heavy in r0c0 (blending, alpha 0.50)" in capsys.readouterr().out
    model, inputs = morphogen.load_grown_model(run).eval(), validation_inputs()
    with torch.no_grad():  # the model as it computes, its seed at alpha 0.5
        torch.testing.assert_close(torch.export.load(run / "model.pt2").module()(inputs), model(inputs), rtol=0,
                                   atol=1e-5)
    assert main(["export", str(run), "--leave-out-blending", "--output", str(tmp_path / "without.pt2")]) == 0
    assert "left out: conv_heavy in r0c0 (blending, alpha 0.50)" in capsys.readouterr().out
    program = torch.export.load(tmp_path / "without.pt2").module()
    host = grown.model.host.eval()
    inputs = validation_inputs()
    with torch.no_grad():
        torch.testing.assert_close(program(inputs), host(inputs), rtol=0, atol=1e-5)  # the host alone


def test_a_file_named_for_the_other_format_is_refused_before_anything_is_written(grown: RunResult,
                                                                                  tmp_path: Path) -> None:
    """`export_model(model, x, "grown.onnx")` wrote a torch.export program under an ONNX name, which no ONNX
    runtime reads."""
    for name, format in [("grown.onnx", "torch-export"), ("grown.PT2", "onnx")]:
        with pytest.raises(morphogen.ExportError, match=rf"^{tmp_path / name} ends in \.{name.split('.')[1].lower()}, "
                                                        rf"which names .*, but the format is '{format}'"):
            morphogen.export_model(grown.model, validation_inputs(2), tmp_path / name, format=format)
        assert not (tmp_path / name).exists()
    assert morphogen.export_model(grown.model, validation_inputs(2), tmp_path / "grown.bin").exists()  # any other
    with pytest.raises(morphogen.ExportError, match=r"ends in /, which names a directory; name the file, e\.g\. "):
        morphogen.export_model(grown.model, validation_inputs(2), f"{tmp_path}/exports/")
    assert not (tmp_path / "exports").exists()


def test_onnx_without_its_extra_says_how_to_install_it(grown: RunResult, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if `morphogen[onnx]` were not installed
    with pytest.raises(morphogen.ExportError, match=r"pip install 'morphogen\[onnx\]'"):
        morphogen.export_model(grown.model, validation_inputs(2), tmp_path / "grown.onnx", format="onnx")
    assert not (tmp_path / "grown.onnx").exists()


def test_the_final_architecture_trained_from_scratch_is_returned_saved_and_exported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=1)
    config = RunConfig(
        task="digits", max_train_samples=300, slots=("r0c0",), baseline=False, from_scratch=True,
        run_dir=str(tmp_path / "run"),
        episode=EpisodeConfig(max_epochs=4, slots=SlotConfig(gates=gates, blend_epochs=3)),
        heuristic=HeuristicConfig(warmup_epochs=0, plateau_epochs=1, plateau_threshold=1e9, min_training_epochs=1,
                                  choice="rotation"))
    result = run_command(config, out=io.StringIO())
    scratch = result.from_scratch_model
    assert scratch is not None and result.from_scratch is not None
    assert scratch.architecture() == result.model.architecture() == {"r0c0": "conv_heavy"}
    assert scratch.param_count() == result.from_scratch.parameters
    inputs = validation_inputs()
    with torch.no_grad():
        expected = scratch.eval()(inputs)
        assert not torch.equal(expected, result.model.eval()(inputs))  # trained apart from the grown model
        loaded = morphogen.load_grown_model(result.run_dir, from_scratch=True)
        torch.testing.assert_close(loaded.eval()(inputs), expected, rtol=0, atol=0)
    assert main(["export", str(result.run_dir), "--from-scratch"]) == 0
    assert "seeds folded in: conv_heavy in r0c0" in capsys.readouterr().out
    program = torch.export.load(result.run_dir / "model_from_scratch.pt2").module()
    torch.testing.assert_close(program(inputs), expected, rtol=0, atol=1e-5)


def test_a_run_without_the_from_scratch_training_says_so(grown: RunResult, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    run = Path(shutil.copytree(grown.run_dir, tmp_path / "run"))
    before = contents(run)
    assert main(["export", str(run), "--from-scratch"]) == EXIT_USER_ERROR
    assert "trained no final architecture from scratch" in one_line(capsys)
    assert contents(run) == before


def test_a_run_started_with_a_relative_text_file_exports_from_any_directory(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "start").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "start" / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    monkeypatch.chdir(tmp_path / "start")
    assert main(["run", "--task", "text", "--text-file", "corpus.txt", "--epochs", "1", "--no-baseline",
                 "--no-from-scratch", "--threads", "1", "--run-dir", "run"]) == 0
    saved = json.loads((tmp_path / "start" / "run" / "config.json").read_text())["text_file"]
    assert saved == str(tmp_path / "start" / "corpus.txt")  # where the data is, not where the run started from
    summary = json.loads((tmp_path / "start" / "run" / "summary.json").read_text())
    assert summary["vocabulary"] == sorted(set("the quick brown fox jumps over the lazy dog\n"))  # token id -> char
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["export", "../start/run", "--output", "model.pt2"]) == 0
    assert (tmp_path / "elsewhere" / "model.pt2").is_file()


def test_export_model_misused_from_python_says_what_it_needs(grown: RunResult, tmp_path: Path) -> None:
    # Mistakes a user makes in Python: one ExportError naming the fix, never torch's error from deep inside.
    model, inputs = grown.model, validation_inputs(2)
    path = tmp_path / "grown.pt2"
    with pytest.raises(morphogen.ExportError, match=r"^export_model takes the grown model .* not a CNNHost$"):
        morphogen.export_model(model.host, inputs, path)  # type: ignore[arg-type]
    with pytest.raises(morphogen.ExportError, match=r"^running the grown network on example_input failed: .*"
                                                    r"\(the inputs are float64, the model's parameters float32"):
        morphogen.export_model(model, inputs.double(), path)
    meta = morphogen.load_grown_model(grown.run_dir).to("meta")
    with pytest.raises(morphogen.ExportError, match=r"^the model is on the meta device: it holds no weights"):
        morphogen.export_model(meta, inputs.to("meta"), path)
    with pytest.raises(morphogen.ExportError, match=r"^example_input is on the meta device: it holds no values"):
        morphogen.export_model(model, inputs.to("meta"), path)  # torch's NotImplementedError from copying it
    assert not path.exists()


def test_one_sample_as_the_example_input_warns_that_the_example_is_a_batch(tmp_path: Path) -> None:
    """`x[0]` (one sample's 4 features) rather than `x[:2]`: the program takes a batch of 4 fixed rows, and the
    warning says why, where it once said only that the batch could not stay dynamic."""
    network = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    model = morphogen.MorphogeneticModel(morphogen.host_from_module(network, ["1"], example_input=x[:2])).eval()
    with pytest.warns(UserWarning, match=r"^exported with a fixed batch size of 4: .*; example_input's first "
                                         r"dimension is the batch: was it one sample's values \(give x\[:2\], not "
                                         r"x\[0\]\)\?$"):
        morphogen.export_model(model, x[0], tmp_path / "grown.pt2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a batch exports with a dynamic batch dimension, without a warning
        morphogen.export_model(model, x[:2], tmp_path / "grown.pt2")

def test_an_export_under_the_callers_autocast_is_a_program_of_the_models_dtype(grown: RunResult,
                                                                             tmp_path: Path) -> None:
    """Traced under the caller's bfloat16 autocast, the program asserted bfloat16 where the seed's blend casts
    and failed wherever it was called without that autocast ("Tensor dtype mismatch"), as a loaded program is."""
    inputs = validation_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        morphogen.export_model(grown.model, inputs[:2], tmp_path / "grown.pt2")
    program = torch.export.load(tmp_path / "grown.pt2").module()
    with torch.no_grad():
        output = program(inputs)
        assert output.dtype == torch.float32
        torch.testing.assert_close(output, grown.model.eval()(inputs), rtol=0, atol=1e-5)


def test_host_from_module_refuses_a_model_on_the_meta_device_in_one_line() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to("meta")
    with pytest.raises(morphogen.HostBuildError, match=r"^the model is on the meta device: host_from_module runs it"):
        morphogen.host_from_module(net, ["1"], torch.zeros(2, 4, device="meta"))


def test_an_export_can_take_raw_pixels_and_says_what_inputs_it_takes(grown: RunResult, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # The digits task standardizes its pixels; a user shipping the model needs that, or the export to do it.
    run = Path(shutil.copytree(grown.run_dir, tmp_path / "run"))
    standardization = load_task("digits").input_standardization
    assert standardization is not None
    assert json.loads((run / "summary.json").read_text())["input_standardization"] == standardization.as_dict()
    assert main(["export", str(run)]) == 0
    assert f"its inputs: standardized, (x - mean) / std per channel from scikit-learn's pixel values 0..16, mean " \
           f"[{standardization.mean[0]:.4f}]" in capsys.readouterr().out
    assert main(["export", str(run), "--raw-inputs", "--output", str(tmp_path / "raw.pt2")]) == 0
    assert "its inputs: scikit-learn's pixel values 0..16, as they are" in capsys.readouterr().out
    inputs = validation_inputs()
    raw = standardization.to_raw(inputs)
    assert raw.min() >= -1e-4 and raw.max() <= 16 + 1e-4  # pixel values again
    with torch.no_grad():
        torch.testing.assert_close(torch.export.load(tmp_path / "raw.pt2").module()(raw),
                                   torch.export.load(run / "model.pt2").module()(inputs), rtol=0, atol=1e-5)
    # A model converted to ship in bfloat16 or float64: the standardization computes in its dtype (in float32
    # before, whose output a bfloat16 network refused).
    for dtype in (torch.bfloat16, torch.float64):
        model = copy.deepcopy(grown.model).to(dtype).eval()
        morphogen.export_model(model, raw[:2].to(dtype), tmp_path / "raw_other.pt2", raw_inputs=standardization)
        mean, std = (torch.tensor(values, dtype=dtype).view(1, -1, 1, 1)
                     for values in (standardization.mean, standardization.std))
        with torch.no_grad():
            output = torch.export.load(tmp_path / "raw_other.pt2").module()(raw.to(dtype))
            assert output.dtype == dtype
            torch.testing.assert_close(output, model((raw.to(dtype) - mean) / std), rtol=0, atol=1e-5)


def test_raw_inputs_of_a_task_that_standardizes_nothing_is_one_line(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["run", "--task", "mnist1d", "--epochs", "1", "--max-train-samples", "100", "--no-baseline",
                 "--threads", "1", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["export", str(run), "--raw-inputs"]) == EXIT_USER_ERROR
    assert one_line(capsys).strip().endswith("--raw-inputs: task 'mnist1d' standardizes nothing; its model reads the "
                                             "data as it is")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_load_grown_model_on_a_device_this_machine_lacks_is_one_config_error(grown: RunResult) -> None:
    """`device="cuda"` on a CPU-only torch ended in torch's AssertionError ("Torch not compiled with CUDA enabled")
    from deep inside the rebuild; it is one ConfigError naming the fix, and `meta` still rebuilds without memory."""
    with pytest.raises(morphogen.ConfigError, match=r"^device: 'cuda' requested but CUDA is not available here "
                                                    r"\(torch .*\); use device='cpu'$"):
        morphogen.load_grown_model(grown.run_dir, device="cuda")
    with pytest.raises(morphogen.ConfigError, match=r"^device: 'tpu' is not a device morphogen places a model on"):
        morphogen.load_grown_model(grown.run_dir, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: copying the saved weights into meta tensors does nothing
        meta = morphogen.load_grown_model(grown.run_dir, device="meta")
    assert {parameter.device.type for parameter in meta.parameters()} == {"meta"}
    assert next(morphogen.load_grown_model(grown.run_dir, device="auto").parameters()).device.type == "cpu"


def test_a_path_that_starts_with_a_tilde_is_in_the_home_directory(grown: RunResult, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # a `~` taken as a directory's name would be made here
    shutil.copytree(grown.run_dir, tmp_path / "run")
    assert main(["export", "~/run", "--output=~/exported/model.pt2"]) == 0  # `--output=`: no shell expands that `~`
    model = morphogen.load_grown_model("~/run")
    assert morphogen.export_model(model, validation_inputs(2), "~/from_python.pt2") == tmp_path / "from_python.pt2"
    assert (tmp_path / "exported" / "model.pt2").is_file() and not (tmp_path / "~").exists()
