"""`morphogen train`: PPO over rounds of parallel episodes, checkpointing every round; `--resume` continues."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from morphogen.config import ConfigError, build_config
from morphogen.control.checkpoint import CHECKPOINT_NAME, CheckpointError, load_checkpoint
from morphogen.control.options import load_session_task
from morphogen.control.trainer import PPOTrainer, RoundSummary, TrainConfig, format_round, train
from morphogen.runner import make_run_dir, resolve_device, write_resolved_config
from morphogen.telemetry.sinks import Telemetry
from morphogen.ui.progress import ProgressDisplay


def config_for_resume(run_dir: str | Path, overrides: dict[str, Any]) -> tuple[TrainConfig, dict[str, Any]]:
    """The saved config of a run (with `rounds` possibly extended) and its checkpoint, checked before use."""
    state = load_checkpoint(run_dir)
    try:
        values = json.loads(state["config"])
    except (TypeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint in {run_dir} has an unreadable config: {error}") from None
    unsupported = sorted(set(overrides) - {"rounds", "telemetry", "device"})
    if unsupported:
        raise ConfigError(f"--resume continues a run with its saved config; cannot change {', '.join(unsupported)}")
    telemetry = overrides.pop("telemetry", None)
    values.update(overrides)
    if telemetry is not None:
        values["telemetry"] = {**values.get("telemetry", {}), **telemetry}
    values["run_dir"] = str(run_dir)
    config = build_config(TrainConfig, values)
    if int(state["round"]) >= config.rounds:
        raise ConfigError(f"run {run_dir} already finished {state['round']} of {config.rounds} rounds; "
                          "pass --rounds N with a larger N to continue")
    return config, state


def train_command(config: TrainConfig, *, resume_state: dict[str, Any] | None = None,
                  out: TextIO | None = None) -> Path:
    """Train (or continue) a policy, printing one line per round to `out` (default: `sys.stdout` at call time)."""
    out = sys.stdout if out is None else out
    config = config.with_resolved_host()  # config.json and the checkpoint record the host's whole size
    device = resolve_device(config.device)
    task = load_session_task(config, device)
    # Everything that can fail on the user's input (slots, layout, an existing run) fails before any file
    # of a run directory is created or written.
    trainer = PPOTrainer(config, task)
    if resume_state is not None:
        assert config.run_dir is not None, "config_for_resume sets run_dir"
        run_dir = Path(config.run_dir)
        trainer.load_state_dict(resume_state, run_dir)
    else:
        if config.run_dir is not None and (Path(config.run_dir) / CHECKPOINT_NAME).is_file():
            raise ConfigError(f"run_dir: {config.run_dir} already holds a training run ({CHECKPOINT_NAME}); "
                              f"continue it with --resume {config.run_dir} or choose another --run-dir")
        run_dir = make_run_dir(config.run_dir, config.runs_root, config.task)
        write_resolved_config(run_dir, config)
    with Telemetry(run_dir, config=config.telemetry) as telemetry, ProgressDisplay(out) as display:
        trainer.attach_telemetry(telemetry, run_dir)
        first = trainer.state.next_round + 1
        display.print(f"morphogen train: task {task.name}, {config.n_envs} envs x {config.episode_length} epochs per "
                      f"round, rounds {first}..{config.rounds}, device {device}")
        display.print(f"run dir: {run_dir}")
        rounds = display.add("rounds", config.rounds - first + 1)
        epochs = display.add(f"round {first} epochs", config.episode_length, status=f"({config.n_envs} envs)")
        trainer.on_step = lambda done: display.advance(epochs)

        def on_round(summary: RoundSummary) -> None:
            display.print(format_round(summary))
            display.advance(rounds)
            if summary.round < config.rounds:
                display.reset(epochs, description=f"round {summary.round + 1} epochs")

        with trainer.profiler:
            train(trainer, run_dir, on_round=on_round)
    if trainer.timer.enabled:
        print(trainer.timer.summary(), file=out)
    print(f"checkpoint: {run_dir / 'checkpoint.pt'}", file=out)
    return run_dir
