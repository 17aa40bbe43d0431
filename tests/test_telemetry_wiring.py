"""Telemetry as a run uses it: an anomaly mid-episode raises the level to debug for a few epochs."""

from __future__ import annotations

from morphogen.control.controller import NoGrowthController
from morphogen.data import load_task
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.play import Controller, run_episode
from morphogen.telemetry.anomalies import Anomaly, AnomalyDetector
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.events import LayerStatistics, TelemetryLevelChanged
from morphogen.telemetry.sinks import Telemetry, read_events


class AnomalyAtEpoch(AnomalyDetector):
    """A detector that reports one crafted anomaly when the episode reaches `epoch`."""

    def __init__(self, config: TelemetryConfig, epoch_of: dict[str, int]) -> None:
        super().__init__(config)
        self.epoch_of = epoch_of
        self.calls = 0

    def check(self, ppo=None, *, gradient_norms=None):
        self.calls += 1
        if self.calls == self.epoch_of["anomaly"]:
            return [Anomaly("gradient_drift", "host gradient norm 40x its moving average", "lower the lr")]
        return []


def test_anomaly_escalates_to_debug_for_the_configured_epochs_then_returns(tmp_path):
    config = TelemetryConfig(level="normal", escalation_epochs=3)
    task = load_task("digits", max_train_samples=128)
    with Telemetry(tmp_path, config=config) as telemetry:
        episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=9), seed=0, telemetry=telemetry,
                                       detector=AnomalyAtEpoch(config, {"anomaly": 2}))
        controller: Controller = NoGrowthController()
        run_episode(episode, controller)
    history = read_events(tmp_path / "events.jsonl")
    changes = [e for e in history if isinstance(e, TelemetryLevelChanged)]
    assert [(c.from_level, c.to_level) for c in changes] == [("normal", "debug"), ("debug", "normal")]
    layer_epochs = sorted({e.epoch for e in history if isinstance(e, LayerStatistics)})
    # Raised by epoch 2's gradient report, which is then already detailed: epochs 2, 3, 4 at debug.
    assert layer_epochs == [2, 3, 4]
    assert changes[0].epoch == 2 and changes[1].epoch == 4
