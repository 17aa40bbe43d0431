"""`Grower(distributed=True)`: processes that each train a share of every batch grow one model, in step.

Two gloo processes (subprocesses, each with a timeout) grow the same MLP on halves of every batch and of the
validation data; they must end with the same model and the same growth, and match one process that trains on
whole batches and validates on all the data, up to float32 summation order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from grower_rank import train

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
#: Seconds a rank may run before the test kills it and fails.
RANK_TIMEOUT = 180
#: Two half-batch gradients averaged against one whole-batch gradient: float32 summation order apart.
TOLERANCE = 1e-5


def test_two_processes_grow_one_model_as_one_process_grows_it_on_whole_batches(tmp_path: Path) -> None:
    python_path = os.pathsep.join(filter(None, [str(SRC), str(HERE), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": python_path}
    init_file = tmp_path / "rendezvous"
    ranks = [subprocess.Popen([sys.executable, str(HERE / "grower_rank.py"), str(tmp_path), str(rank), "2",
                               str(init_file)], env=environment, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    try:
        for process in ranks:
            _, errors = process.communicate(timeout=RANK_TIMEOUT)
            assert process.returncode == 0, errors[-3000:]
    finally:
        for process in ranks:
            process.kill()
    first, second = (torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2))
    alone = train(0, 1, distributed=False)
    assert first["actions"] == second["actions"] and first["stages"] == second["stages"]
    assert any(stage != "dormant" for stage in first["stages"].values()), "nothing grew: the test shows nothing"
    assert first["state"].keys() == second["state"].keys() == alone["state"].keys()
    for key, value in first["state"].items():
        assert torch.equal(value, second["state"][key]), key  # the processes hold one model
        torch.testing.assert_close(value, alone["state"][key], rtol=0, atol=TOLERANCE)
    assert [a[:2] for a in first["actions"]] == [a[:2] for a in alone["actions"]]
    for (_, _, score, loss), (_, _, alone_score, alone_loss) in zip(first["actions"], alone["actions"], strict=True):
        assert score == pytest.approx(alone_score) and loss == pytest.approx(alone_loss, abs=TOLERANCE)


def test_without_a_process_group_distributed_is_one_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"needs torch.distributed.init_process_group\(...\) first"):
        train(0, 1, distributed=True)
