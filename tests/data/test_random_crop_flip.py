"""random_crop_flip against a per-image reference built with plain Python indexing and slicing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from morphogen.data import random_crop_flip

CropChoice = tuple[int, int, bool]  # (top, left, flipped)


def reflect_index(index: int, size: int) -> int:
    """Where a padded coordinate reads from under reflect padding (the edge pixel is not repeated)."""
    if index < 0:
        return -index
    if index >= size:
        return 2 * (size - 1) - index
    return index


def reference_padded(image: np.ndarray, padding: int, mode: str) -> np.ndarray:
    channels, height, width = image.shape
    padded = np.zeros((channels, height + 2 * padding, width + 2 * padding), dtype=image.dtype)
    for row in range(-padding, height + padding):
        for column in range(-padding, width + padding):
            inside = 0 <= row < height and 0 <= column < width
            if mode == "zeros" and not inside:
                continue
            source_row, source_column = reflect_index(row, height), reflect_index(column, width)
            padded[:, row + padding, column + padding] = image[:, source_row, source_column]
    return padded


def reference_candidates(image: np.ndarray, padding: int, mode: str) -> dict[CropChoice, np.ndarray]:
    """Every output the augmentation may legally produce for one image."""
    _, height, width = image.shape
    padded = reference_padded(image, padding, mode)
    candidates: dict[CropChoice, np.ndarray] = {}
    for top in range(2 * padding + 1):
        for left in range(2 * padding + 1):
            crop = padded[:, top : top + height, left : left + width]
            candidates[(top, left, False)] = crop
            candidates[(top, left, True)] = crop[:, :, ::-1]
    return candidates


def matching_choices(
    images: torch.Tensor, augmented: torch.Tensor, padding: int, mode: str
) -> list[CropChoice]:
    """For each augmented image, the single crop/flip of its original that it equals."""
    choices = []
    for image, output in zip(images.numpy(), augmented.numpy(), strict=True):
        matches = [
            choice
            for choice, candidate in reference_candidates(image, padding, mode).items()
            if np.array_equal(candidate, output)
        ]
        assert len(matches) == 1, f"augmented image matches {len(matches)} legal crops"
        choices.append(matches[0])
    return choices


@pytest.mark.parametrize("mode", ["reflect", "zeros"])
def test_every_output_is_a_crop_of_the_padded_image(mode: str) -> None:
    padding = 2
    images = torch.rand(300, 2, 6, 7, generator=torch.Generator().manual_seed(0))
    augmented = random_crop_flip(
        images,
        torch.Generator().manual_seed(1),
        padding=padding,
        padding_mode=mode,  # type: ignore[arg-type]
    )
    assert augmented.shape == images.shape and augmented.dtype == images.dtype

    choices = matching_choices(images, augmented, padding, mode)
    offsets = {(top, left) for top, left, _ in choices}
    flipped = sum(flip for _, _, flip in choices)
    assert offsets == {(top, left) for top in range(5) for left in range(5)}, "every offset should occur"
    assert 100 < flipped < 200, f"about half the images should be flipped, got {flipped} of 300"


def test_seeded_generator_reproduces_and_padding_zero_only_flips() -> None:
    images = torch.rand(64, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    first = random_crop_flip(images, torch.Generator().manual_seed(7))
    assert torch.equal(first, random_crop_flip(images, torch.Generator().manual_seed(7)))
    assert not torch.equal(first, random_crop_flip(images, torch.Generator().manual_seed(8)))

    unpadded = random_crop_flip(images, torch.Generator().manual_seed(7), padding=0)
    kept = (unpadded == images).flatten(1).all(1)
    flipped = (unpadded == images.flip(3)).flatten(1).all(1)
    assert torch.all(kept ^ flipped)
    assert 0 < int(flipped.sum()) < 64


def test_images_on_another_device_with_cpu_generator() -> None:
    images = torch.empty(4, 3, 8, 8, device="meta")
    augmented = random_crop_flip(images, torch.Generator().manual_seed(0))
    assert augmented.device.type == "meta" and augmented.shape == images.shape


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        random_crop_flip(torch.zeros(3, 8, 8))
    with pytest.raises(ValueError, match="padding >= 0"):
        random_crop_flip(torch.zeros(1, 3, 8, 8), padding=-1)
    with pytest.raises(ValueError, match="smaller than the image"):
        random_crop_flip(torch.zeros(1, 3, 4, 4), padding=4)
    with pytest.raises(ValueError, match="padding_mode"):
        random_crop_flip(torch.zeros(1, 3, 8, 8), padding_mode="circular")  # type: ignore[arg-type]
