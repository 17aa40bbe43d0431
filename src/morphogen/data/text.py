"""Character-level text: the corpus, its vocabulary, and next-character training windows.

The default corpus is the Python standard library's own top-level `.py` files on this machine, in
sorted file-name order, cut at `DEFAULT_CORPUS_MAX_CHARACTERS`: always present, no download, and
a fraction of a second to load. It differs between Python versions, and so does its vocabulary.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from morphogen.data.errors import DataError

DEFAULT_CORPUS_MAX_CHARACTERS = 1_000_000
"""Size cap of the default corpus: ~14k training windows of 64 characters, an epoch of seconds on CPU."""


@dataclass(frozen=True)
class EncodedText:
    """A text as character ids (int64 [L]) and the vocabulary mapping id -> character."""

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
            f"no readable Python sources found in {stdlib}; pass text_file=PATH to a UTF-8 text file"
        )
    return "".join(parts)[:max_characters]


def read_text_file(path: str | Path) -> str:
    """A whole UTF-8 text file; DataError when it is missing or not UTF-8."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(
            f"text file {file} does not exist (or is not a file); pass text_file=PATH to a UTF-8 file"
        )
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"text file {file} is not valid UTF-8 ({error}); convert it to UTF-8") from error


def encode_characters(text: str) -> EncodedText:
    """Ids into the sorted set of the text's characters (sorted by code point, as `sorted(set(text))`)."""
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)  # (L,)
    # Linear time: mark the code points that occur; an occurring one's id is how many occur before it.
    occurs = np.bincount(code_points, minlength=1) > 0  # (max code point + 1,)
    id_of_code = np.cumsum(occurs) - 1
    vocabulary_codes = np.flatnonzero(occurs)  # (V,), ascending
    return EncodedText(
        ids=id_of_code[code_points],
        vocabulary=tuple(chr(int(code)) for code in vocabulary_codes),
    )


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
