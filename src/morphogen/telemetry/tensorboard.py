"""A sink writing every event's scalars to TensorBoard, under the same names as the JSON lines.

Steps: events with a `round` field (PPO updates, rounds) are written at step `round`. Every other
event is written at the env's cumulative epoch: its `epoch` plus the epochs of that env's earlier
episodes (counted from its `EpisodeCompleted` events), so curves keep growing across the episodes
of a training run instead of restarting at 1. In a single `morphogen run` that is simply the epoch.

Needs the optional `tensorboard` package: `pip install 'morphogen[tensorboard]'`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from morphogen.telemetry.events import EpisodeCompleted, Event

TENSORBOARD_DIRNAME = "tb"
"""Subdirectory of a run directory that TensorBoard logs go to."""

FLUSH_SECONDS = 10
"""How often the writer flushes to disk, so a live `tensorboard --logdir` sees recent points."""


class TensorBoardSink:
    """Writes `event.scalars()` of every event with `SummaryWriter.add_scalar` (see module docstring for steps)."""

    def __init__(self, log_dir: Path | str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ImportError(
                "TensorBoard logging needs the tensorboard package: pip install 'morphogen[tensorboard]' "
                "(or run without --tensorboard)"
            ) from error
        self.log_dir = Path(log_dir)
        self._writer: Any = SummaryWriter(log_dir=str(self.log_dir), flush_secs=FLUSH_SECONDS)
        self._epoch_offsets: dict[int, int] = {}

    def step_of(self, event: Event) -> int:
        """The TensorBoard step `event` is written at."""
        round_number = getattr(event, "round", None)
        if isinstance(round_number, int):
            return round_number
        return self._epoch_offsets.get(event.env_id, 0) + event.epoch

    def write(self, event: Event) -> None:
        """Add each scalar of `event` at its step; an `EpisodeCompleted` then advances its env's offset."""
        step = self.step_of(event)
        for name, value in event.scalars().items():
            self._writer.add_scalar(name, value, step)
        if isinstance(event, EpisodeCompleted):
            self._epoch_offsets[event.env_id] = step

    def close(self) -> None:
        """Flush and close the event file; closing twice is harmless."""
        self._writer.close()

    def __repr__(self) -> str:
        return f"TensorBoardSink({str(self.log_dir)!r})"
