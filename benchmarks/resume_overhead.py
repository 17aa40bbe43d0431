"""What saving for `run --resume` costs: the seconds a `morphogen run` spends saving each training's state after
an epoch, as a share of the seconds it spends playing the epochs.

Each repeat is a whole run (grown, no growth, from scratch; 30 epochs each) that saves after every epoch, into a
temporary run directory. Every epoch (`env.play.play_epoch`: the controller's action, training, validation) and
every save (`save_training_state`: the state gathered, checksummed, serialized and written with fsync) is timed
where it happens, so the ratio compares work done seconds apart and a drift in machine load hits both alike
(timing two whole runs against each other measured the load of this shared machine more than the saves). The
table gives the median epoch and save, their ratio over the run (median over repeats), and the size of one
training's `resume.pt`. Run `python benchmarks/resume_overhead.py --help`.
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import morphogen.commands.run as run_module
import morphogen.env.play as play_module
from arguments import BenchmarkParser, count, run_script
from morphogen.commands.run import RunConfig, run_command
from morphogen.config import build_config
from morphogen.run_directory import RESUME_FILENAME

#: name -> the `morphogen run` config of that setting (its 30-epoch default episode).
SETTINGS: dict[str, dict[str, Any]] = {
    "digits (default host, 1,442 parameters)": {"task": "digits"},
    "digits 2x32 (19,562 parameters)": {"task": "digits", "host": {"n_blocks": 2, "base_channels": 32}},
}


def timed(function: Callable[..., Any], seconds: list[float]) -> Callable[..., Any]:
    """`function`, appending the seconds of each call to `seconds`."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - started)
    return wrapper


def one_run(values: dict[str, Any]) -> tuple[list[float], list[float], int]:
    """The seconds of every epoch and of every save of one whole run of `values`, and the grown training's
    `resume.pt` size in bytes (read before the run removes it)."""
    epochs: list[float] = []
    saves: list[float] = []
    size = 0
    original_play, original_save = play_module.play_epoch, run_module.save_training_state

    def save_and_measure(directory: Path, *args: Any, **kwargs: Any) -> None:
        nonlocal size
        original_save(directory, *args, **kwargs)
        size = size or (directory / RESUME_FILENAME).stat().st_size

    play_module.play_epoch = timed(original_play, epochs)
    run_module.save_training_state = timed(save_and_measure, saves)
    try:
        with tempfile.TemporaryDirectory() as root:
            run_command(build_config(RunConfig, {**values, "run_dir": str(Path(root) / "run")}), out=io.StringIO())
    finally:
        play_module.play_epoch, run_module.save_training_state = original_play, original_save
    return epochs, saves, size


def main(argv: Sequence[str] | None = None) -> None:
    parser = BenchmarkParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=count, default=3, help="whole runs per setting (default 3)")
    parser.add_argument("--threads", type=count, default=1, help="torch threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| setting | epochs and saves | epoch (ms, median) | save (ms, median) | saving / playing | resume.pt |")
    print("|---|---|---|---|---|---|")
    for name, values in SETTINGS.items():
        runs = [one_run(values) for _ in range(args.repeats)]
        epochs = [seconds for run in runs for seconds in run[0]]
        saves = [seconds for run in runs for seconds in run[1]]
        share = statistics.median(sum(run[1]) / sum(run[0]) for run in runs)
        print(f"| {name} | {len(epochs)} and {len(saves)} | {1000 * statistics.median(epochs):.1f} | "
              f"{1000 * statistics.median(saves):.1f} | {100 * share:.1f}% | {runs[0][2] / 1024:.0f} KiB |",
              flush=True)


if __name__ == "__main__":
    run_script(main)
