"""The host's and seeds' optimizer settings (env/optimizer.py): checks, and each task's default."""

from __future__ import annotations

import math

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
    ({"schedule": "linear"}, "schedule must be one of constant, cosine, got 'linear'"),
])
def test_optimizer_config_rejects_bad_values(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        OptimizerConfig(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("step", "warmup", "factor"),
                         [(1, 4, 0.25), (2, 4, 0.5), (4, 4, 1.0), (9, 4, 1.0), (1, 0, 1.0), (1, 1, 1.0)])
def test_warmup_factor_by_hand(step: int, warmup: int, factor: float) -> None:
    assert warmup_factor(step, warmup) == factor


@pytest.mark.parametrize(("epoch", "factor"), [(0, 1.0), (5, 0.5), (9, (1 + math.cos(math.pi * 0.9)) / 2)])
def test_the_cosine_schedule_starts_at_the_full_rate_and_ends_near_zero(epoch: int, factor: float) -> None:
    assert OptimizerConfig(schedule="cosine").schedule_factor(epoch, 10) == pytest.approx(factor)
    assert OptimizerConfig().schedule_factor(epoch, 10) == 1.0  # constant
    assert 0.0 < OptimizerConfig(schedule="cosine").schedule_factor(9, 10) < 0.03


def test_the_schedule_knows_only_the_episode_s_epochs() -> None:
    with pytest.raises(ValueError, match="epoch 10 is not one of the episode's 10 epochs"):
        OptimizerConfig(schedule="cosine").schedule_factor(10, 10)


def test_text_defaults_to_adamw_and_a_table_layers_over_the_task_default() -> None:
    text = task_optimizer_config("text")
    assert text.name == "adamw" and text.host_lr == DEFAULT_OPTIMIZERS["text"]["host_lr"]
    assert task_optimizer_config("digits") == OptimizerConfig()  # the image tasks keep SGD
    tuned = task_optimizer_config("text", {"host_lr": 5e-4})
    assert tuned.name == "adamw" and tuned.host_lr == 5e-4 and tuned.seed_lr == text.seed_lr
    assert task_optimizer_config("text", {"name": "sgd"}) == OptimizerConfig()  # no AdamW lr leaks into SGD
    with pytest.raises(ConfigError, match=r"^episode\.optimizer\.name: must be one of sgd, adamw, got 'lion'$"):
        task_optimizer_config("text", {"name": "lion"})
    with pytest.raises(ConfigError, match=r"^episode\.optimizer\.schedule: must be one of constant, cosine"):
        task_optimizer_config("digits", {"schedule": "step"})


def test_a_users_transformer_trains_with_adamw_and_other_models_with_sgd() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "own"))
    import user_tasks

    from morphogen.env.episode import MorphogenesisEpisode, task_with_host

    assert task_optimizer_config("my-task", topology="transformer") == task_optimizer_config("text")
    assert task_optimizer_config("my-task", topology="cnn") == OptimizerConfig()
    assert task_optimizer_config("digits", topology="transformer") == OptimizerConfig()  # a built-in task's own
    transformer = MorphogenesisEpisode(task_with_host(user_tasks.gpt()))
    assert transformer.optimizer_config.name == "adamw"
    regression = MorphogenesisEpisode(task_with_host(user_tasks.mlp_regression()))
    assert regression.optimizer_config == OptimizerConfig()


def test_the_summary_names_the_optimizer_its_rate_and_a_schedule_other_than_constant() -> None:
    assert OptimizerConfig().summary == "SGD lr 0.01"
    assert task_optimizer_config("text").summary == "AdamW lr 0.005"
    assert OptimizerConfig(schedule="cosine", host_lr=0.1).summary == "SGD lr 0.1 cosine"


def test_a_users_transformer_told_sgd_by_the_run_s_settings_gets_a_note_saying_so() -> None:
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "own"))
    import user_tasks

    from morphogen.commands.run import optimizer_note
    from morphogen.env.episode import task_with_host

    transformer = dataclasses.replace(task_with_host(user_tasks.gpt()), source="user_tasks:gpt")
    note = optimizer_note(transformer, OptimizerConfig(schedule="cosine"))  # a table without `name`
    assert note == 'note: the optimizer settings make this transformer train with SGD; without them, AdamW lr 0.005 ' \
        '(name = "adamw")'
    assert len(note) <= 120
    assert optimizer_note(transformer, None) == ""  # the default: AdamW, nothing to say
    assert optimizer_note(transformer, task_optimizer_config("text")) == ""
    regression = task_with_host(user_tasks.mlp_regression())
    assert optimizer_note(regression, OptimizerConfig(schedule="cosine")) == ""  # SGD is its default too
