"""Start-up time and memory of the `morphogen` command, as ratios against `import torch` in the same run.

Each round starts, one after another in fresh processes: `python -c "import torch"` (the reference),
the same with one AdamW step (what any PyTorch training script pays before it trains), `morphogen --help`,
`morphogen --version`, `morphogen list tasks`, and a digits `morphogen run` (1 thread, `--epochs`, the
no-growth and from-scratch comparisons included). For each it records the wall time (for `run`: until its
first epoch line is printed) and the process's peak resident memory, and whether torch was imported
(checked in a separate process per command, so that the check costs the timed ones nothing).
The table gives medians over `--rounds` rounds; every ratio is taken within a round, against that round's
`import torch`, so the load of a shared machine hits both alike.

    python benchmarks/startup.py --rounds 5
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from arguments import BenchmarkParser, count, run_script

REFERENCE = "import torch"
TRAINING_FLOOR = ("import torch; p = torch.nn.Parameter(torch.zeros(1)); o = torch.optim.AdamW([p]); "
                  "p.sum().backward(); o.step()")
"""What any PyTorch training script pays before its first step: torch, and the first optimizer step, which
imports `torch._dynamo` (torch.optim's wrappers import it on first use)."""
COMMANDS: dict[str, list[str]] = {
    "morphogen --help": ["--help"],
    "morphogen --version": ["--version"],
    "morphogen list tasks": ["list", "tasks"],
}
FIRST_EPOCH = "epoch "
"""How `run`'s first epoch line starts."""


@dataclass(frozen=True)
class Measurement:
    seconds: float
    peak_mb: float


def _measure(argv: Sequence[str], *, until_line: str | None = None) -> Measurement:
    """Run `argv` to its end; wall time until it exits, or until it prints a line starting with `until_line`."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    seconds = None
    for line in process.stdout:
        if until_line is not None and seconds is None and line.startswith(until_line):
            seconds = time.perf_counter() - started
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {process.returncode}")
    if seconds is None:
        if until_line is not None:
            raise RuntimeError(f"{' '.join(argv)} printed no line starting with {until_line!r}")
        seconds = time.perf_counter() - started
    return Measurement(seconds, usage.ru_maxrss / 1024)  # ru_maxrss is in KiB on Linux


def _loads_torch(arguments: Sequence[str]) -> bool:
    """Whether the command imports torch (run in its own process, output discarded)."""
    probe = ("import sys\nfrom morphogen.cli import main\nsys.argv = ['morphogen', *sys.argv[1:]]\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\nsys.stderr.write(str('torch' in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", probe, *arguments], capture_output=True, text=True, check=False)
    return result.stderr.strip().endswith("True")


def main(argv: Sequence[str] | None = None) -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=count, default=5, help="rounds of every measurement (default 5)")
    parser.add_argument("--epochs", type=count, default=3, help="epochs of the digits run (default 3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        run_arguments = ["run", "--threads", "1", "--epochs", str(args.epochs)]
        rows: dict[str, list[Measurement]] = {name: [] for name in (REFERENCE, TRAINING_FLOOR, *COMMANDS,
                                                                     "morphogen run")}
        ratios: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
        for round_index in range(args.rounds):
            reference = _measure([sys.executable, "-c", REFERENCE])
            measured = {REFERENCE: reference, TRAINING_FLOOR: _measure([sys.executable, "-c", TRAINING_FLOOR])}
            for name, arguments in COMMANDS.items():
                measured[name] = _measure([sys.executable, "-m", "morphogen", *arguments])
            run_dir = Path(scratch) / f"run{round_index}"
            measured["morphogen run"] = _measure([sys.executable, "-m", "morphogen", *run_arguments,
                                                  "--run-dir", str(run_dir)], until_line=FIRST_EPOCH)
            for name, measurement in measured.items():
                rows[name].append(measurement)
                ratios[name].append((measurement.seconds / reference.seconds, measurement.peak_mb / reference.peak_mb))
        loads_torch = {REFERENCE: True, TRAINING_FLOOR: True,
                       **{name: _loads_torch(arguments) for name, arguments in COMMANDS.items()},
                       "morphogen run": True}
    print(f"{args.rounds} rounds; `morphogen run` = digits, 1 thread, {args.epochs} epochs, time to its first "
          "epoch line; medians")
    print("| command | seconds | vs import torch | peak RSS MB | vs import torch | imports torch |")
    print("|---|---|---|---|---|---|")
    for name, measurements in rows.items():
        label = "import torch + one AdamW step" if name == TRAINING_FLOOR else name
        seconds = statistics.median(m.seconds for m in measurements)
        peak = statistics.median(m.peak_mb for m in measurements)
        time_ratio = statistics.median(r[0] for r in ratios[name])
        memory_ratio = statistics.median(r[1] for r in ratios[name])
        print(f"| `{label}` | {seconds:.2f} | {time_ratio:.2f}x | {peak:.0f} | {memory_ratio:.2f}x | "
              f"{'yes' if loads_torch[name] else 'no'} |")
    floor = statistics.median(run.seconds / step.seconds for run, step in zip(rows["morphogen run"],
                                                                              rows[TRAINING_FLOOR], strict=True))
    print(f"`morphogen run` to its first epoch line / import torch + one AdamW step: {floor:.2f}x")


if __name__ == "__main__":
    run_script(main)
