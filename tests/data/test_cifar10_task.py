"""The cifar10 task on a tiny dataset written in the real on-disk pickle format."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from morphogen.data import DataError, load_task, random_crop_flip
from morphogen.data.cifar import uint8_channel_mean_std

IMAGES_PER_TRAIN_BATCH = 4
TEST_IMAGES = 6
LABEL_NAMES = [
    b"airplane",
    b"automobile",
    b"bird",
    b"cat",
    b"deer",
    b"dog",
    b"frog",
    b"horse",
    b"ship",
    b"truck",
]


def write_pickle(path: Path, content: object) -> None:
    with path.open("wb") as file:
        pickle.dump(content, file)


def _keys(content: dict[bytes, object], str_keys: bool) -> dict[bytes | str, object]:
    """The dict as written: bytes keys like the published files, or str keys (and str names) like re-written ones."""
    if not str_keys:
        return dict(content)
    return {key.decode(): ([v.decode() for v in value] if key == b"label_names" else value)  # type: ignore[attr-defined]
            for key, value in content.items()}


def write_fake_cifar10(root: Path, seed: int = 0, str_keys: bool = False) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Write root/cifar-10-batches-py in the published format (or with str keys); return each file's (data, labels)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    written = {}
    names = [f"data_batch_{number}" for number in range(1, 6)] + ["test_batch"]
    for name in names:
        count = TEST_IMAGES if name == "test_batch" else IMAGES_PER_TRAIN_BATCH
        data = rng.integers(0, 256, size=(count, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=count).tolist()
        batch = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [f"image_{index}.png".encode() for index in range(count)],
        }
        write_pickle(folder / name, _keys(batch, str_keys))
        written[name] = (data, labels)
    meta = {b"num_cases_per_batch": 4, b"label_names": LABEL_NAMES, b"num_vis": 3072}
    write_pickle(folder / "batches.meta", _keys(meta, str_keys))
    return written


@pytest.mark.parametrize("str_keys", [False, True], ids=["bytes-keys", "str-keys"])
def test_loads_images_labels_and_preset(tmp_path: Path, str_keys: bool) -> None:
    written = write_fake_cifar10(tmp_path, str_keys=str_keys)
    task = load_task("cifar10", data_dir=tmp_path)

    assert task.train.inputs.shape == (20, 3, 32, 32) and task.train.inputs.dtype == torch.float32
    assert task.validation.inputs.shape == (6, 3, 32, 32)
    expected_train_labels = [label for number in range(1, 6) for label in written[f"data_batch_{number}"][1]]
    assert task.train.targets.tolist() == expected_train_labels
    assert task.validation.targets.tolist() == written["test_batch"][1]
    assert task.train.targets.dtype == torch.long
    assert task.host_kwargs == {
        "num_classes": 10,
        "in_channels": 3,
        "n_blocks": 3,
        "base_channels": 32,
        "kernel_size": 3,
    }
    assert task.augment is random_crop_flip and task.batch_size == 128 and task.objective == "classification"


def test_pixels_are_planes_normalized_by_training_channel_stats(tmp_path: Path) -> None:
    written = write_fake_cifar10(tmp_path)
    task = load_task("cifar10", data_dir=tmp_path / "cifar-10-batches-py")  # the folder itself works too
    raw_train = np.concatenate([written[f"data_batch_{number}"][0] for number in range(1, 6)])
    raw_train = raw_train.astype(np.float64)
    # Channel c of pixel (y, x) sits at column c * 1024 + y * 32 + x of a row.
    channel_values = [raw_train[:, channel * 1024 : (channel + 1) * 1024] / 255.0 for channel in range(3)]
    means = [values.mean() for values in channel_values]
    stds = [values.std() for values in channel_values]

    test_data = written["test_batch"][0]
    for image, channel, y, x in [(0, 0, 0, 0), (1, 1, 5, 31), (5, 2, 31, 7), (3, 2, 17, 0)]:
        raw = test_data[image, channel * 1024 + y * 32 + x] / 255.0
        expected = (raw - means[channel]) / stds[channel]
        assert float(task.validation.inputs[image, channel, y, x]) == pytest.approx(expected, abs=1e-5)
    per_channel = task.train.inputs.double().transpose(0, 1).flatten(1)
    assert torch.allclose(per_channel.mean(1), torch.zeros(3, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(per_channel.std(1, correction=0), torch.ones(3, dtype=torch.float64), atol=1e-5)


def test_channel_statistics_match_float64_reference() -> None:
    images = np.random.default_rng(3).integers(0, 256, size=(7, 3, 5, 4), dtype=np.uint8)
    mean, std = uint8_channel_mean_std(images)
    reference = images.astype(np.float64) / 255.0
    np.testing.assert_allclose(mean, reference.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(std, reference.std(axis=(0, 2, 3)), rtol=1e-12)


def test_cap_keeps_a_seeded_subset(tmp_path: Path) -> None:
    write_fake_cifar10(tmp_path)
    full = load_task("cifar10", data_dir=tmp_path)
    capped = load_task("cifar10", data_dir=tmp_path, max_train_samples=5, seed=4)
    assert len(capped.train) == 5 and len(capped.validation) == 6
    assert torch.equal(capped.validation.inputs, full.validation.inputs)
    full_rows = list(full.train.inputs.flatten(1))
    assert all(
        any(torch.equal(row, candidate) for candidate in full_rows) for row in capped.train.inputs.flatten(1)
    )


def test_missing_directory_names_the_path_and_layout(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match=r"nowhere.*cifar-10-batches-py"):
        load_task("cifar10", data_dir=missing)
    with pytest.raises(DataError, match="needs data_dir"):
        load_task("cifar10")


def test_missing_or_broken_files_are_named(tmp_path: Path) -> None:
    write_fake_cifar10(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    (folder / "data_batch_3").unlink()
    with pytest.raises(DataError, match=r"missing.*data_batch_3"):
        load_task("cifar10", data_dir=tmp_path)

    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="data_batch_3 is not a readable pickle"):
        load_task("cifar10", data_dir=tmp_path)

    write_pickle(folder / "data_batch_3", {b"data": np.zeros((2, 100), dtype=np.uint8), b"labels": [0, 1]})
    with pytest.raises(DataError, match=r"data_batch_3: key 'data' should be a uint8 array"):
        load_task("cifar10", data_dir=tmp_path)

    write_pickle(folder / "data_batch_3", {b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [0, 10]})
    with pytest.raises(DataError, match=r"key 'labels' must hold values in \[0, 10\)"):
        load_task("cifar10", data_dir=tmp_path)

    write_pickle(folder / "data_batch_3", {"data": np.zeros((2, 3072), dtype=np.uint8)})
    with pytest.raises(DataError, match=r"data_batch_3 lacks the key 'labels' \(as bytes or str\)$"):
        load_task("cifar10", data_dir=tmp_path)

    write_pickle(folder / "batches.meta", {"label_names": ["a", "b"]})
    with pytest.raises(DataError, match=r"batches.meta: key 'label_names' should list 10 names$"):
        load_task("cifar10", data_dir=tmp_path)


class _ReducesToBadCall:
    """Unpickles to a call with arguments its callable refuses: pickle raises the callable's TypeError."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (int, ("1", "2", "3"))


@pytest.mark.parametrize(("content", "message"), [
    ({b"data": np.zeros((0, 3072), dtype=np.uint8), b"labels": []}, r"data_batch_2 holds no images$"),
    ({b"data": np.zeros((3, 3072), dtype=np.uint8), b"labels": [[0], [1, 2], 3]},
     r"data_batch_2: key 'labels' should hold one int per image \(3\)$"),
    (_ReducesToBadCall(), r"data_batch_2 is not a readable pickle \(int\(\) takes at most 2 arguments"),
], ids=["no-images", "ragged-labels", "type-error-inside"])
def test_a_batch_file_of_another_content_is_a_data_error_naming_it(tmp_path: Path, content: object,
                                                                    message: str) -> None:
    """An empty batch, labels that are not one int per image and a pickle whose content cannot be rebuilt are one
    line naming the file, not numpy's or pickle's exception (an empty batch's labels are not called wrong)."""
    write_fake_cifar10(tmp_path)
    write_pickle(tmp_path / "cifar-10-batches-py" / "data_batch_2", content)
    with pytest.raises(DataError, match=message):
        load_task("cifar10", data_dir=tmp_path)


def test_a_data_dir_that_is_a_file_or_an_unreadable_batch_is_named_as_such(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A file given as the data directory is "not a directory" (it exists); a batch that cannot be opened (no read
    permission) is a DataError naming it, not an OSError traceback."""
    write_fake_cifar10(tmp_path)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    with pytest.raises(DataError, match=r"data_batch_1 is not a directory; expected DATA_DIR"):
        load_task("cifar10", data_dir=batch)

    opened = Path.open

    def refused(path: Path, *args: object, **kwargs: object) -> object:
        if path.name == "data_batch_4":
            raise PermissionError(13, "Permission denied", str(path))
        return opened(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "open", refused)
    with pytest.raises(DataError, match=r"CIFAR-10 file .*data_batch_4 cannot be read \(.*Permission denied"):
        load_task("cifar10", data_dir=tmp_path)


def test_an_archive_not_yet_extracted_or_the_binary_version_says_what_to_do(tmp_path: Path) -> None:
    """The published archive given (or left unextracted in the directory), or the binary version's folder: the
    message says to extract it, or that this is another download, beside the layout expected."""
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(b"\x1f\x8b not really")
    with pytest.raises(DataError, match=r"cifar-10-python\.tar\.gz is not a directory; .*; .*cifar-10-python\.tar\.gz "
                                        r"is the archive: extract it \(tar -xzf "):
        load_task("cifar10", data_dir=archive)
    with pytest.raises(DataError, match=r"files missing in .*; .*cifar-10-python\.tar\.gz is the archive: extract it "
                                        r"there first \(tar -xzf cifar-10-python\.tar\.gz\)$"):
        load_task("cifar10", data_dir=tmp_path)
    binary = tmp_path / "binary"
    (binary / "cifar-10-batches-bin").mkdir(parents=True)
    (binary / "cifar-10-batches-bin" / "data_batch_1.bin").write_bytes(b"")
    with pytest.raises(DataError, match=r"; cifar-10-batches-bin holds the binary version, which this does not "
                                        r"read: get the python version$"):
        load_task("cifar10", data_dir=binary)
    with pytest.raises(DataError, match=r"binary version"):
        load_task("cifar10", data_dir=binary / "cifar-10-batches-bin")


def test_training_images_of_one_colour_are_refused_before_standardizing_by_zero(tmp_path: Path) -> None:
    """Placeholder batches (every pixel 0 in a channel) would standardize to NaN inputs: one line instead."""
    write_fake_cifar10(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    for number in range(1, 6):
        data = np.random.default_rng(number).integers(0, 256, size=(4, 3072), dtype=np.uint8)
        data[:, 1024:2048] = 7  # the green plane
        write_pickle(folder / f"data_batch_{number}", {b"data": data, b"labels": [0, 1, 2, 3]})
    with pytest.raises(DataError, match=r"every training pixel of channel G has the same value"):
        load_task("cifar10", data_dir=tmp_path)
