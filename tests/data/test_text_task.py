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
    with pytest.raises(DataError, match="fewer than the 65 of one window"):
        load_task("text", text_file=short)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00bad" * 100)
    with pytest.raises(DataError, match="not valid UTF-8"):
        load_task("text", text_file=binary)


@pytest.mark.parametrize(("characters", "message"), [
    (0, r"short\.txt holds 0 characters: the validation split \(its last 10%\) gets 0, fewer than the 65 of one "
        r"window \(host\.block_size 64 \+ 1\); give a text of at least 6\d\d characters, or a smaller "
        r"host\.block_size$"),
    (300, r"short\.txt holds 300 characters: the validation split \(its last 10%\) gets 30, fewer than the 65"),
])
def test_a_text_too_short_for_its_splits_says_how_long_it_must_be(tmp_path: Path, characters: int,
                                                                   message: str) -> None:
    """The whole file's length, the split it leaves short and the length that would do, rather than the length
    of a split the user never sees."""
    short = tmp_path / "short.txt"
    short.write_text("abc" * (characters // 3), encoding="utf-8")
    with pytest.raises(DataError, match=message):
        load_task("text", text_file=short)


def test_the_shortest_text_the_message_asks_for_loads(tmp_path: Path) -> None:
    """The length the too-short message names is enough for both splits (and one less is not)."""
    short = tmp_path / "short.txt"
    short.write_text("x", encoding="utf-8")
    with pytest.raises(DataError, match=r"at least (\d+) characters") as caught:
        load_task("text", text_file=short, host={"block_size": 8})
    needed = int(caught.value.args[0].split("at least ")[1].split()[0])
    short.write_text("ab" * (needed // 2) + "a" * (needed % 2), encoding="utf-8")
    task = load_task("text", text_file=short, host={"block_size": 8})
    assert len(task.train) >= 1 and len(task.validation) == 1
    short.write_text("a" * (needed - 1), encoding="utf-8")
    with pytest.raises(DataError, match=rf"at least {needed} characters"):
        load_task("text", text_file=short, host={"block_size": 8})
