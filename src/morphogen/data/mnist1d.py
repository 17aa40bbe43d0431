"""MNIST-1D (Greydanus 2020), generated offline by the `mnist1d` package's own generator.

MNIST-1D is ten 1D digit templates of 12 points, each padded, scaled, sheared, translated, given
correlated and i.i.d. noise, and resampled to 40 points: a small benchmark on which a CNN beats an
MLP clearly (the paper reports roughly 94% against 68%), so architecture matters at laptop scale.

`generate_mnist1d()` calls `mnist1d.data.make_dataset` with `get_dataset_args()`'s defaults (5000
samples, seed 42, first 80% train): the published 4000 / 1000 split, built in a few seconds without
the network (the package's `get_dataset` would download a pickle; it is never called). The generator
standardizes all 5000 signals together; the arrays are used as it returns them.

Rules:
- Deterministic: the generator seeds Python's `random` and NumPy's global RNG with 42; both are
  saved before and restored after, so loading the task never changes the caller's random streams.
- Cached per process: the first call generates, later calls return the same read-only arrays.
- `mnist1d` is imported on first use only: it pulls in SciPy and matplotlib, which `import morphogen`
  should not pay for.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import numpy as np

from morphogen.data.errors import DataError

MNIST1D_LENGTH = 40
"""Points per signal (`final_seq_length` of the generator's defaults)."""
MNIST1D_NUM_CLASSES = 10


@dataclass(frozen=True)
class Mnist1dArrays:
    """MNIST-1D as generated: float64 signals [N, 40] and int64 labels [N], read-only, in generator order."""

    train_signals: np.ndarray
    train_labels: np.ndarray
    test_signals: np.ndarray
    test_labels: np.ndarray


@functools.lru_cache(maxsize=1)
def generate_mnist1d() -> Mnist1dArrays:
    """The MNIST-1D train and test splits, generated once per process with the package defaults."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset  # type: ignore[import-untyped]
    except ImportError as error:
        raise DataError(f"task 'mnist1d' needs the mnist1d package ({error}); install it with "
                        "`pip install mnist1d`") from None
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        dataset = make_dataset(get_dataset_args())
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    arrays = Mnist1dArrays(
        train_signals=np.asarray(dataset["x"], dtype=np.float64),
        train_labels=np.asarray(dataset["y"], dtype=np.int64),
        test_signals=np.asarray(dataset["x_test"], dtype=np.float64),
        test_labels=np.asarray(dataset["y_test"], dtype=np.int64),
    )
    for array in (arrays.train_signals, arrays.train_labels, arrays.test_signals, arrays.test_labels):
        array.setflags(write=False)  # shared by every load in this process
    return arrays
