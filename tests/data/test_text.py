"""Character encoding of a text: ids equal to `sorted(set(text))`'s, compact ids, a byte order mark dropped."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from morphogen.data import DataError, load_task
from morphogen.data.text import encode_characters, read_text_file


def _reference_ids(text: str) -> tuple[tuple[str, ...], list[int]]:
    """The vocabulary and ids by the definition: positions in the sorted set of the characters."""
    vocabulary = tuple(sorted(set(text)))
    position = {character: index for index, character in enumerate(vocabulary)}
    return vocabulary, [position[character] for character in text]


@pytest.mark.parametrize(("text", "itemsize"), [
    ("", 1),
    ("hello, world\n" * 20, 1),
    ("ünïcödé ✓ and an astral 𝄞 " * 9, 1),
    ("".join(chr(code) for code in range(0x4E00, 0x4E00 + 300)) * 3 + "ab", 2),
    ("".join(chr(code) for code in range(0x10000, 0x10000 + 40_000)) + "z", 4),
])
def test_ids_are_positions_in_the_sorted_vocabulary_in_the_narrowest_dtype(text: str, itemsize: int) -> None:
    vocabulary, ids = _reference_ids(text)
    encoded = encode_characters(text)
    assert encoded.vocabulary == vocabulary
    assert encoded.ids.tolist() == ids
    assert encoded.ids.dtype.itemsize == itemsize and encoded.ids.dtype.kind in "iu"


def test_encoding_needs_about_one_byte_a_character_of_a_small_vocabulary() -> None:
    """A few-MB text encodes into its ids plus bounded scratch memory, not several copies of the text."""
    text = "the quick brown fox jumps over the lazy dog\n" * 100_000  # 4.4M characters
    tracemalloc.start()
    try:
        encoded = encode_characters(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(text)
    assert len(encoded.ids) == len(text) and encoded.ids.dtype == np.uint8


def test_a_byte_order_mark_at_the_start_is_not_a_character(tmp_path: Path) -> None:
    """An editor's UTF-8 BOM is dropped, not learned as a vocabulary character; U+FEFF inside the text stays."""
    text = "line one\nline \ufefftwo\n" * 40
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert read_text_file(path) == text
    task = load_task("text", text_file=path, host={"block_size": 8})
    assert task.vocabulary == tuple(sorted(set(text)))


def test_a_missing_file_names_the_setting_of_python_configs_and_the_command_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"absent\.txt does not exist .*; set text_file \(--text-file on the "
                                        r"command line\) to a UTF-8 file$"):
        read_text_file(tmp_path / "absent.txt")
