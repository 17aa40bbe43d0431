"""Settings every command that runs episodes shares: which task, where, with what telemetry."""

from __future__ import annotations

from dataclasses import dataclass, field

from morphogen.limits import MAX_SEED, MAX_TRAIN_SAMPLES, check_count
from morphogen.telemetry.config import TelemetryConfig


@dataclass(frozen=True)
class SessionOptions:
    """The task, device, slots, run directory and telemetry of a `run` or `train` session."""

    #: Task name: digits, cifar10 or text.
    task: str = "digits"
    #: Base seed of host initialisation, data order and (in training) every round's randomness.
    seed: int = 0
    #: Device: cpu, cuda, cuda:N, mps, or auto (cuda when available, else cpu).
    device: str = "cpu"
    #: Slots to place (ids like r0c1); None places a slot at every injection point of the host.
    slots: tuple[str, ...] | None = None
    #: Also place slots after each pooling layer of the CNN host (ids r1c{i}).
    pool_slots: bool = False
    #: CIFAR-10 directory (torchvision's cifar-10-batches-py layout).
    data_dir: str | None = None
    #: Text file for the `text` task; default: the Python standard library's sources.
    text_file: str | None = None
    #: Cap on training samples (quick experiments); None uses the whole training split.
    max_train_samples: int | None = None
    #: Parent directory of run directories.
    runs_root: str = "runs"
    #: Exact run directory; None makes runs_root/<time>-<task>.
    run_dir: str | None = None
    #: Telemetry level, TensorBoard, profiler window, anomaly thresholds.
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def __post_init__(self) -> None:
        check_count("seed", self.seed, MAX_SEED, lower=0)
        if self.max_train_samples is not None:
            check_count("max_train_samples", self.max_train_samples, MAX_TRAIN_SAMPLES)
        if self.slots is not None and not self.slots:
            raise ValueError("slots must name at least one slot (leave it out to use every slot of the host)")
        if self.slots is not None and len(set(self.slots)) != len(self.slots):
            raise ValueError(f"slots names a slot more than once: {', '.join(self.slots)}")
