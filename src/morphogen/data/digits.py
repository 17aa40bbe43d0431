"""scikit-learn's 8x8 digits without importing scikit-learn (and SciPy, which it loads): about a second and
80 MB of start-up that the `digits` task does not need.

`read_digits()` parses the CSV file the scikit-learn package ships (`sklearn/datasets/data/digits.csv.gz`,
the file `sklearn.datasets.load_digits` reads), located without importing the package. `stratified_split`
is the selection `sklearn.model_selection.train_test_split(..., stratify=labels, random_state=seed)` makes
(its `StratifiedShuffleSplit`, same random draws in the same order), returned as sorted index arrays;
tests/data/test_digits_task.py checks both against scikit-learn itself.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

from morphogen.data.errors import DataError


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """Images (1797, 8, 8) float64 with values 0..16, and labels (1797,) int64."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise DataError("the digits task reads scikit-learn's digits file; install scikit-learn")
    data = np.loadtxt(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, test indices), each sorted: every class split in proportion, drawn with `seed`."""
    n_test = math.ceil(test_fraction * len(labels))
    n_train = len(labels) - n_test
    _, class_of = np.unique(labels, return_inverse=True)
    counts = np.bincount(class_of)
    members = np.split(np.argsort(class_of, kind="mergesort"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    train_counts = _approximate_mode(counts, n_train, rng)
    test_counts = _approximate_mode(counts - train_counts, n_test, rng)
    train: list[int] = []
    test: list[int] = []
    for indices, n_i, t_i in zip(members, train_counts, test_counts, strict=True):
        shuffled = indices.take(rng.permutation(len(indices)), mode="clip")
        train.extend(shuffled[:n_i])
        test.extend(shuffled[n_i:n_i + t_i])
    return np.sort(np.array(train, dtype=np.int64)), np.sort(np.array(test, dtype=np.int64))


def _approximate_mode(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    """Samples per class when drawing `draws` of `counts`: the proportional share, floored, plus one for the
    classes with the largest remainders until `draws` are reached (ties broken with `rng`)."""
    continuous = counts / counts.sum() * draws
    floored = np.floor(continuous)
    missing = int(draws - floored.sum())
    remainder = continuous - floored
    for value in np.sort(np.unique(remainder))[::-1]:
        if missing <= 0:
            break
        (tied,) = np.where(remainder == value)
        chosen = rng.choice(tied, size=min(len(tied), missing), replace=False)
        floored[chosen] += 1
        missing -= len(chosen)
    return np.asarray(floored, dtype=np.int64)
