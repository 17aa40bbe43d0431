"""The host's and seeds' optimizer settings (env/optimizer.py): checks, and each task's default."""

from __future__ import annotations

import pytest

from morphogen.config import ConfigError
from morphogen.data import DEFAULT_OPTIMIZERS
from morphogen.env.optimizer import OptimizerConfig, task_optimizer_config, warmup_factor


@pytest.mark.parametrize(("values", "message"), [
    ({"name": "adam"}, "name must be one of sgd, adamw, got 'adam'"),
    ({"betas": (0.9, 1.0)}, "betas must be two numbers in [0, 1)"),
    ({"betas": (0.9,)}, "betas must be two numbers in [0, 1)"),
    ({"eps": 0.0}, "eps must be > 0"),
    ({"host_lr": -1.0}, "host_lr must be > 0"),
    ({"seed_warmup_steps": -1}, "seed_warmup_steps must be >= 0"),
])
def test_optimizer_config_rejects_bad_values(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        OptimizerConfig(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("step", "warmup", "factor"),
                         [(1, 4, 0.25), (2, 4, 0.5), (4, 4, 1.0), (9, 4, 1.0), (1, 0, 1.0), (1, 1, 1.0)])
def test_warmup_factor_by_hand(step: int, warmup: int, factor: float) -> None:
    assert warmup_factor(step, warmup) == factor


def test_text_defaults_to_adamw_and_a_table_layers_over_the_task_default() -> None:
    text = task_optimizer_config("text")
    assert text.name == "adamw" and text.host_lr == DEFAULT_OPTIMIZERS["text"]["host_lr"]
    assert task_optimizer_config("digits") == OptimizerConfig()  # the image tasks keep SGD
    tuned = task_optimizer_config("text", {"host_lr": 5e-4})
    assert tuned.name == "adamw" and tuned.host_lr == 5e-4 and tuned.seed_lr == text.seed_lr
    assert task_optimizer_config("text", {"name": "sgd"}) == OptimizerConfig()  # no AdamW lr leaks into SGD
    with pytest.raises(ConfigError, match=r"^episode\.optimizer\.name: must be one of sgd, adamw, got 'lion'$"):
        task_optimizer_config("text", {"name": "lion"})
