"""What saving for `run --resume` costs: a whole `morphogen run` that saves every epoch, against the same run with
`save_every = 0` (nothing saved), as a ratio of wall time.

Each repeat runs both, one after the other in alternating order (so that a drift in machine load hits both
alike), into temporary run directories, with the same seed: the same epochs, the same numbers. The table gives
the median seconds of each, the median ratio of the pairs, the seconds spent inside the saves (timed around
`save_training_state`) per saved epoch, and the size of one training's `resume.pt`. Run
`python benchmarks/resume_overhead.py --help`.
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import morphogen.commands.run as run_module
from morphogen.commands.run import RunConfig, run_command
from morphogen.config import build_config
from morphogen.run_directory import RESUME_FILENAME

#: name -> the `morphogen run` config of that setting (its 30-epoch default episode).
SETTINGS: dict[str, dict[str, Any]] = {
    "digits (default host, 1,442 parameters)": {"task": "digits"},
    "digits 2x32 (19,562 parameters)": {"task": "digits", "host": {"n_blocks": 2, "base_channels": 32}},
}


class SaveTimer:
    """Wraps `save_training_state` to add up the seconds spent in it and keep the last file's size."""

    def __init__(self) -> None:
        self.seconds, self.saves, self.last_size = 0.0, 0, 0
        self._original = run_module.save_training_state

    def __call__(self, directory: Path, *args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        self._original(directory, *args, **kwargs)
        self.seconds += time.perf_counter() - started
        self.saves += 1
        self.last_size = (directory / RESUME_FILENAME).stat().st_size


def timed_run(values: dict[str, Any], save_every: int, timer: SaveTimer) -> float:
    """Seconds of one whole run (grown, no growth, from scratch) of `values` saving every `save_every` epochs."""
    with tempfile.TemporaryDirectory() as root:
        config = build_config(RunConfig, {**values, "save_every": save_every, "run_dir": str(Path(root) / "run")})
        run_module.save_training_state = timer
        try:
            started = time.perf_counter()
            run_command(config, out=io.StringIO())
            return time.perf_counter() - started
        finally:
            run_module.save_training_state = timer._original


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs per setting (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| setting | saving every epoch (s) | saving nothing (s) | ratio | saving per epoch (ms) | resume.pt |")
    print("|---|---|---|---|---|---|")
    for name, values in SETTINGS.items():
        saving, plain, ratios = [], [], []
        timer = SaveTimer()
        for repeat in range(args.repeats):
            order = (1, 0) if repeat % 2 == 0 else (0, 1)
            seconds = {every: timed_run(values, every, timer if every else SaveTimer()) for every in order}
            saving.append(seconds[1])
            plain.append(seconds[0])
            ratios.append(seconds[1] / seconds[0])
        per_save_ms = 1000 * timer.seconds / max(timer.saves, 1)
        print(f"| {name} | {statistics.median(saving):.2f} | {statistics.median(plain):.2f} | "
              f"{statistics.median(ratios):.3f} | {per_save_ms:.1f} | {timer.last_size / 1024:.0f} KiB |", flush=True)


if __name__ == "__main__":
    main()
