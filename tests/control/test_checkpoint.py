"""Checkpoints: atomic writes, `weights_only` reads, and one-line refusals of broken or mismatched files."""

from __future__ import annotations

import dataclasses
import errno
import io
import math
import os
import re
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import torch

from morphogen.control.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    check_layout,
    load_checkpoint,
    save_checkpoint,
)
from morphogen.control.integrity import state_checksum
from morphogen.control.trainer import PPOTrainer, TrainConfig
from morphogen.data import Task, load_task
from morphogen.run_directory import CHECKPOINT_NAME, DiskFullError
from morphogen.telemetry.config import TelemetryConfig

TEXT = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n" * 30





def tiny_config(**changes: Any) -> TrainConfig:
    base = TrainConfig(n_envs=2, rounds=2, hidden_size=16, max_train_samples=200,
                       telemetry=TelemetryConfig(level="off"))
    return dataclasses.replace(base, episode=dataclasses.replace(base.episode, max_epochs=3), **changes)


@pytest.fixture(scope="module")
def trainer(digits: Task) -> PPOTrainer:
    return PPOTrainer(tiny_config(), digits)


def file_state(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_save_then_load_round_trips_and_leaves_only_the_checkpoint(trainer: PPOTrainer, tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(trainer.state_dict(), path)
    save_checkpoint({**trainer.state_dict(), "round": 7}, path)  # replacing an existing checkpoint
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME], "no temporary file may be left behind"
    state = load_checkpoint(tmp_path)  # a run directory resolves to its checkpoint
    assert state["round"] == 7
    for name, tensor in trainer.state.agent.policy.state_dict().items():
        assert torch.equal(state["policy"][name], tensor), name


def test_saved_checkpoint_follows_the_umask(trainer: PPOTrainer, tmp_path: Path) -> None:
    umask = os.umask(0o022)
    os.umask(umask)
    save_checkpoint(trainer.state_dict(), tmp_path / CHECKPOINT_NAME)
    assert (tmp_path / CHECKPOINT_NAME).stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("failure", [OSError("No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "interrupted"])
def test_failed_write_keeps_the_previous_checkpoint(trainer: PPOTrainer, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    failure: BaseException) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint({**trainer.state_dict(), "round": 1}, path)
    before = file_state(tmp_path)
    real_save = torch.save

    def save_half_then_fail(obj: object, handle: BinaryIO, *args: Any, **kwargs: Any) -> None:
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        handle.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise failure

    monkeypatch.setattr(torch, "save", save_half_then_fail)
    with pytest.raises(type(failure)):
        save_checkpoint({**trainer.state_dict(), "round": 2}, path)
    monkeypatch.undo()
    assert file_state(tmp_path) == before, "the previous checkpoint must be intact and no temporary file left"
    assert load_checkpoint(path)["round"] == 1


class _WritesAFileWhenUnpickled:
    """Unpickling this calls `open(marker, "w")`: what a malicious checkpoint could do with any callable."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_checkpoint_is_read_with_weights_only(trainer: PPOTrainer, tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    path = tmp_path / CHECKPOINT_NAME
    # Every required key is present, so only weights_only=True stands between this file and running code.
    save_checkpoint({**trainer.state_dict(), "extra": _WritesAFileWhenUnpickled(marker)}, path)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert not marker.exists(), "loading a checkpoint must never run code stored in it"
    message = str(caught.value)
    assert "\n" not in message and "\x1b" not in message
    assert "refused" in message and "open" in message and str(path) in message


@pytest.mark.parametrize("corruption", ["cut-in-half", "empty", "text"])
def test_broken_file_is_a_one_line_checkpoint_error(trainer: PPOTrainer, tmp_path: Path, corruption: str) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(trainer.state_dict(), path)
    data = path.read_bytes()
    broken = {"cut-in-half": data[: len(data) // 2], "empty": b"", "text": b"hello, world\n"}[corruption]
    path.write_bytes(broken)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert "\n" not in message and "\x1b" not in message
    assert message.startswith(f"checkpoint {path} is unreadable (truncated or corrupt?): ")


def test_missing_file_and_foreign_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no checkpoint at .*expected a run directory with checkpoint\.pt"):
        load_checkpoint(tmp_path)
    foreign = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(3)}, foreign)
    with pytest.raises(CheckpointError, match=f"is not a morphogen checkpoint of format {FORMAT_VERSION}"):
        load_checkpoint(foreign)


def test_checkpoint_missing_a_field_names_it(trainer: PPOTrainer, tmp_path: Path) -> None:
    state = trainer.state_dict()
    del state["optimizer"], state["rng"]
    save_checkpoint(state, tmp_path / CHECKPOINT_NAME)
    with pytest.raises(CheckpointError, match=r"lacks optimizer, rng$"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("hidden_size", 4_000_000, "hidden_size must be <= 4,096 (a documented limit of morphogen.limits), got 4,000,000"),
    ("hidden_size", "16", "hidden_size is not int"),
    ("round", -1, "round must be >= 0, got -1"),
    ("policy", 5, "policy is not dict"),
    ("observation_normalizer", [1.0], "observation_normalizer is not dict"),
    ("config", "[1]", "config is not the JSON text of a config table"),
    ("config", 5, "config is not str"),
    ("imitated", 1, "imitated is not bool"),
])
def test_a_checkpoint_not_written_by_morphogen_is_refused_before_anything_is_built(
        trainer: PPOTrainer, tmp_path: Path, key: str, value: object, message: str) -> None:
    """A whole, checksummed file of the right format whose entries are not what `save_checkpoint` writes (another
    program wrote it): one line, before a policy of its width is allocated or its config read."""
    save_checkpoint({**trainer.state_dict(), key: value}, tmp_path / CHECKPOINT_NAME)
    with pytest.raises(CheckpointError, match="^" + re.escape(f"checkpoint {tmp_path / CHECKPOINT_NAME} is not one "
                                                              f"morphogen wrote: {message}") + "$"):
        load_checkpoint(tmp_path)


def test_check_layout_names_the_first_differing_field() -> None:
    saved = {"hidden_size": 16, "slot_ids": ["r0c0", "r0c1"]}
    # Lists (as stored) and tuples (as built) of the same ids are the same layout.
    check_layout(saved, {"hidden_size": 16, "slot_ids": ("r0c0", "r0c1")}, "ck")
    with pytest.raises(CheckpointError, match=r"^checkpoint ck was built for hidden_size=16, but this run has "
                                              r"hidden_size=32$"):
        check_layout(saved, {"hidden_size": 32}, "ck")


def test_a_checkpoint_of_a_policy_of_another_width_is_refused_before_anything_changes(digits: Task,
                                                                                      tmp_path: Path) -> None:
    narrow = PPOTrainer(tiny_config(hidden_size=8), digits)
    save_checkpoint(narrow.state_dict(), tmp_path / CHECKPOINT_NAME)
    wide = PPOTrainer(tiny_config(), digits)
    before = {k: v.clone() for k, v in wide.state.agent.policy.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"was built for hidden_size=8, but this run has hidden_size=16"):
        wide.load_state_dict(load_checkpoint(tmp_path), tmp_path)
    after = wide.state.agent.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert wide.state.next_round == 0


def test_a_checkpoint_of_another_task_and_slot_layout_resumes(digits: Task, tmp_path: Path) -> None:
    """The policy's weights do not depend on the task or the slots: a run on text continues from a digits one."""
    text_file = tmp_path / "corpus.txt"
    text_file.write_text(TEXT)
    text = load_task("text", text_file=text_file)
    digits_trainer = PPOTrainer(tiny_config(slots=("r0c1",)), digits)
    save_checkpoint(digits_trainer.state_dict(), tmp_path / CHECKPOINT_NAME)
    text_trainer = PPOTrainer(tiny_config(task="text", text_file=str(text_file)), text)
    text_trainer.load_state_dict(load_checkpoint(tmp_path), tmp_path)
    for name, tensor in digits_trainer.state.agent.policy.state_dict().items():
        assert torch.equal(text_trainer.state.agent.policy.state_dict()[name], tensor), name


@pytest.mark.parametrize("version", [1, 2])
def test_a_checkpoint_of_an_earlier_format_is_refused_in_one_line(trainer: PPOTrainer, tmp_path: Path,
                                                                  version: int) -> None:
    path = tmp_path / CHECKPOINT_NAME
    torch.save({"format_version": version, **trainer.state_dict()}, path)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert str(caught.value) == (f"checkpoint {path} is of format {version}, from an earlier morphogen whose policy "
                                 "was tied to one task and slot layout; train a new one (morphogen train) or use "
                                 "--policy default")


@pytest.mark.parametrize(("version", "unread"), [(3, "growth signals"), (4, "advice from the heuristic")])
def test_a_policy_that_read_fewer_inputs_is_refused_in_one_line(trainer: PPOTrainer, tmp_path: Path, version: int,
                                                               unread: str) -> None:
    path = tmp_path / CHECKPOINT_NAME
    torch.save({"format_version": version, **trainer.state_dict()}, path)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert str(caught.value) == (f"checkpoint {path} is of format {version}, from an earlier morphogen whose policy "
                                 f"read no {unread}; train a new one (morphogen train) or use --policy default")


# ------------------------------------------------------------------ integrity: checksum and finiteness


def test_checkpoint_carries_a_checksum_of_everything(trainer: PPOTrainer, tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(trainer.state_dict(), path)
    raw = torch.load(path, weights_only=True)
    assert raw["format_version"] == FORMAT_VERSION
    assert raw.pop("checksum") == state_checksum(raw)
    assert "checksum" not in load_checkpoint(path), "the checksum is checked and dropped on load"


def test_one_changed_weight_is_refused_as_damaged(trainer: PPOTrainer, tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(trainer.state_dict(), path)
    raw = torch.load(path, weights_only=True)
    name = next(key for key, tensor in raw["policy"].items() if tensor.is_floating_point())
    raw["policy"][name].view(-1)[0] = 1.29e29  # what 64 flipped bytes did to one weight
    torch.save(raw, path)  # the stored checksum is now stale
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert str(caught.value) == (f"checkpoint {path} is damaged: its contents do not match the checksum saved "
                                 "with them (a disk or copy error?); use an intact copy of the run")


def test_flipped_bytes_are_refused_in_one_line_or_change_nothing(trainer: PPOTrainer, tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(trainer.state_dict(), path)
    data = bytearray(path.read_bytes())
    intact = load_checkpoint(path)
    refused = 0
    for start in range(0, len(data) - 64, len(data) // 7):
        broken = bytearray(data)
        broken[start:start + 64] = bytes(b ^ 0xFF for b in broken[start:start + 64])
        path.write_bytes(bytes(broken))
        try:
            loaded = load_checkpoint(path)
        except CheckpointError as error:
            assert "\n" not in str(error) and str(path) in str(error), start
            refused += 1
        else:  # the flip hit bytes the zip format ignores (alignment padding): what loads must be the original
            assert state_checksum(loaded) == state_checksum(intact), start
    assert refused >= 6


def test_non_finite_state_is_never_saved_and_never_loaded(trainer: PPOTrainer, tmp_path: Path) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint({**trainer.state_dict(), "round": 1}, path)
    before = path.read_bytes()
    state = trainer.state_dict()
    name = next(key for key, tensor in state["policy"].items() if tensor.is_floating_point())
    state["policy"] = {**state["policy"], name: torch.full_like(state["policy"][name], math.nan)}
    with pytest.raises(CheckpointError, match=rf"refusing to save .*: non-finite values in policy\.{name}; the "
                                              "previous checkpoint stays the latest"):
        save_checkpoint(state, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]

    # Written behind save_checkpoint's back, with a valid checksum: the finiteness check alone refuses it.
    payload = {"format_version": FORMAT_VERSION, **state}
    payload["checksum"] = state_checksum(payload)
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=rf"^checkpoint {path} holds non-finite values in policy\.{name}; "):
        load_checkpoint(path)


def test_disk_full_during_a_checkpoint_keeps_the_previous_one(trainer: PPOTrainer, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint({**trainer.state_dict(), "round": 1}, path)
    before = file_state(tmp_path)

    def no_space(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(DiskFullError, match=rf"^no space left to write {path}: it needs [0-9,]+ bytes"):
        save_checkpoint({**trainer.state_dict(), "round": 2}, path)
    monkeypatch.undo()
    assert file_state(tmp_path) == before
