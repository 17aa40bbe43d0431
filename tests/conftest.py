"""Settings and fixtures for the whole test suite."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

import pytest
import torch

SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")


def pytest_configure() -> None:
    """One intra-op thread: the models under test are tiny, and on a busy 2-core machine a second
    spinning thread makes them several times slower (and timings noisier), not faster."""
    torch.set_num_threads(1)


@pytest.fixture
def sync_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Records every Tensor method call that would synchronize a device with the host."""
    calls: list[str] = []
    for name in SYNC_METHODS:
        original = getattr(torch.Tensor, name)

        def counted(
            self: torch.Tensor, *args: object, _name: str = name, _original: Callable[..., object] = original
        ) -> object:
            calls.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield calls


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Compiled graphs and dynamo's counters are global: a compile test starts and ends with them empty
    (modules that compile use it for every test: `pytestmark = pytest.mark.usefixtures("fresh_dynamo")`)."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


#: Runs exported models in a fresh Python in which `import morphogen` fails: argv is a JSON list of jobs
#: (format, model file, inputs file, outputs file); each job's outputs are saved with torch.save.
_LOAD_WITHOUT_MORPHOGEN = """
import json, sys
sys.modules["morphogen"] = None  # from here on, any import of morphogen raises ImportError
try:
    import morphogen
except ImportError:
    pass
else:
    raise SystemExit("morphogen could be imported")
import torch
for form, model_path, inputs_path, outputs_path in json.loads(sys.argv[1]):
    inputs = torch.load(inputs_path)  # one tensor, or a tuple or dict of them: the model's arguments
    arguments = tuple(inputs) if isinstance(inputs, (tuple, list)) else () if isinstance(inputs, dict) else (inputs,)
    keywords = inputs if isinstance(inputs, dict) else {}
    if form == "torch-export":
        outputs = torch.export.load(model_path).module()(*arguments, **keywords)
    else:
        import onnxruntime
        session = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
        feeds = [*arguments, *keywords.values()]
        outputs = torch.from_numpy(session.run(None, {slot.name: value.numpy()
                                                      for slot, value in zip(session.get_inputs(), feeds)})[0])
    torch.save(outputs.detach(), outputs_path)
assert not any(name == "morphogen" or name.startswith("morphogen.") for name in sys.modules if sys.modules[name])
"""


@pytest.fixture
def run_without_morphogen(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[torch.Tensor]]:
    """`run(files, inputs)`: the outputs of each exported model file (a .pt2 torch.export program or an .onnx model)
    on `inputs`, computed in a fresh process where morphogen cannot be imported."""
    import json
    import subprocess
    import sys

    def run(files: list[object], inputs: object) -> list[torch.Tensor]:
        from morphogen.inputs import Inputs, to_device

        folder = tmp_path_factory.mktemp("without-morphogen")
        torch.save(to_device(cast(Inputs, inputs), "cpu"), folder / "inputs.pt")
        jobs = [("onnx" if str(path).endswith(".onnx") else "torch-export", str(path), str(folder / "inputs.pt"),
                 str(folder / f"outputs{index}.pt")) for index, path in enumerate(files)]
        finished = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_MORPHOGEN, json.dumps(jobs)],
                                  capture_output=True, text=True, timeout=600, check=False)
        assert finished.returncode == 0, finished.stderr[-3000:]
        return [torch.load(job[3]) for job in jobs]

    return run
