"""PhaseTimer and TraceProfiler: totals, laps, the summary table, levels, and a real trace on CPU."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerAction, ProfilerActivity

from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.profiler import PhaseTimer, TraceProfiler, profiler_activities


class FakeClock:
    """Stands in for time.perf_counter: returns the times it was given, in order."""

    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_totals_laps_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "perf_counter", FakeClock(0.0, 1.0, 1.0, 1.25, 2.0, 3.0, 10.0, 10.5))
    timer = PhaseTimer()
    with timer.phase("train"):  # 0 -> 1
        pass
    with timer.phase("validate"):  # 1 -> 1.25
        pass
    assert timer.lap() == (("train", 1.0), ("validate", 0.25))
    with timer.phase("update"), timer.phase("act"):  # update 2 -> 10.5, with act nested inside: 3 -> 10
        pass
    assert timer.totals == {"train": 1.0, "validate": 0.25, "act": 7.0, "update": 8.5}
    event = timer.event(epoch=4, env_id=-1)
    assert event.phases == (("train", 0.0), ("validate", 0.0), ("act", 7.0), ("update", 8.5))


def test_exception_inside_a_phase_is_still_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "perf_counter", FakeClock(0.0, 2.0))
    timer = PhaseTimer()
    with pytest.raises(KeyError), timer.phase("train"):
        raise KeyError("boom")
    assert timer.totals == {"train": 2.0}


def test_summary_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "perf_counter", FakeClock(0.0, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0, 5.5))
    timer = PhaseTimer()
    for phase in ("validate", "train", "train", "checkpoint"):
        with timer.phase(phase):
            pass
    lines = timer.summary().splitlines()
    assert lines[0].split() == ["phase", "seconds", "share", "calls", "mean", "ms"]
    # The loop's phases first in their usual order, then others; shares of the 5.5 s total.
    assert lines[1].split() == ["train", "2.000", "36.4%", "2", "1000.00"]
    assert lines[2].split() == ["validate", "3.000", "54.5%", "1", "3000.00"]
    assert lines[3].split() == ["checkpoint", "0.500", "9.1%", "1", "500.00"]


def test_disabled_timer_records_nothing() -> None:
    timer = PhaseTimer(enabled=False)
    with timer.phase("train"):
        pass
    assert timer.totals == {} and timer.lap() == ()
    assert "disabled" in timer.summary()


@pytest.mark.parametrize(("level", "enabled"), [("off", False), ("minimal", False), ("normal", True), ("debug", True)])
def test_timer_runs_at_normal_and_debug(level: str, enabled: bool) -> None:
    assert PhaseTimer.from_config(TelemetryConfig(level=level)).enabled is enabled


def test_activities_on_this_machine() -> None:
    activities = profiler_activities()
    assert activities[0] == ProfilerActivity.CPU
    assert (ProfilerActivity.CUDA in activities) == torch.cuda.is_available()


def _work() -> None:
    weights = torch.randn(32, 32)
    for _ in range(3):
        weights = torch.tanh(weights @ weights)


def test_trace_written_on_cpu(tmp_path: Path) -> None:
    config = TelemetryConfig(profile=True, profile_wait=1, profile_warmup=1, profile_active=2)
    profiler = TraceProfiler.from_config(tmp_path, config)
    recorded = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
    assert [profiler.schedule(step) in recorded for step in range(5)] == [False, False, True, True, False]
    with profiler:
        for _ in range(6):
            _work()
            profiler.step()
    traces = list((tmp_path / "profile").glob("*.pt.trace.json*"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert "aten::tanh" in traces[0].read_text(encoding="utf-8")


def test_disabled_profiler_writes_nothing(tmp_path: Path) -> None:
    profiler = TraceProfiler.from_config(tmp_path, TelemetryConfig())
    assert not profiler.enabled
    with profiler:
        _work()
        profiler.step()
    assert not (tmp_path / "profile").exists()


def test_bad_window_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="active >= 1"):
        TraceProfiler(tmp_path, active=0)
