"""`morphogen train --devices`: one process, envs spread over devices, the same run as on one device.

The only device here is the CPU: `--devices cpu,cpu` runs the whole multi-device path (placement, per
device tasks and batches, per-device synchronize) end to end and must give bitwise the policy of
`--device cpu`. Placement on a genuinely different device is tested with `meta` in
tests/env/test_placement.py. Backend choice with `--distributed` is checked up to the process group's
creation, which is replaced here (no NCCL on this machine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from morphogen.cli import EXIT_USER_ERROR, main
from morphogen.commands.evaluate import read_policy_run
from morphogen.config import build_config
from morphogen.control.checkpoint import load_checkpoint
from morphogen.control.distributed import DistributedSetupError, choose_backend, nccl_device_index
from morphogen.control.trainer import TrainConfig

TINY = ["--envs", "3", "--episode-length", "2", "--max-train-samples", "100", "--hidden-size", "16",
        "--telemetry", "minimal"]


def policy_of(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir)["policy"]  # type: ignore[no-any-return]


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_devices_cpu_cpu_trains_and_resumes_bitwise_like_device_cpu(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    spread, single = tmp_path / "spread", tmp_path / "single"
    assert main(["train", "--rounds", "2", *TINY, "--devices", "cpu,cpu", "--run-dir", str(spread)]) == 0
    out = capsys.readouterr().out
    assert "devices cpu,cpu (policy on cpu)" in out
    assert json.loads((spread / "config.json").read_text())["devices"] == ["cpu", "cpu"]
    assert main(["train", "--rounds", "2", *TINY, "--device", "cpu", "--run-dir", str(single)]) == 0
    assert_bitwise_equal(policy_of(spread), policy_of(single))
    # Where the envs run is not part of what they compute: each run resumes on the other's placement.
    assert main(["train", "--resume", str(spread), "--rounds", "3", "--device", "cpu"]) == 0
    assert main(["train", "--resume", str(single), "--rounds", "3", "--devices", "cpu,cpu"]) == 0
    assert "devices cpu,cpu (policy on cpu)" in capsys.readouterr().out
    assert load_checkpoint(spread)["round"] == 3
    assert_bitwise_equal(policy_of(spread), policy_of(single))
    # A policy trained with --devices plays (run --policy, eval) on the device those commands are given.
    trained, _ = read_policy_run(tmp_path / "spread", "cpu")
    assert trained.devices is None and trained.device == "cpu"


@pytest.mark.parametrize(("devices", "message"), [
    ("gpu,cpu", "devices: 'gpu' is not a device morphogen trains on"),
    ("cpu,meta", "devices: 'meta' is not a device morphogen trains on"),
    ("cpu,,cpu", "--devices needs comma-separated device names without empty ones"),
    ("cuda:x", "devices: 'cuda:x' is not a device morphogen trains on"),
])
def test_a_bad_device_list_is_one_line_and_exit_2(devices: str, message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *TINY, "--devices", devices, "--run-dir", str(tmp_path / "run")]) == EXIT_USER_ERROR
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and message in error
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_a_cuda_device_on_a_machine_without_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *TINY, "--devices", "cpu,cuda:1"]) == EXIT_USER_ERROR
    assert "devices: 'cuda:1' requested but CUDA is not available here" in capsys.readouterr().err


def test_device_and_devices_together_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *TINY, "--device", "cpu", "--devices", "cpu,cpu"]) == EXIT_USER_ERROR
    assert "--device and --devices both say where to run" in capsys.readouterr().err
    config_file = tmp_path / "train.toml"
    config_file.write_text('device = "mps"\ndevices = ["cpu", "cpu"]\n')
    assert main(["train", "--config", str(config_file), *TINY]) == EXIT_USER_ERROR
    assert "device: must be left out (or be cpu, the first of devices) when devices is set, got mps" in \
        capsys.readouterr().err


def test_devices_is_a_config_file_key_and_sets_the_policy_device() -> None:
    config = build_config(TrainConfig, {"devices": ["cuda:1", "cuda:0"]})
    assert config.devices == ("cuda:1", "cuda:0") and config.policy_device == "cuda:1"
    assert build_config(TrainConfig, {"device": "mps"}).policy_device == "mps"
    with pytest.raises(ValueError, match="devices must name at least one device"):
        TrainConfig(devices=())


# ---------------------------------------------------------------- collective backend


def test_backend_follows_the_policy_device_unless_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_backend("cpu") == "gloo"
    assert choose_backend("cuda") == "nccl" and choose_backend("cuda:1") == "nccl"
    assert choose_backend("mps") == "gloo"
    assert choose_backend("cuda:0", "gloo") == "gloo" and choose_backend("cpu", "nccl") == "nccl"
    with pytest.raises(DistributedSetupError, match="--dist-backend must be one of gloo, nccl"):
        choose_backend("cpu", "mpi")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert choose_backend("auto") == "nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_backend("auto") == "gloo"
    # NCCL runs on the policy's CUDA device; a bare `cuda` means the rank's own (torchrun's LOCAL_RANK).
    assert nccl_device_index("cuda:1", 3) == 1 and nccl_device_index("cuda", 3) == 3
    assert nccl_device_index("auto", 2) == 2 and nccl_device_index("cpu", 2) == 2


class ProcessGroupCreated(DistributedSetupError):
    """Raised by the stand-in `init_process_group` to stop the command once the backend is known."""


@pytest.mark.parametrize(("arguments", "backend", "cuda_device"), [
    (["--device", "cpu"], "gloo", None),
    (["--devices", "cpu,cpu"], "gloo", None),
    (["--device", "cuda"], "nccl", 1),
    (["--devices", "cuda:1,cuda:0"], "nccl", 1),
    (["--devices", "cuda:0,cuda:1", "--dist-backend", "gloo"], "gloo", None),
    (["--device", "cpu", "--dist-backend", "nccl"], "nccl", 1),
])
def test_train_distributed_picks_the_backend_from_the_device_flags(
        arguments: list[str], backend: str, cuda_device: int | None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    seen: dict[str, Any] = {}

    def create(chosen: str, **_: Any) -> None:
        seen["backend"] = chosen
        raise ProcessGroupCreated(f"process group with {chosen}")

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", create)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: seen.setdefault("cuda_device", index))
    assert main(["train", "--distributed", *TINY, "--envs", "4", *arguments]) == EXIT_USER_ERROR
    assert f"process group with {backend}" in capsys.readouterr().err
    assert seen["backend"] == backend
    assert seen.get("cuda_device") == cuda_device
