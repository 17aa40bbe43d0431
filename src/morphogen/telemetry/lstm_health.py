"""Health of an LSTM's recurrent state (h, c): explosion, vanishing, and non-finite entries.

Sizes are measured as the root mean square (RMS) of each sample's state vector, so thresholds do
not depend on the hidden size. h = o * tanh(c) is bounded by 1 per entry, so in practice explosion
shows in the cell state c, whose entries grow by up to 1 per step when the forget gate saturates.

Rules:
- `collect()` computes every number on the states' device without synchronizing.
- `materialize()` converts them with ONE host sync.
- Do not check the initial state of an episode: it is zeros by design and would read as vanishing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.events import LSTMHealthMeasured


@dataclass(frozen=True)
class LSTMHealthReport:
    """Sizes of h and c (RMS per sample, mean and max over samples) and what they mean."""

    hidden_rms_mean: float
    hidden_rms_max: float
    cell_rms_mean: float
    cell_rms_max: float
    non_finite: int
    """Number of NaN or infinite entries over h and c."""
    exploding: bool
    """Some sample's h or c RMS exceeds the explosion threshold."""
    vanishing: bool
    """Every sample's h RMS is below the vanishing threshold: the LSTM outputs (almost) nothing."""

    def event(self, *, epoch: int, env_id: int) -> LSTMHealthMeasured:
        """This report as a telemetry event."""
        return LSTMHealthMeasured(
            epoch=epoch,
            env_id=env_id,
            hidden_rms_mean=self.hidden_rms_mean,
            hidden_rms_max=self.hidden_rms_max,
            cell_rms_mean=self.cell_rms_mean,
            cell_rms_max=self.cell_rms_max,
            non_finite=self.non_finite,
        )


class LSTMHealth:
    """Checks (h, c) recurrent states against explosion and vanishing thresholds on their RMS."""

    def __init__(self, *, explosion_threshold: float = 10.0, vanishing_threshold: float = 1e-3) -> None:
        if not 0.0 <= vanishing_threshold < explosion_threshold:
            raise ValueError(
                "need 0 <= vanishing_threshold < explosion_threshold; got "
                f"vanishing_threshold={vanishing_threshold}, explosion_threshold={explosion_threshold}"
            )
        self.explosion_threshold = explosion_threshold
        self.vanishing_threshold = vanishing_threshold

    @classmethod
    def from_config(cls, config: TelemetryConfig) -> LSTMHealth:
        """Thresholds `lstm_explosion_threshold` and `lstm_vanishing_threshold` of `config`."""
        return cls(
            explosion_threshold=config.lstm_explosion_threshold,
            vanishing_threshold=config.lstm_vanishing_threshold,
        )

    @torch.no_grad()
    def collect(self, hidden: Tensor, cell: Tensor) -> Tensor:
        """[h RMS mean, h RMS max, c RMS mean, c RMS max, non-finite count] as float32 on h's device. No sync.

        `hidden` and `cell` have the layout of `nn.LSTM` states, (layers, batch, size), or any
        shape whose last dimension is the state size; every other dimension counts as samples.
        """
        if hidden.shape[-1:] != cell.shape[-1:] or hidden.numel() == 0:
            raise ValueError(
                "hidden and cell states need the same, non-empty last dimension; got shapes "
                f"{tuple(hidden.shape)} and {tuple(cell.shape)}"
            )
        cell = cell.to(hidden.device)
        hidden_rms = _rms_per_sample(hidden)  # (samples,)
        cell_rms = _rms_per_sample(cell)  # (samples,)
        non_finite = (~torch.isfinite(hidden)).sum() + (~torch.isfinite(cell)).sum()
        return torch.stack(
            [hidden_rms.mean(), hidden_rms.max(), cell_rms.mean(), cell_rms.max(), non_finite.float()]
        )

    def materialize(self, collected: Tensor) -> LSTMHealthReport:
        """Turn what `collect` returned into a report. Synchronizes with the device, once."""
        hidden_mean, hidden_max, cell_mean, cell_max, non_finite = collected.tolist()  # the one sync
        return LSTMHealthReport(
            hidden_rms_mean=hidden_mean,
            hidden_rms_max=hidden_max,
            cell_rms_mean=cell_mean,
            cell_rms_max=cell_max,
            non_finite=int(non_finite),
            # NaN compares False: a NaN state is reported by `non_finite`, not as exploding or vanishing.
            exploding=hidden_max > self.explosion_threshold or cell_max > self.explosion_threshold,
            vanishing=hidden_max < self.vanishing_threshold,
        )

    def check(self, hidden: Tensor, cell: Tensor) -> LSTMHealthReport:
        """`materialize(collect(hidden, cell))`: one host sync."""
        return self.materialize(self.collect(hidden, cell))


def _rms_per_sample(state: Tensor) -> Tensor:
    """Root mean square over the last dimension, in float32 (float64 stays float64)."""
    dtype = torch.float64 if state.dtype == torch.float64 else torch.float32
    flat = state.reshape(-1, state.shape[-1]).to(dtype)  # (samples, size)
    return flat.square().mean(dim=-1).sqrt().float()  # (samples,)
