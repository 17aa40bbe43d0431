"""Distributed PPO (control/distributed.py): moment merging, env splitting, and real 2-process gloo runs.

The multi-process tests start ranks as subprocesses with the variables torchrun sets (one test goes
through torchrun itself), each with a timeout, and kill whatever is left in a `finally`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from morphogen.cli import EXIT_PEER_LOST, EXIT_USER_ERROR, main, saved_policy_device
from morphogen.control.checkpoint import load_checkpoint
from morphogen.control.distributed import (
    DistributedSetupError,
    choose_backend,
    combine_moments,
    format_rank_times,
    rank_device,
    split_envs,
)
from morphogen.run_directory import CHECKPOINT_NAME, EVENTS_FILENAME
from morphogen.telemetry.events import PPOUpdateCompleted, RankTimes
from morphogen.telemetry.sinks import read_events

SRC = Path(__file__).resolve().parents[2] / "src"
WORKER = Path(__file__).with_name("distributed_worker.py")
TINY = ["--envs", "4", "--episode-length", "2", "--max-train-samples", "100", "--hidden-size", "16",
        "--telemetry", "minimal"]
#: Seconds any launched rank may run before the test kills it and fails.
RANK_TIMEOUT = 240
#: The 2-rank policy equals the 1-process one up to float32 summation order (gradient mean of two
#: half-means instead of one mean, moments merged from two halves); measured ~3e-8 after 2 rounds, and
#: 2.9e-6 once the untrained policy could pick `conv_wide` (larger seeds, other episodes).
EQUIVALENCE_TOLERANCE = 1e-5
#: A killed rank must make the survivor exit within this many seconds (gloo fails at the next collective).
PEER_LOSS_DEADLINE = 60


def test_combine_moments_equals_the_moments_of_the_concatenation() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(n, 3)) * (k + 1) + k for k, n in enumerate((5, 2, 9))]
    counts = torch.tensor([float(len(b)) for b in batches], dtype=torch.float64)
    means = torch.tensor(np.stack([b.mean(0) for b in batches]))
    variances = torch.tensor(np.stack([b.var(0) for b in batches]))
    count, mean, var = combine_moments(counts, means, variances)
    union = np.concatenate(batches)
    assert float(count) == len(union)
    np.testing.assert_allclose(mean.numpy(), union.mean(0), rtol=1e-12)
    np.testing.assert_allclose(var.numpy(), union.var(0), rtol=1e-12)


def test_the_rank_line_names_the_rank_with_the_most_own_work() -> None:
    # Rank 1 collected as long as rank 0 but waited less for the others: it did the most work itself.
    times = RankTimes(epoch=2, env_id=-1, round=1, collect_seconds=(4.0, 4.0, 3.5),
                      collect_wait_seconds=(1.0, 0.25, 1.5), update_seconds=(0.5, 0.5, 0.5),
                      all_reduce_seconds=(0.125, 0.5, 0.25))
    line = format_rank_times(times)
    assert "collect work 2.00..3.75s, slowest rank 1" in line
    assert "waiting 0.25..1.50s" in line and "all-reduce 0.12..0.50s" in line


def test_envs_split_evenly_over_ranks_or_are_refused() -> None:
    assert [split_envs(6, 3, r) for r in range(3)] == [(0, 2), (2, 2), (4, 2)]
    with pytest.raises(DistributedSetupError, match=r"envs \(5\) must be a multiple of the number of ranks \(2\)"):
        split_envs(5, 2, 0)


def test_backend_follows_the_device_unless_overridden() -> None:
    assert choose_backend("cpu") == "gloo"
    assert choose_backend("cuda:1") == "nccl"
    assert choose_backend("cuda:0", "gloo") == "gloo"
    assert rank_device("cuda", 3) == "cuda:3" and rank_device("cpu", 3) == "cpu"


def test_a_resumed_run_picks_the_backend_of_the_device_it_was_saved_on(tmp_path: Path) -> None:
    """`--resume --distributed` without --device keeps the saved policy device, so a CUDA run stays on NCCL."""
    for saved, expected in (({"device": "cuda:0"}, "cuda:0"), ({"device": "cpu", "devices": ["cuda:1", "cuda:0"]},
                                                                "cuda:1"), ({"device": "cpu"}, "cpu")):
        (tmp_path / "config.json").write_text(json.dumps(saved))
        assert saved_policy_device(str(tmp_path)) == expected
    assert choose_backend(saved_policy_device(str(tmp_path / "missing"))) == "gloo"  # the resume reports it
    (tmp_path / "config.json").write_text(json.dumps({"device": "cuda"}))
    assert choose_backend(saved_policy_device(str(tmp_path))) == "nccl"


def test_distributed_outside_torchrun_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["train", "--distributed", *TINY]) == EXIT_USER_ERROR
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "launch with torchrun --nproc-per-node N" in error
    assert main(["train", "--dist-timeout", "5", *TINY]) == EXIT_USER_ERROR
    assert "add --distributed" in capsys.readouterr().err


# ---------------------------------------------------------------- launching ranks


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _environment(**extra: str) -> dict[str, str]:
    # Prepended, not replaced: packages a machine provides through PYTHONPATH must reach the ranks too.
    python_path = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": python_path, "OMP_NUM_THREADS": "1", **extra}


@contextmanager
def ranks(commands: Sequence[Sequence[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    """Start one process per command as ranks 0..N-1 of one group (the variables torchrun sets); kill leftovers."""
    port = str(_free_port())
    processes: list[subprocess.Popen[str]] = []
    try:
        for rank, command in enumerate(commands):
            env = _environment(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(len(commands)),
                               MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            processes.append(subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.communicate()


def train_ranks(n: int, arguments: Sequence[str]) -> list[tuple[int, str, str]]:
    """Run `morphogen train --distributed ARGUMENTS` on `n` ranks; (exit code, stdout, stderr) of each."""
    command = [sys.executable, "-m", "morphogen", "train", "--distributed", "--dist-timeout", "60", *arguments]
    with ranks([command] * n) as processes:
        results = []
        for process in processes:
            out, err = process.communicate(timeout=RANK_TIMEOUT)
            results.append((process.returncode, out, err))
    for code, _, err in results:
        assert code == 0, err
    return results


def policy_of(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir)["policy"]  # type: ignore[no-any-return]


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


# ---------------------------------------------------------------- 2 processes, gloo


@pytest.mark.slow
def test_policy_parameters_are_bit_identical_on_all_ranks_after_every_update(tmp_path: Path) -> None:
    command = [sys.executable, str(WORKER), str(tmp_path), "3"]
    with ranks([command, command]) as processes:
        for process in processes:
            _, err = process.communicate(timeout=RANK_TIMEOUT)
            assert process.returncode == 0, err
    rank0 = (tmp_path / "rank0.txt").read_text().split()
    rank1 = (tmp_path / "rank1.txt").read_text().split()
    assert len(rank0) == 3 and rank0 == rank1
    assert len(set(rank0)) == 3  # the policy did change every round


@pytest.mark.slow
def test_two_ranks_of_two_envs_equal_one_process_of_four_and_resume_on_one_or_two_ranks(tmp_path: Path) -> None:
    """Through torchrun itself: 2 ranks x 2 envs vs 1 process x 4 envs, then resumes on 1 and 2 ranks."""
    distributed, single = tmp_path / "distributed", tmp_path / "single"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "-m", "morphogen", "train", "--distributed", "--rounds", "1", *TINY, "--run-dir", str(distributed)]
    finished = subprocess.run(torchrun, env=_environment(), capture_output=True, text=True, timeout=RANK_TIMEOUT)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.count("round   1") == 1  # rank 0 alone prints
    assert "4 envs on 2 ranks (gloo)" in finished.stdout
    assert "ranks: collect work" in finished.stdout and "slowest rank" in finished.stdout
    rank_times = [e for e in read_events(distributed / EVENTS_FILENAME) if isinstance(e, RankTimes)]
    assert [e.round for e in rank_times] == [1]
    assert len(rank_times[0].collect_seconds) == len(rank_times[0].all_reduce_seconds) == 2
    assert all(0 <= wait <= collect for wait, collect in zip(rank_times[0].collect_wait_seconds,
                                                             rank_times[0].collect_seconds, strict=True))
    assert main(["train", "--rounds", "1", *TINY, "--run-dir", str(single)]) == 0
    assert max_difference(policy_of(distributed), policy_of(single)) <= EQUIVALENCE_TOLERANCE
    saved = load_checkpoint(distributed)
    assert tuple(saved["reward_normalizer"]["returns"].shape) == (4,)  # the layout one process of 4 envs writes

    on_two, on_one = tmp_path / "on_two", tmp_path / "on_one"
    for copy in (on_two, on_one):
        copy.mkdir()
        for name in ("checkpoint.pt", "config.json", "events.jsonl"):
            (copy / name).write_bytes((distributed / name).read_bytes())
    train_ranks(2, ["--resume", str(on_two), "--rounds", "2", "--devices", "cpu,cpu"])  # --devices on every rank
    train_ranks(1, ["--resume", str(on_one), "--rounds", "2"])
    assert main(["train", "--resume", str(single), "--rounds", "2"]) == 0
    assert load_checkpoint(on_two)["round"] == load_checkpoint(on_one)["round"] == 2
    reference = policy_of(single)
    assert max_difference(policy_of(on_two), reference) <= EQUIVALENCE_TOLERANCE
    assert max_difference(policy_of(on_one), reference) <= EQUIVALENCE_TOLERANCE


@pytest.mark.slow
def test_two_ranks_equal_one_process_with_two_minibatches(tmp_path: Path) -> None:
    """Minibatches group the global envs on every rank as one process groups them (`ppo_update`)."""
    config_file = tmp_path / "train.toml"
    # Ratio thresholds next to 1: every update reports a ratio explosion or collapse, so that who prints shows.
    config_file.write_text("[ppo]\nminibatches = 2\n[telemetry]\nratio_explosion = 1.000001\n"
                           "ratio_collapse = 0.999999\n")
    distributed, single = tmp_path / "distributed", tmp_path / "single"
    normal = [*TINY[:-1], "normal"]  # PPO statistics are written from level normal on
    (_, _, rank0_err), (_, _, rank1_err) = train_ranks(
        2, ["--config", str(config_file), "--rounds", "2", *normal, "--run-dir", str(distributed)])
    assert "anomaly ratio_" in rank0_err and "anomaly" not in rank1_err, "rank 0 alone prints anomalies"
    assert main(["train", "--config", str(config_file), "--rounds", "2", *normal, "--run-dir", str(single)]) == 0
    assert max_difference(policy_of(distributed), policy_of(single)) <= EQUIVALENCE_TOLERANCE
    # The run's PPO statistics are the whole update's, not rank 0's share of it.
    updates = [[e for e in read_events(run / EVENTS_FILENAME) if isinstance(e, PPOUpdateCompleted)]
               for run in (distributed, single)]
    assert len(updates[0]) == len(updates[1]) == 2
    for spread, one in zip(*updates, strict=True):
        for name in ("policy_loss", "value_loss", "entropy_loss", "approx_kl", "explained_variance", "grad_norm",
                     "epochs_completed", "early_stopped"):
            assert getattr(spread, name) == pytest.approx(getattr(one, name), rel=1e-4, abs=1e-6), name
        assert spread.clip_fraction == pytest.approx(one.clip_fraction, rel=1e-4, abs=1e-6)
        for (head, entropy), (_, reference) in zip(spread.entropy_per_head, one.entropy_per_head, strict=True):
            assert entropy == pytest.approx(reference, rel=1e-4, abs=1e-6), head


@pytest.mark.slow
def test_a_killed_rank_makes_the_other_exit_with_a_clear_error_and_the_checkpoint_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "morphogen", "train", "--distributed", "--dist-timeout", "30",
               "--rounds", "50", *TINY, "--run-dir", str(run_dir)]
    with ranks([command, command]) as (rank0, rank1):
        deadline = time.monotonic() + RANK_TIMEOUT
        while not (run_dir / CHECKPOINT_NAME).is_file():
            assert rank0.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.2)
        rank1.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = rank0.communicate(timeout=PEER_LOSS_DEADLINE)
        assert time.monotonic() - killed_at < PEER_LOSS_DEADLINE
    assert rank0.returncode == EXIT_PEER_LOST
    line = err.strip().splitlines()[-1]
    assert line.startswith("morphogen train: error: rank 0 of 2 lost the other ranks during")
    state = load_checkpoint(run_dir)  # intact: checksum and finiteness verified
    train_ranks(1, ["--resume", str(run_dir), "--rounds", str(int(state["round"]) + 1)])
    assert load_checkpoint(run_dir)["round"] == int(state["round"]) + 1


def _rank_pids(launcher: int) -> dict[int, int]:
    """{rank: pid} of the processes `launcher` (torchrun) started, read from their environment."""
    found = {}
    for task in Path(f"/proc/{launcher}/task").iterdir():
        for child in (task / "children").read_text().split():
            environment = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            rank = next((item[5:] for item in environment if item.startswith(b"RANK=")), None)
            if rank is not None:
                found[int(rank)] = int(child)
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds torchrun's ranks through /proc")
def test_under_torchrun_a_killed_rank_leaves_one_line_and_exit_4_on_the_survivor(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "-m", "morphogen", "train", "--distributed", "--rounds", "50", *TINY, "--run-dir", str(run_dir)]
    launcher = subprocess.Popen(torchrun, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        deadline = time.monotonic() + RANK_TIMEOUT
        while not (run_dir / CHECKPOINT_NAME).is_file():
            assert launcher.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.2)
        os.kill(_rank_pids(launcher.pid)[1], signal.SIGKILL)
        _, err = launcher.communicate(timeout=PEER_LOSS_DEADLINE)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    ours = [line for line in err.splitlines() if line.startswith("morphogen train: ")]
    assert len(ours) == 1, err
    assert ours[0].startswith("morphogen train: error: rank 0 of 2 "), ours
    assert "Traceback" not in err.split(ours[0])[0], "the survivor printed no traceback of its own"
    assert re.search(r"rank +: 0 \(local_rank: 0\)\n +exitcode +: 4 ", err), "torchrun's summary: rank 0 exited 4"
    load_checkpoint(run_dir)  # intact: checksum and finiteness verified
