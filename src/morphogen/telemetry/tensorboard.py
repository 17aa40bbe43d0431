"""A sink writing every event's scalars to TensorBoard, under the same names as the JSON lines.

Runs: each env writes into its own TensorBoard run, `tb/env<N>`, and events that are not about one env
(PPO updates, rounds, trainer-wide anomalies) into `tb/trainer`. The tag names are the shared metric
names in every run, so TensorBoard overlays the envs on one chart per metric instead of mixing several
envs' points at the same step of one curve (which it shows as a zigzag and thins out).

Steps: events with a `round` field (PPO updates, rounds) are written at step `round`. Every other
event is written at the env's cumulative epoch: its `epoch` plus the epochs of that env's earlier
episodes (counted from its `EpisodeCompleted` events), so curves keep growing across the episodes
of a training run instead of restarting at 1. In a single `morphogen run` that is simply the epoch.
When the sink opens a `tb` directory inside a run directory whose `events.jsonl` already holds
episodes (a resumed training run), it counts them first, so the steps continue where they stopped.

Needs the optional `tensorboard` package: `pip install 'morphogen[tensorboard]'`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from morphogen.run_directory import EVENTS_FILENAME
from morphogen.telemetry.events import ALL_ENVS, EpisodeCompleted, Event

TRAINER_RUN = "trainer"
"""TensorBoard run (subdirectory of `tb`) of the events that are not about one env."""

FLUSH_SECONDS = 10
"""How often the writers flush to disk, so a live `tensorboard --logdir` sees recent points."""



def env_run_name(env_id: int) -> str:
    """The TensorBoard run (subdirectory of `tb`) an env's events are written to."""
    return TRAINER_RUN if env_id == ALL_ENVS else f"env{env_id}"


def completed_epochs(events_file: Path) -> dict[int, int]:
    """Env id -> epochs of its episodes completed in `events_file` (JSON lines); {} when there is none.

    Only `episode_completed` records are parsed; a last line still being written is skipped.
    """
    if not events_file.is_file():
        return {}
    offsets: dict[int, int] = {}
    with events_file.open(encoding="utf-8") as lines:
        for line in lines:
            if f'"{EpisodeCompleted.kind}"' not in line or not line.endswith("\n"):
                continue
            record = json.loads(line)
            if record.get("event") == EpisodeCompleted.kind:
                env_id = int(record["env_id"])
                offsets[env_id] = offsets.get(env_id, 0) + int(record["epoch"])
    return offsets


class TensorBoardSink:
    """Writes `event.scalars()` with `SummaryWriter.add_scalar`, one writer per env (see module docstring)."""

    def __init__(self, log_dir: Path | str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ImportError(
                "TensorBoard logging needs the tensorboard package: pip install 'morphogen[tensorboard]' "
                "(or run without --tensorboard)"
            ) from error
        self.log_dir = Path(log_dir)
        self._writer_class: Any = SummaryWriter
        self._writers: dict[str, Any] = {}
        self._epoch_offsets = completed_epochs(self.log_dir.parent / EVENTS_FILENAME)

    def step_of(self, event: Event) -> int:
        """The TensorBoard step `event` is written at."""
        round_number = getattr(event, "round", None)
        if isinstance(round_number, int):
            return round_number
        return self._epoch_offsets.get(event.env_id, 0) + event.epoch

    def _writer(self, env_id: int) -> Any:
        run = env_run_name(env_id)
        if run not in self._writers:
            self._writers[run] = self._writer_class(log_dir=str(self.log_dir / run), flush_secs=FLUSH_SECONDS)
        return self._writers[run]

    def write(self, event: Event) -> None:
        """Add each scalar of `event` at its step; an `EpisodeCompleted` then advances its env's offset."""
        scalars = event.scalars()
        step = self.step_of(event)
        if scalars:
            writer = self._writer(event.env_id)
            for name, value in scalars.items():
                writer.add_scalar(name, value, step)
        if isinstance(event, EpisodeCompleted):
            self._epoch_offsets[event.env_id] = step

    def close(self) -> None:
        """Flush and close every run's event file; closing twice is harmless."""
        for writer in self._writers.values():
            writer.close()

    def __repr__(self) -> str:
        return f"TensorBoardSink({str(self.log_dir)!r})"
