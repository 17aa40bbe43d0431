"""Profilers: a cheap wall-clock phase timer, and a `torch.profiler` trace over a window of steps.

`PhaseTimer` costs two `time.perf_counter()` calls per phase. It measures wall-clock time on the
host: on CUDA a phase ends when its Python code returns, which includes the device work only where
the phase synchronizes (the loop synchronizes once per phase: docs/architecture.md#sync-budgets). Phases may nest; each
phase's total includes the phases inside it.

`TraceProfiler` records CPU activity always, plus CUDA and MPS when this torch build and machine
have them, and writes a trace readable by TensorBoard's profiler plugin or Perfetto.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.profiler import ProfilerAction, ProfilerActivity

from morphogen.run_directory import PROFILE_DIRNAME, own_directory
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.events import PHASES, PhaseTimes

TIMED_LEVELS = ("normal", "debug")
"""Levels at which `PhaseTimer.from_config` builds a running timer."""

"""Subdirectory of a run directory that profiler traces go to."""


class PhaseTimer:
    """Accumulates wall-clock seconds per named phase; does nothing when disabled."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._totals: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._lap_start: dict[str, float] = {}

    @classmethod
    def from_config(cls, config: TelemetryConfig) -> PhaseTimer:
        """Running at the configured levels normal and debug, a no-op at off and minimal."""
        return cls(enabled=config.level in TIMED_LEVELS)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the body of the `with` block under `name` (when enabled)."""
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self._totals[name] = self._totals.get(name, 0.0) + time.perf_counter() - start
            self._counts[name] = self._counts.get(name, 0) + 1

    @property
    def totals(self) -> dict[str, float]:
        """Seconds per phase since the timer was created, in first-seen order."""
        return dict(self._totals)

    def state_dict(self) -> dict[str, Any]:
        """The seconds and counts per phase so far, for a run that resumes: its totals go on from them."""
        return {"totals": dict(self._totals), "counts": dict(self._counts), "lap_start": dict(self._lap_start)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self._totals = {str(name): float(value) for name, value in state["totals"].items()}
        self._counts = {str(name): int(value) for name, value in state["counts"].items()}
        self._lap_start = {str(name): float(value) for name, value in state["lap_start"].items()}

    def lap(self) -> tuple[tuple[str, float], ...]:
        """Seconds per phase since the previous `lap()` (or since creation): the content of a `PhaseTimes`."""
        laps = tuple((name, total - self._lap_start.get(name, 0.0)) for name, total in self._totals.items())
        self._lap_start = dict(self._totals)
        return laps

    def event(self, *, epoch: int, env_id: int) -> PhaseTimes:
        """A `PhaseTimes` event of the seconds per phase since the previous lap."""
        return PhaseTimes(epoch=epoch, env_id=env_id, phases=self.lap())

    def summary(self) -> str:
        """A table of total seconds, share of the timed total, calls and mean milliseconds per phase."""
        if not self._totals:
            return "phase timer: nothing timed" + ("" if self.enabled else " (disabled at this telemetry level)")
        names = [name for name in PHASES if name in self._totals]
        names += [name for name in self._totals if name not in PHASES]
        # Shares are of the sum over phases (nested phases make it exceed the wall time).
        grand_total = sum(self._totals.values())
        width = max(len("phase"), *(len(name) for name in names))
        lines = [f"{'phase':<{width}}  {'seconds':>9}  {'share':>6}  {'calls':>6}  {'mean ms':>9}"]
        for name in names:
            total, count = self._totals[name], self._counts[name]
            share = total / grand_total if grand_total > 0 else 0.0
            lines.append(f"{name:<{width}}  {total:>9.3f}  {share:>6.1%}  {count:>6d}  {1000 * total / count:>9.2f}")
        return "\n".join(lines)


def profiler_activities() -> list[ProfilerActivity]:
    """CPU always; CUDA if a GPU is visible; MPS if this torch has the activity and the backend works."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    mps_activity = getattr(ProfilerActivity, "MPS", None)
    if mps_activity is not None and torch.backends.mps.is_available():
        activities.append(mps_activity)
    return activities


class TraceProfiler:
    """A `torch.profiler` trace over steps wait..wait+warmup+active of the run, written to `output_dir`.

    Call `step()` once per env step (one host epoch); use as a context manager or call `start()`
    and `stop()`. Disabled, every method is a no-op, so the loop calls it unconditionally.
    """

    def __init__(
        self, output_dir: Path | str, *, enabled: bool = True, wait: int = 1, warmup: int = 1, active: int = 3
    ) -> None:
        if wait < 0 or warmup < 0 or active < 1:
            raise ValueError(f"need wait >= 0, warmup >= 0 and active >= 1; got {wait}, {warmup}, {active}")
        self.output_dir = Path(output_dir)
        self.enabled = enabled
        self.wait, self.warmup, self.active = wait, warmup, active
        self._profiler: torch.profiler.profile | None = None

    @property
    def schedule(self) -> Callable[[int], ProfilerAction]:
        """The profiler's action at each step (0-based) of the window. `torch.profiler` is imported here and
        in `start`, not with this module: it loads torch's compiler, which a run without `--profile` never needs."""
        import torch.profiler

        return torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1)

    @classmethod
    def from_config(cls, run_dir: Path | str, config: TelemetryConfig) -> TraceProfiler:
        """Enabled by `config.profile`, writing to RUN_DIR/profile over the configured window."""
        return cls(
            Path(run_dir) / PROFILE_DIRNAME,
            enabled=config.profile,
            wait=config.profile_wait,
            warmup=config.profile_warmup,
            active=config.profile_active,
        )

    def start(self) -> None:
        """Start profiling (creates the output directory)."""
        if not self.enabled or self._profiler is not None:
            return
        import torch.profiler

        own_directory(self.output_dir)  # never through a link planted in a copied run
        self._profiler = torch.profiler.profile(
            activities=profiler_activities(),
            schedule=self.schedule,
            on_trace_ready=torch.profiler.tensorboard_trace_handler(str(self.output_dir)),
            record_shapes=True,
        )
        self._profiler.start()

    def step(self) -> None:
        """Mark the end of one step; the trace is written when the window's last step ends."""
        if self._profiler is not None:
            self._profiler.step()

    def stop(self) -> None:
        """Stop profiling; a window cut short by the end of the run is written as far as it got."""
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None

    def __enter__(self) -> TraceProfiler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
