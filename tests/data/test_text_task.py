"""The text task: character vocabulary, next-character windows, positional 90/10 split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from morphogen.data import DataError, Task, decode_characters, load_task

BLOCK_SIZE = 64


@pytest.fixture(scope="module")
def corpus_and_task(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Task]:
    lines = [
        f"line {index}: the quick brown fox jumps over the lazy dog ({index * 7 % 13})\n"
        for index in range(120)
    ]
    text = "".join(lines) + "ünïcödé ✓\n"
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return text, load_task("text", text_file=path)


def test_vocabulary_and_preset(corpus_and_task: tuple[str, Task]) -> None:
    text, task = corpus_and_task
    assert task.vocabulary == tuple(sorted(set(text)))
    assert task.topology == "transformer" and task.objective == "language_model"
    assert task.host_kwargs == {
        "vocab_size": len(set(text)),
        "d_model": 32,
        "n_heads": 4,
        "n_layers": 2,
        "block_size": 64,
        "n_segments": 2,
    }
    assert task.batch_size == 32 and task.augment is None


def test_windows_follow_the_text_with_targets_shifted_by_one(corpus_and_task: tuple[str, Task]) -> None:
    text, task = corpus_and_task
    assert task.vocabulary is not None
    cut = int(len(text) * 0.9)
    train_text, validation_text = text[:cut], text[cut:]
    assert task.train.inputs.shape == ((len(train_text) - 1) // BLOCK_SIZE, BLOCK_SIZE)
    assert task.validation.inputs.shape == ((len(validation_text) - 1) // BLOCK_SIZE, BLOCK_SIZE)
    for dataset, source in ((task.train, train_text), (task.validation, validation_text)):
        assert dataset.inputs.dtype == torch.long and dataset.targets.dtype == torch.long
        assert dataset.targets.shape == dataset.inputs.shape
        for window in range(len(dataset)):
            start = window * BLOCK_SIZE
            inputs_text = decode_characters(dataset.inputs[window], task.vocabulary)
            targets_text = decode_characters(dataset.targets[window], task.vocabulary)
            assert inputs_text == source[start : start + BLOCK_SIZE]
            assert targets_text == source[start + 1 : start + 1 + BLOCK_SIZE]


def test_cap_keeps_whole_windows(corpus_and_task: tuple[str, Task], tmp_path: Path) -> None:
    text, task = corpus_and_task
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    capped = load_task("text", text_file=path, max_train_samples=5, seed=3)
    assert capped.train.inputs.shape == (5, BLOCK_SIZE)
    assert torch.equal(capped.train.targets[:, :-1], capped.train.inputs[:, 1:])
    full_windows = {tuple(row) for row in task.train.inputs.tolist()}
    assert all(tuple(row) in full_windows for row in capped.train.inputs.tolist())
    assert torch.equal(capped.validation.inputs, task.validation.inputs)


def test_default_corpus_is_stdlib_python_and_deterministic() -> None:
    first = load_task("text", max_train_samples=50)
    again = load_task("text", max_train_samples=50)
    assert len(first.train) == 50 and len(first.validation) > 100
    assert first.vocabulary == again.vocabulary and first.vocabulary is not None
    assert {"d", "e", "f", ":", "(", ")", "\n"} <= set(first.vocabulary)
    assert first.host_kwargs["vocab_size"] == len(first.vocabulary)
    assert torch.equal(first.train.inputs, again.train.inputs)
    assert torch.equal(first.validation.inputs, again.validation.inputs)


def test_missing_too_short_or_non_utf8_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"absent\.txt does not exist"):
        load_task("text", text_file=tmp_path / "absent.txt")
    short = tmp_path / "short.txt"
    short.write_text("x" * 200, encoding="utf-8")
    with pytest.raises(DataError, match="at least 65 characters"):
        load_task("text", text_file=short)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00bad" * 100)
    with pytest.raises(DataError, match="not valid UTF-8"):
        load_task("text", text_file=binary)
