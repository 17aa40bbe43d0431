"""Reader for CIFAR-10 in its on-disk "python version" format, without importing torchvision.

The layout is the one the dataset's authors publish and torchvision downloads:
`DATA_DIR/cifar-10-batches-py/` holding pickled `data_batch_1` .. `data_batch_5`, `test_batch` and
`batches.meta`. Each batch is a dict with `b"data"` (uint8 [N, 3072]: the red, green and blue 32x32
planes of each image, row-major) and `b"labels"` (list of N ints). Like torchvision's reader, keys may
also be `str` ("data", "labels", "label_names"), as tools that re-write the format (or a pickle loaded
with `encoding="latin1"` and dumped again) produce. The files are pickles: read only ones you trust.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from morphogen.data.errors import DataError

CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{number}" for number in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_META_FILE = "batches.meta"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
"""The python version as its authors publish it: an archive holding `CIFAR10_FOLDER`."""
CIFAR10_BINARY_FOLDER = "cifar-10-batches-bin"
"""The folder of the dataset's binary version (`data_batch_1.bin` ...), another download than the one read here."""
CIFAR10_IMAGE_SHAPE = (3, 32, 32)
CIFAR10_NUM_CLASSES = 10

EXPECTED_LAYOUT = (
    f"expected DATA_DIR/{CIFAR10_FOLDER}/ (or that folder itself) holding "
    f"{', '.join(CIFAR10_TRAIN_FILES)}, {CIFAR10_TEST_FILE} and {CIFAR10_META_FILE}, "
    "the CIFAR-10 python version as torchvision downloads it"
)
# What pickle.load may raise on a damaged file, per the pickle module's documentation, and the TypeError of a
# callable the pickle names called with arguments it refuses (a pickle of something else, or of another version).
_UNPICKLING_ERRORS = (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, ValueError,
                      TypeError)


@dataclass(frozen=True)
class Cifar10Arrays:
    """CIFAR-10 as read from disk: uint8 images [N, 3, 32, 32] and int64 labels [N], in file order."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    label_names: tuple[str, ...]


def find_cifar10_folder(data_dir: str | Path) -> Path:
    """The folder holding the batch files: `data_dir/cifar-10-batches-py`, or `data_dir` itself."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        state = "is not a directory" if root.exists() else "does not exist"
        raise DataError(f"CIFAR-10 data directory {root} {state}; {EXPECTED_LAYOUT}{_other_download_hint(root)}")
    folder = root / CIFAR10_FOLDER if (root / CIFAR10_FOLDER).is_dir() else root
    missing = [
        name
        for name in (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE, CIFAR10_META_FILE)
        if not (folder / name).is_file()
    ]
    if missing:
        raise DataError(f"CIFAR-10 files missing in {folder}: {', '.join(missing)}; {EXPECTED_LAYOUT}"
                        f"{_other_download_hint(root)}")
    return folder


def _other_download_hint(root: Path) -> str:
    """Where `root` is, or holds, the python version's archive not yet extracted or the binary version, what to do."""
    if root.is_file() and root.name == CIFAR10_ARCHIVE:
        return f"; {root} is the archive: extract it (tar -xzf {root} -C {root.parent}) and give {root.parent}"
    if root.is_dir() and (root / CIFAR10_ARCHIVE).is_file() and not (root / CIFAR10_FOLDER).is_dir():
        return f"; {root / CIFAR10_ARCHIVE} is the archive: extract it there first (tar -xzf {CIFAR10_ARCHIVE})"
    if root.name == CIFAR10_BINARY_FOLDER or (root.is_dir() and (root / CIFAR10_BINARY_FOLDER).is_dir()):
        return f"; {CIFAR10_BINARY_FOLDER} holds the binary version, which this does not read: get the python version"
    return ""


def read_cifar10(data_dir: str | Path) -> Cifar10Arrays:
    """Read and check every CIFAR-10 batch under `data_dir`; raises DataError naming a bad file."""
    folder = find_cifar10_folder(data_dir)
    label_names = _read_label_names(folder / CIFAR10_META_FILE)
    train = [_read_batch(folder / name, len(label_names)) for name in CIFAR10_TRAIN_FILES]
    test_images, test_labels = _read_batch(folder / CIFAR10_TEST_FILE, len(label_names))
    return Cifar10Arrays(
        train_images=np.concatenate([images for images, _ in train]),
        train_labels=np.concatenate([labels for _, labels in train]),
        test_images=test_images,
        test_labels=test_labels,
        label_names=label_names,
    )


def uint8_channel_mean_std(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and population std of uint8 images [N, C, H, W], in units of 1/255.

    Exact and light on memory: a 256-bin histogram per channel instead of a float copy of the data.
    """
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"expected uint8 images [N, C, H, W], got {images.dtype} shape {images.shape}")
    values = np.arange(256, dtype=np.int64)
    means, stds = [], []
    for channel in range(images.shape[1]):
        counts = np.bincount(images[:, channel].ravel(), minlength=256).astype(np.int64)
        # Python ints: count * sum of squares overflows int64 for the full dataset.
        count, total, total_squares = int(counts.sum()), int(counts @ values), int(counts @ (values * values))
        if count == 0:
            raise ValueError("cannot compute channel statistics of an empty image set")
        variance = (count * total_squares - total * total) / (count * count)
        means.append(total / count / 255.0)
        stds.append(variance**0.5 / 255.0)
    return np.asarray(means, dtype=np.float64), np.asarray(stds, dtype=np.float64)


def _unpickle(path: Path) -> Any:
    try:
        with path.open("rb") as file:
            return pickle.load(file, encoding="bytes")
    except OSError as error:  # no read permission, a device error: the file is there but cannot be read
        raise DataError(f"CIFAR-10 file {path} cannot be read ({error})") from error
    except _UNPICKLING_ERRORS as error:
        raise DataError(
            f"CIFAR-10 file {path} is not a readable pickle ({error}); {EXPECTED_LAYOUT}"
        ) from error


def _entry(mapping: Any, key: str, path: Path) -> Any:
    """`mapping[b"key"]` or `mapping["key"]` (both spellings exist in the wild); DataError naming file and key."""
    if not isinstance(mapping, dict):
        raise DataError(f"CIFAR-10 file {path} should hold a dict (with key {key!r}), got {type(mapping).__name__}")
    for spelling in (key.encode(), key):
        if spelling in mapping:
            return mapping[spelling]
    raise DataError(f"CIFAR-10 file {path} lacks the key {key!r} (as bytes or str)")


def _read_label_names(path: Path) -> tuple[str, ...]:
    names = _entry(_unpickle(path), "label_names", path)
    if not isinstance(names, list | tuple) or len(names) != CIFAR10_NUM_CLASSES:
        raise DataError(f"CIFAR-10 file {path}: key 'label_names' should list {CIFAR10_NUM_CLASSES} names")
    return tuple(name.decode() if isinstance(name, bytes) else str(name) for name in names)


def _read_batch(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch file as (uint8 images [N, 3, 32, 32], int64 labels [N])."""
    batch = _unpickle(path)
    data, given_labels = _entry(batch, "data", path), _entry(batch, "labels", path)
    pixels = int(np.prod(CIFAR10_IMAGE_SHAPE))
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != pixels
    ):
        raise DataError(f"CIFAR-10 file {path}: key 'data' should be a uint8 array [N, {pixels}]")
    if data.shape[0] == 0:
        raise DataError(f"CIFAR-10 file {path} holds no images")
    labels = _array_or_none(given_labels)
    if labels is None or labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"CIFAR-10 file {path}: key 'labels' should hold one int per image ({data.shape[0]})")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"CIFAR-10 file {path}: key 'labels' must hold values in [0, {num_classes})")
    return data.reshape(-1, *CIFAR10_IMAGE_SHAPE), labels.astype(np.int64)  # (N, 3, 32, 32)


def _array_or_none(value: object) -> np.ndarray | None:
    """`value` as a numpy array; None where numpy cannot make one (ragged lists of different lengths)."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError):
        return None
