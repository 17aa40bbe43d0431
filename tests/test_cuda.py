"""On a real CUDA device: the stream rules hold, the batched path agrees, a whole run ends well.

Skipped where torch sees no CUDA device (CI has none); `tests/env/test_vector_streams.py` checks the
same rules on CPU with stand-in streams. Envs on their own streams must compute what they compute on
one stream: a missing `wait_stream` or `record_stream` shows up here as a batch read before it was
written, or overwritten while a side stream still reads it. Tolerances as in `tests/env/test_batched.py`
(float32 rounding compounded over a few epochs, far below a real difference).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from morphogen.cli import main
from morphogen.core.lifecycle import GateConfig, GateMode
from morphogen.core.slot import SlotConfig
from morphogen.data import Task, load_task
from morphogen.env.actions import Action, Op
from morphogen.env.episode import EpisodeConfig
from morphogen.env.vector import VectorEpisodes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

RTOL, ATOL = 1e-4, 1e-5
N_ENVS = 4
FIRST_ACTIONS = [Action(op=Op.GERMINATE, slot="r0c0", blueprint="conv_light"),
                 Action(op=Op.GERMINATE, slot="r0c1", blueprint="norm"),
                 Action(),
                 Action(op=Op.GERMINATE, slot="r0c0", blueprint="conv_light")]


@pytest.fixture(scope="module")
def digits_on_cuda() -> Task:
    return load_task("digits", device="cuda", max_train_samples=200)


def config(**changes: bool) -> EpisodeConfig:
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=1)
    return dataclasses.replace(EpisodeConfig(max_epochs=6, slots=SlotConfig(gates=gates, blend_epochs=2)), **changes)


def play(vector: VectorEpisodes, epochs: int) -> list[float]:
    """Germinate on the first step, then advance every seed; the validation accuracies of each step."""
    vector.reset(5)
    accuracies = []
    for epoch in range(epochs):
        actions = FIRST_ACTIONS if epoch == 0 else [
            Action(op=Op.ADVANCE, slot=first.slot) if first.op == Op.GERMINATE else Action() for first in FIRST_ACTIONS]
        results = vector.step(actions)
        if epoch < 2:  # germinated, then TRAINING -> BLENDING; later ADVANCEs wait for the alpha ramp
            assert all(result.action_succeeded for result in results), [result.reason for result in results]
        accuracies += [result.snapshot.val_accuracy for result in results]
    return accuracies


def assert_same_models(left: VectorEpisodes, right: VectorEpisodes) -> None:
    for one, other in zip(left.episodes, right.episodes, strict=True):
        theirs = other.model.state_dict()
        for name, tensor in one.model.state_dict().items():
            if not isinstance(tensor, torch.Tensor):  # a slot's extra state (its lifecycle), not a tensor
                continue
            assert tensor.device.type == "cuda", name
            torch.testing.assert_close(tensor, theirs[name], rtol=RTOL, atol=ATOL, msg=name)


def test_envs_on_their_own_streams_compute_what_one_stream_computes(digits_on_cuda: Task) -> None:
    on_streams = VectorEpisodes(digits_on_cuda, config(), N_ENVS, seed=3)
    one_stream = VectorEpisodes(digits_on_cuda, config(), N_ENVS, seed=3)
    assert on_streams.streams is not None and len(on_streams.streams) == N_ENVS
    one_stream.streams = None
    accuracies = play(on_streams, 4), play(one_stream, 4)
    assert accuracies[0] == pytest.approx(accuracies[1], abs=1.0)  # one image of 178 at most, on a float tie
    assert_same_models(on_streams, one_stream)


def test_batched_envs_on_cuda_compute_what_envs_one_by_one_compute(digits_on_cuda: Task) -> None:
    per_env = VectorEpisodes(digits_on_cuda, config(), N_ENVS, seed=3)
    batched = VectorEpisodes(digits_on_cuda, config(batch_identical=True), N_ENVS, seed=3)
    accuracies = play(per_env, 4), play(batched, 4)
    assert accuracies[0] == pytest.approx(accuracies[1], abs=1.0)
    assert_same_models(per_env, batched)


def test_run_on_cuda_writes_a_finite_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    code = main(["run", "--device", "cuda", "--epochs", "4", "--max-train-samples", "300", "--run-dir", str(run_dir)])
    _, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads((run_dir / "summary.json").read_text())
    for outcome in (summary["grown"], summary["baseline"]):
        assert 10.0 < outcome["final_accuracy"] <= 100.0  # above chance (10 classes) after 4 epochs
        assert outcome["flops"]["total"] > 0
