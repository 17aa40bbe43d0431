"""Anomaly detection over PPO diagnostics, gradient norms and LSTM state health.

One entry point, `AnomalyDetector.check()`, runs every detector (none may be left
unwired) on plain Python numbers, so it never touches a device: compute the diagnostics with one
sync first (see `LSTMHealth.materialize` and the PPO update's statistics), then check them.

Detectors and what fires them (thresholds from `TelemetryConfig`):
- non_finite: any diagnostic is NaN or infinite. A non-finite value is judged by no other detector.
- ratio_explosion / ratio_collapse: max ratio > `ratio_explosion` / min ratio < `ratio_collapse`.
- value_collapse: value std < `value_collapse_ratio` * return std while returns vary.
- entropy_collapse: a head's entropy / its maximum entropy drops below `entropy_collapse_low`.
  With hysteresis: it is reported once when the head collapses and the head stays collapsed until
  the fraction rises above `entropy_collapse_high`, so a head hovering at the threshold does not
  fire every round.
- kl_spike: approx KL > `kl_spike_factor` * target KL (skipped when there is no target).
- gradient_drift: a gradient norm > `gradient_drift_factor` * its moving average (per key).
- lstm_explosion / lstm_vanishing / lstm_non_finite: from an `LSTMHealthReport`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.drift import EMATracker
from morphogen.telemetry.lstm_health import LSTMHealth, LSTMHealthReport

ANOMALY_KINDS = (
    "non_finite",
    "ratio_explosion",
    "ratio_collapse",
    "value_collapse",
    "entropy_collapse",
    "kl_spike",
    "gradient_drift",
    "lstm_explosion",
    "lstm_vanishing",
    "lstm_non_finite",
)
"""Every kind of anomaly `AnomalyDetector.check` can report."""

POLICY_GRADIENT_KEY = "policy"
"""Key of the PPO gradient norm in the gradient-drift averages (other keys come from `gradient_norms`)."""


@dataclass(frozen=True)
class Anomaly:
    """What was seen and what a user can do about it."""

    kind: str
    """One of ANOMALY_KINDS."""
    message: str
    """What was seen, with the numbers."""
    advice: str
    """What a user can try."""

    def line(self) -> str:
        """One line for the console: kind, what was seen, and the advice."""
        return f"anomaly {self.kind}: {self.message}; {self.advice}"


@dataclass(frozen=True)
class PPODiagnostics:
    """Detached numbers of one PPO update, as plain floats (computed with one sync by the caller)."""

    ratio_max: float
    """Largest new/old action probability ratio over the update's minibatches."""
    ratio_min: float
    """Smallest new/old action probability ratio over the update's minibatches."""
    value_std: float
    """Standard deviation of the value predictions over the rollout."""
    return_std: float
    """Standard deviation of the returns (value targets) over the rollout."""
    entropy_per_head: tuple[tuple[str, float], ...]
    """(head, mean entropy in nats) per action head."""
    max_entropy_per_head: tuple[tuple[str, float], ...]
    """(head, log of the number of choices) per action head: the largest entropy it can have."""
    approx_kl: float
    """Approximate KL divergence between the old and the updated policy."""
    target_kl: float | None
    """The PPO early-stop KL target; None when the update has none (KL spikes are then not judged)."""
    grad_norm: float
    """Global L2 norm of the policy gradient before clipping."""
    lstm: LSTMHealthReport | None = None
    """Health of the policy's recurrent state after the rollout, if measured."""

    def non_finite_fields(self) -> list[str]:
        """Names of the numbers that are NaN or infinite (per-head entries as `entropy/<head>`)."""
        names = []
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                names.append(field.name)
        for label, pairs in (("entropy", self.entropy_per_head), ("max_entropy", self.max_entropy_per_head)):
            names.extend(f"{label}/{head}" for head, value in pairs if not math.isfinite(value))
        return names


class AnomalyDetector:
    """Runs every detector on one set of diagnostics; keeps the hysteresis and moving-average state."""

    def __init__(self, config: TelemetryConfig | None = None) -> None:
        self.config = config if config is not None else TelemetryConfig()
        self._gradient_averages = EMATracker(self.config.ema_momentum)
        self.lstm_health = LSTMHealth.from_config(self.config)
        """Builds the `LSTMHealthReport` for `PPODiagnostics.lstm` with this config's thresholds."""
        self._collapsed_heads: set[str] = set()

    def forget_gradients(self, prefix: str) -> None:
        """Restart the gradient-drift averages of keys starting with `prefix` (e.g. a new episode's)."""
        self._gradient_averages.forget(prefix)

    def check(
        self, ppo: PPODiagnostics | None = None, *, gradient_norms: Mapping[str, float] | None = None
    ) -> list[Anomaly]:
        """Every anomaly in one PPO update's diagnostics and/or in a set of named gradient norms.

        `gradient_norms` (e.g. {"host": 0.8, "seed/r0c1": 0.1}, once per epoch) each get their own
        moving average for the drift detector; the PPO update's `grad_norm` uses the key "policy".
        """
        anomalies: list[Anomaly] = []
        norms = dict(gradient_norms or {})
        if ppo is not None:
            anomalies += self._non_finite(ppo)
            anomalies += self._ratios(ppo)
            anomalies += self._value_collapse(ppo)
            anomalies += self._entropy_collapse(ppo)
            anomalies += self._kl_spike(ppo)
            if ppo.lstm is not None:
                anomalies += self._lstm(ppo.lstm)
            norms[POLICY_GRADIENT_KEY] = ppo.grad_norm
        anomalies += self._gradient_drift(norms)
        return anomalies

    def _non_finite(self, ppo: PPODiagnostics) -> list[Anomaly]:
        names = [name for name in ppo.non_finite_fields() if name != "grad_norm"]  # grad_norm: see drift
        if not names:
            return []
        return [
            Anomaly(
                "non_finite",
                f"PPO diagnostics {', '.join(names)} are NaN or infinite",
                "lower the learning rate and check rewards and observations for NaN/Inf; "
                "`--telemetry debug` records per-layer statistics to find the layer",
            )
        ]

    def _ratios(self, ppo: PPODiagnostics) -> list[Anomaly]:
        config, anomalies = self.config, []
        advice = "lower the learning rate, the number of PPO epochs or target_kl"
        if math.isfinite(ppo.ratio_max) and ppo.ratio_max > config.ratio_explosion:
            anomalies.append(
                Anomaly(
                    "ratio_explosion",
                    f"max PPO probability ratio {ppo.ratio_max:.3g} > {config.ratio_explosion:g}: "
                    "the policy moved far from the one that collected the data",
                    advice,
                )
            )
        if math.isfinite(ppo.ratio_min) and ppo.ratio_min < config.ratio_collapse:
            anomalies.append(
                Anomaly(
                    "ratio_collapse",
                    f"min PPO probability ratio {ppo.ratio_min:.3g} < {config.ratio_collapse:g}: "
                    "actions the data relies on became nearly impossible",
                    advice,
                )
            )
        return anomalies

    def _value_collapse(self, ppo: PPODiagnostics) -> list[Anomaly]:
        config = self.config
        if not (math.isfinite(ppo.value_std) and math.isfinite(ppo.return_std)):
            return []
        if ppo.return_std <= config.value_collapse_min_return_std:
            return []
        if ppo.value_std >= config.value_collapse_ratio * ppo.return_std:
            return []
        return [
            Anomaly(
                "value_collapse",
                f"value predictions barely vary (std {ppo.value_std:.3g}) while returns do (std {ppo.return_std:.3g})",
                "check the value normalizer and the value loss coefficient; lower the learning rate",
            )
        ]

    def _entropy_collapse(self, ppo: PPODiagnostics) -> list[Anomaly]:
        config, anomalies = self.config, []
        maxima = dict(ppo.max_entropy_per_head)
        for head, entropy in ppo.entropy_per_head:
            maximum = maxima.get(head)
            if maximum is None or not (maximum > 0.0 and math.isfinite(maximum) and math.isfinite(entropy)):
                continue  # a head with a single choice has no entropy to lose
            fraction = entropy / maximum
            if head in self._collapsed_heads:
                if fraction > config.entropy_collapse_high:
                    self._collapsed_heads.discard(head)
            elif fraction < config.entropy_collapse_low:
                self._collapsed_heads.add(head)
                anomalies.append(
                    Anomaly(
                        "entropy_collapse",
                        f"entropy of head {head!r} fell to {fraction:.1%} of its maximum "
                        f"(< {config.entropy_collapse_low:.0%}): it always picks the same choice",
                        f"raise the entropy coefficient or the weight of head {head!r}, or slow its annealing",
                    )
                )
        return anomalies

    def _kl_spike(self, ppo: PPODiagnostics) -> list[Anomaly]:
        config = self.config
        if ppo.target_kl is None or not math.isfinite(ppo.approx_kl):
            return []
        limit = config.kl_spike_factor * ppo.target_kl
        if ppo.approx_kl <= limit:
            return []
        return [
            Anomaly(
                "kl_spike",
                f"approximate KL {ppo.approx_kl:.3g} > {config.kl_spike_factor:g} x target {ppo.target_kl:g}",
                "lower the learning rate or the number of PPO epochs (or minibatches per epoch)",
            )
        ]

    def _gradient_drift(self, norms: Mapping[str, float]) -> list[Anomaly]:
        config, anomalies = self.config, []
        for key, norm in norms.items():
            if not math.isfinite(norm):
                anomalies.append(
                    Anomaly(
                        "non_finite",
                        f"{key} gradient norm is {norm}",
                        "lower the learning rate or the gradient clip; check the loss for NaN/Inf",
                    )
                )
                self._gradient_averages.update(norm, key)  # reported, not folded into the average
                continue
            judged = self._gradient_averages.count(key) >= config.gradient_drift_warmup
            average = self._gradient_averages.average(key)
            ratio = self._gradient_averages.update(norm, key)
            if judged and ratio > config.gradient_drift_factor:
                anomalies.append(
                    Anomaly(
                        "gradient_drift",
                        f"{key} gradient norm {norm:.3g} is {ratio:.1f}x its moving average {average:.3g}",
                        "lower the learning rate or the gradient clip; look for an outlier batch or reward",
                    )
                )
        return anomalies

    def _lstm(self, report: LSTMHealthReport) -> list[Anomaly]:
        if report.non_finite:
            return [
                Anomaly(
                    "lstm_non_finite",
                    f"{report.non_finite} NaN/Inf entries in the policy LSTM state",
                    "lower the learning rate; check observations for NaN/Inf and the observation normalizer",
                )
            ]
        anomalies = []
        if report.exploding:
            anomalies.append(
                Anomaly(
                    "lstm_explosion",
                    f"policy LSTM state RMS reached {max(report.hidden_rms_max, report.cell_rms_max):.3g} "
                    f"(> {self.lstm_health.explosion_threshold:g})",
                    "lower the learning rate or the gradient clip; shorter episodes bound the cell state",
                )
            )
        if report.vanishing:
            anomalies.append(
                Anomaly(
                    "lstm_vanishing",
                    f"policy LSTM hidden state RMS is at most {report.hidden_rms_max:.3g} for every sample "
                    f"(< {self.lstm_health.vanishing_threshold:g}): the policy ignores its memory",
                    "check the LSTM initialization and the learning rate",
                )
            )
        return anomalies

    def state_dict(self) -> dict[str, Any]:
        """Hysteresis (collapsed heads) and the gradient-norm moving averages."""
        return {
            "collapsed_heads": sorted(self._collapsed_heads),
            "gradient_averages": self._gradient_averages.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self._collapsed_heads = {str(head) for head in state["collapsed_heads"]}
        self._gradient_averages.load_state_dict(state["gradient_averages"])
