"""LSTMHealth: RMS oracles, each threshold, NaN/Inf, one sync, devices."""

from __future__ import annotations

import math

import pytest
import torch

from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.lstm_health import LSTMHealth


def _states(hidden_rows: list[list[float]], cell_rows: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    # (layers=1, batch, size), the layout of nn.LSTM states
    return torch.tensor([hidden_rows]), torch.tensor([cell_rows])


def test_rms_per_sample_by_hand() -> None:
    # h RMS: sqrt(4 * 0.25 / 4) = 0.5 and sqrt((0.09 + 0.16) / 4) = 0.25
    # c RMS: sqrt(4 * 4 / 4) = 2 and sqrt((9 + 16) / 4) = 2.5
    hidden, cell = _states([[0.5, 0.5, 0.5, 0.5], [0.3, 0.4, 0.0, 0.0]], [[2.0, 2.0, 2.0, 2.0], [3.0, 0.0, 0.0, 4.0]])
    report = LSTMHealth().check(hidden, cell)
    assert report.hidden_rms_mean == pytest.approx(0.375)
    assert report.hidden_rms_max == pytest.approx(0.5)
    assert report.cell_rms_mean == pytest.approx(2.25)
    assert report.cell_rms_max == pytest.approx(2.5)
    assert report.non_finite == 0 and not report.exploding and not report.vanishing
    event = report.event(epoch=7, env_id=-1)
    assert event.cell_rms_max == report.cell_rms_max and event.epoch == 7


def test_explosion_threshold() -> None:
    hidden, cell = _states([[0.5, 0.5]], [[3.0, 3.0]])  # cell RMS 3
    assert LSTMHealth(explosion_threshold=2.9).check(hidden, cell).exploding
    assert not LSTMHealth(explosion_threshold=3.1).check(hidden, cell).exploding


def test_vanishing_needs_every_sample_below_the_threshold() -> None:
    hidden, cell = _states([[1e-4, -1e-4], [2e-3, 0.0]], [[0.1, 0.1], [0.1, 0.1]])
    # sample RMS: 1e-4 and sqrt(4e-6 / 2) ~ 1.41e-3
    assert not LSTMHealth(vanishing_threshold=1e-3).check(hidden, cell).vanishing
    report = LSTMHealth(vanishing_threshold=1.5e-3).check(hidden, cell)
    assert report.vanishing and not report.exploding


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_entries_are_counted(bad: float) -> None:
    hidden, cell = _states([[0.5, bad]], [[bad, bad]])
    report = LSTMHealth().check(hidden, cell)
    assert report.non_finite == 3
    assert not report.vanishing


def test_thresholds_from_config() -> None:
    health = LSTMHealth.from_config(TelemetryConfig(lstm_explosion_threshold=4.0, lstm_vanishing_threshold=0.5))
    assert (health.explosion_threshold, health.vanishing_threshold) == (4.0, 0.5)


def test_one_sync_and_collect_stays_on_device(sync_calls: list[str]) -> None:
    lstm = torch.nn.LSTM(input_size=3, hidden_size=8, num_layers=2)
    _, (hidden, cell) = lstm(torch.randn(5, 4, 3))  # (seq, batch, features) -> states (2, 4, 8)
    health = LSTMHealth()
    collected = health.collect(hidden, cell)
    assert sync_calls == []
    report = health.materialize(collected)
    assert sync_calls == ["tolist"]
    expected = hidden.detach().double().pow(2).mean(-1).sqrt().max().item()
    assert report.hidden_rms_max == pytest.approx(expected, rel=1e-6)


def test_collect_on_meta_device() -> None:
    hidden = torch.zeros(1, 2, 4, device="meta")
    collected = LSTMHealth().collect(hidden, torch.zeros(1, 2, 4, device="meta"))
    assert collected.device.type == "meta" and collected.shape == (5,)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="same, non-empty last dimension"):
        LSTMHealth().collect(torch.zeros(1, 2, 4), torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="vanishing_threshold < explosion_threshold"):
        LSTMHealth(explosion_threshold=1.0, vanishing_threshold=1.0)
