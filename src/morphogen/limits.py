"""Upper bounds on sizes and counts a user can set, and the checks that enforce them.

The bounds keep a run on one machine of the kind morphogen targets (a workstation or one GPU node):
a typo such as `--hidden-size 1000000` (16 TB of LSTM weights) or `max_epochs = 1e12` must be refused
at load time with one line, not discovered as an out-of-memory kill hours later. Each bound is far
above anything the defaults need (4 envs, 25-30 epochs, a 512-wide policy),
so a real experiment never meets one; raise a constant here if a real one does.

`short_repr(value)` is how every error message quotes a value a user gave: cut to 80 characters and
3 levels, so that a 1 MB string or a YAML alias bomb (a list of a billion items built from a few
lines) is quoted in one short line and in microseconds.

`check_count(name, value, upper)` is for integer settings, `check_finite(name, value)` for floats
(NaN and infinity are never a usable setting: an infinite learning rate turns every weight into NaN).
Both raise `ValueError` naming the setting, the value and what is accepted, which `build_config`
turns into one `ConfigError` line with the key path.
"""

from __future__ import annotations

import datetime
import math
import numbers
import reprlib
from typing import Any

#: Largest base seed: torch, NumPy and Python all accept seeds below 2**63.
MAX_SEED = 2**63 - 1
#: Epochs in one episode (one controller step each).
MAX_EPOCHS = 100_000
#: PPO rounds of one training run.
MAX_ROUNDS = 1_000_000
#: Episodes run side by side in one training round.
MAX_ENVS = 1_024
#: Width of the policy's trunk and LSTM (4096 is ~0.5 GB of LSTM weights, ~1.5 GB with Adam state).
MAX_HIDDEN_SIZE = 4_096
#: Parameters of a host built from a `[host]` table (4 GB of float32 weights, ~12 GB with gradients
#: and momentum): `base_channels = 1000000` would ask for 72 TB.
MAX_HOST_PARAMETERS = 1_000_000_000
#: Passes over the rollout in one PPO update (`ppo.epochs`).
MAX_PPO_EPOCHS = 10_000
#: Any other integer setting: what fits in 64 bits (torch and NumPy refuse larger values with a traceback).
MAX_INTEGER_SETTING = 2**63 - 1
#: Training or validation batch size.
MAX_BATCH_SIZE = 1_048_576
#: Training samples kept by `max_train_samples`.
MAX_TRAIN_SAMPLES = 1_000_000_000
#: Episodes per controller in `morphogen eval`.
MAX_EVAL_EPISODES = 100_000
#: CPU threads torch may use (`--threads`, `OMP_NUM_THREADS`): more than any one machine has cores.
MAX_THREADS = 1_024
#: Most worker processes of `eval --jobs`.
MAX_JOBS = 1_024
#: Seconds `--dist-timeout` may wait for a silent rank (a week; torch turns larger values into overflows).
MAX_TIMEOUT_SECONDS = 604_800
#: Characters in any string setting (a path is at most 4096 bytes on Linux).
MAX_STRING_LENGTH = 4_096


def check_count(name: str, value: int, upper: int, lower: int = 1) -> None:
    """Raise `ValueError` unless `value` is an integer with `lower <= value <= upper` (the message names `name`
    and the bound broken)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy's integers too
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < lower:
        raise ValueError(f"{name} must be >= {lower}, got {value}")
    if value > upper:
        raise ValueError(f"{name} must be <= {upper:,} (a documented limit of morphogen.limits), got {value:,}")


def check_finite(name: str, value: float) -> None:
    """Raise `ValueError` if `value` is NaN or infinite."""
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")


_REPR = reprlib.Repr()  # keyword arguments need Python 3.12
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict = 3, 60, 60, 6, 6


#: Longest quote of a value in an error message (a nested list's repr, cut to 3 levels of 6 items, can
#: still be over a thousand characters).
MAX_QUOTE = 80


def short_repr(value: Any) -> str:
    """`repr(value)` cut to `MAX_QUOTE` characters and 3 levels, so an error line stays one short line
    whatever the user passed (a 1 MB string, a list nested 10,000 deep, a YAML alias bomb). A date or time (TOML
    reads `seed = 2024-01-01` as one) is quoted as written, not as Python's `datetime.date(2024, 1, 1)`."""
    if isinstance(value, datetime.date | datetime.time):
        return f"{value.isoformat()} (a {'time' if isinstance(value, datetime.time) else 'date'})"
    text = _REPR.repr(value)
    if len(text) > MAX_QUOTE:
        text = text[: MAX_QUOTE - 3] + "..."
    if isinstance(value, str) and len(value) > 60:
        text += f" ({len(value):,} characters)"
    return text
