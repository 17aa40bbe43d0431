"""Character-level text: the corpus, its vocabulary, and next-character training windows.

The default corpus is the Python standard library's own top-level `.py` files on this machine, in
sorted file-name order, cut at `DEFAULT_CORPUS_MAX_CHARACTERS`: always present, no download, and
a fraction of a second to load. It differs between Python versions, and so does its vocabulary.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from morphogen.data.errors import DataError

DEFAULT_CORPUS_MAX_CHARACTERS = 1_000_000
"""Size cap of the default corpus: ~14k training windows of 64 characters, an epoch of seconds on CPU."""

_CHUNK_CHARACTERS = 1 << 16
"""Characters converted to code points at a time while encoding (a chunk takes ~1 MB of scratch memory)."""

_TEXT_FILE_SETTING = "text_file (--text-file on the command line)"
"""How an error names the setting that picks the text file: the key of Python and config files, and the flag."""


@dataclass(frozen=True)
class EncodedText:
    """A text as character ids ([L], uint8, int16 or int32 by vocabulary size) and the vocabulary mapping id ->
    character."""

    ids: np.ndarray
    vocabulary: tuple[str, ...]


def read_default_corpus(max_characters: int = DEFAULT_CORPUS_MAX_CHARACTERS) -> str:
    """The standard library's top-level `.py` sources, concatenated in sorted order up to a cap."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    collected = 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            # A stdlib file that cannot be read as UTF-8 is skipped; the order of the rest is unchanged.
            continue
        parts.append(source)
        collected += len(source)
        if collected >= max_characters:
            break
    if not parts:
        raise DataError(
            f"no readable Python sources found in {stdlib}; set {_TEXT_FILE_SETTING} to a UTF-8 text file"
        )
    return "".join(parts)[:max_characters]


def read_text_file(path: str | Path) -> str:
    """A whole UTF-8 text file, less a byte order mark at its start (an editor's, not a character of the text);
    DataError when it is missing or not UTF-8."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(
            f"text file {file} does not exist (or is not a file); set {_TEXT_FILE_SETTING} to a UTF-8 file"
        )
    try:
        return file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise DataError(f"text file {file} is not valid UTF-8 ({error}); convert it to UTF-8") from error


def encode_characters(text: str) -> EncodedText:
    """Ids into the sorted set of the text's characters (sorted by code point, as `sorted(set(text))`).

    The ids take the narrowest dtype that holds the vocabulary (uint8 up to 256 characters, int16 up to 32,768,
    else int32), and the text is converted to code points a chunk at a time, so encoding needs the ids and about
    2 MB besides the text (a table over all code points, a chunk's scratch), not several times the text's size.
    """
    # Linear time: mark the code points that occur; an occurring one's id is how many occur before it.
    occurs = np.zeros(sys.maxunicode + 1, dtype=bool)  # (0x110000,)
    for _, code_points in _code_point_chunks(text):
        occurs[code_points] = True
    vocabulary_codes = np.flatnonzero(occurs)  # (V,), ascending
    id_dtype = _id_dtype(len(vocabulary_codes))
    id_of_code = np.zeros(int(vocabulary_codes[-1]) + 1 if len(vocabulary_codes) else 0, dtype=id_dtype)  # (C,)
    id_of_code[vocabulary_codes] = np.arange(len(vocabulary_codes), dtype=id_dtype)
    ids = np.empty(len(text), dtype=id_dtype)  # (L,)
    for start, code_points in _code_point_chunks(text):
        ids[start:start + len(code_points)] = id_of_code[code_points]
    return EncodedText(ids=ids, vocabulary=tuple(chr(int(code)) for code in vocabulary_codes))


def _code_point_chunks(text: str) -> Iterator[tuple[int, np.ndarray]]:
    """The text's code points (uint32) `_CHUNK_CHARACTERS` at a time, each with the offset of its first one."""
    for start in range(0, len(text), _CHUNK_CHARACTERS):
        chunk = text[start:start + _CHUNK_CHARACTERS].encode("utf-32-le")
        yield start, np.frombuffer(chunk, dtype="<u4")


def _id_dtype(vocabulary_size: int) -> type[np.integer[Any]]:
    """The narrowest integer dtype that torch also holds (so no uint16) for ids below `vocabulary_size`."""
    if vocabulary_size <= 1 << 8:
        return np.uint8
    return np.int16 if vocabulary_size <= 1 << 15 else np.int32


def decode_characters(ids: Tensor | Sequence[int], vocabulary: Sequence[str]) -> str:
    """The text spelled by a 1-D sequence of character ids (the inverse of `encode_characters`)."""
    values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
    return "".join(vocabulary[index] for index in values)


def next_character_windows(ids: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """Inputs [N, T] and targets [N, T] (inputs shifted by one) from windows of T+1 ids at stride T.

    Consecutive windows share one id, so every transition of the text is a target exactly once; a
    tail shorter than a window is dropped.
    """
    if ids.dim() != 1 or ids.shape[0] < block_size + 1:
        raise DataError(
            f"a text split needs at least {block_size + 1} characters for one window, got {ids.shape[0]}; "
            "use a longer text"
        )
    windows = ids.unfold(0, block_size + 1, block_size)  # (N, T+1), a view
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (N, T), (N, T)
