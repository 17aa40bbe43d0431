"""`morphogen train`: PPO over rounds of parallel episodes, checkpointing every round; `--resume` continues."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import torch
from rich.progress import TaskID

from morphogen.commands.run import recorded_config_values, run_name, write_resolved_config
from morphogen.config import ConfigError, build_config
from morphogen.control.checkpoint import CheckpointError, load_checkpoint
from morphogen.control.distributed import (
    DistributedContext,
    DistributedTrainer,
    announce_failure,
    format_rank_times,
    rank_device,
    receive_run_directory,
    send_run_directory,
)
from morphogen.control.trainer import (
    ROUND_HEADER,
    EpisodeMeans,
    PPOTrainer,
    RoundSummary,
    TrainConfig,
    format_round,
    format_round_score,
    train,
)
from morphogen.data import Task
from morphogen.devices import resolve_device, resolve_devices
from morphogen.env.seeding import derive_seed
from morphogen.run_directory import (
    CHECKPOINT_NAME,
    CONFIG_FILENAME,
    EVENTS_FILENAME,
    IMITATION_FILENAME,
    PROFILE_DIRNAME,
    RUN_FILE_NAMES,
    TENSORBOARD_DIRNAME,
    LockPurpose,
    hold_run_directory,
    make_run_dir,
    read_json_object,
    refuse_other_run,
    remove_stale_temporaries,
    write_atomic,
)
from morphogen.session import load_session_task
from morphogen.telemetry.resume import cut_events_to_round
from morphogen.telemetry.sinks import Telemetry
from morphogen.ui.progress import ProgressDisplay
from morphogen.ui.units import counted

#: Config keys a resumed run may change besides rounds, telemetry and device: compiling changes speed, not the run.
COMPILE_KEYS = ("compile", "compile_mode", "compile_backend")
#: Stream of `derive_seed` for the global torch RNG of a training run.
GLOBAL_RNG_STREAM = 5
#: What the command fills in from the tasks it loaded, for readers (`report`, the dashboard): a run written before it
#: did has none, and resumes all the same.
TASK_KEYS = ("task_name", "task_metric")
#: The files of a `train` run that has written no checkpoint yet (`--resume` starts it again).
BEFORE_FIRST_CHECKPOINT = frozenset((CONFIG_FILENAME, EVENTS_FILENAME, IMITATION_FILENAME, TENSORBOARD_DIRNAME,
                                     PROFILE_DIRNAME))
#: Config keys in which a checkpoint may differ from its run's config.json: what `--resume` may change, and the
#: run directory, which config.json does not record.
RESUMABLE_KEYS = ("rounds", "telemetry", "device", "devices", "run_dir", *COMPILE_KEYS, *TASK_KEYS)


def config_for_resume(run_dir: str | Path, overrides: dict[str, Any]) -> tuple[TrainConfig, dict[str, Any] | None]:
    """The saved config of a run (with `rounds` possibly extended) and its checkpoint, checked before use.

    A run stopped before its first checkpoint (in its first round, or while watching the heuristic) has only its
    config.json: it comes back with no checkpoint (None) and starts again from the beginning, which plays what the
    stopped run played, since every round is drawn from (seed, round)."""
    if _stopped_before_its_first_checkpoint(Path(run_dir)):
        values = _recorded_train_config(Path(run_dir))
        state = None
    else:
        state = load_checkpoint(run_dir)
        try:
            values = json.loads(state["config"])
        except (TypeError, json.JSONDecodeError) as error:
            raise CheckpointError(f"checkpoint in {run_dir} has an unreadable config: {error}") from None
        _check_checkpoint_of_the_run(Path(run_dir), values)
    unsupported = sorted(set(overrides) - {"rounds", "telemetry", "device", "devices", *COMPILE_KEYS})
    if unsupported:
        raise ConfigError(f"--resume continues a run with its saved config; cannot change {', '.join(unsupported)}")
    telemetry = overrides.pop("telemetry", None)
    # Where the envs run does not change what they compute: a new device or device list replaces the saved one.
    if "devices" in overrides:
        values["device"] = overrides["devices"][0]
    elif "device" in overrides:
        values["devices"] = None
    values.update(overrides)
    if telemetry is not None:
        values["telemetry"] = {**values.get("telemetry", {}), **telemetry}
    values["run_dir"] = str(run_dir)
    config = build_config(TrainConfig, values)
    finished = 0 if state is None else int(state["round"])
    if finished >= config.rounds:
        asked = (f"all {config.rounds} of its rounds" if finished == config.rounds
                 else f"{finished} rounds, more than the {config.rounds} asked for")
        raise ConfigError(f"run {run_dir} already finished {asked}; pass --rounds N with N > {finished} to "
                          "continue it")
    return config, state


def _stopped_before_its_first_checkpoint(run_dir: Path) -> bool:
    """Whether `run_dir` holds the beginning of a `train` run and nothing else: its config.json, but no checkpoint,
    and no file that another command writes (a `run`, `eval` or seeds directory is left to `load_checkpoint`'s
    one line)."""
    if not run_dir.is_dir() or not (run_dir / CONFIG_FILENAME).is_file():
        return False
    present = {name for name in RUN_FILE_NAMES if os.path.lexists(run_dir / name)}
    return present <= BEFORE_FIRST_CHECKPOINT


def _recorded_train_config(run_dir: Path) -> dict[str, Any]:
    """The config.json of a `train` run that stopped before its first checkpoint; `CheckpointError` if it is not one."""
    values = read_json_object(run_dir / CONFIG_FILENAME)
    problem = "it is unreadable" if values is None else ""
    if values is not None:
        try:
            build_config(TrainConfig, {**values, "run_dir": str(run_dir)})
        except ConfigError as error:
            reason = str(error).split("; accepted")[0]  # the key that no train config has, not the list of those it has
            problem = f"it is not the config of `morphogen train` ({reason})"
    if problem:
        raise CheckpointError(f"no checkpoint at {run_dir / CHECKPOINT_NAME}, and the run cannot start again from its "
                              f"{CONFIG_FILENAME}: {problem}")
    assert values is not None, "a readable config.json"
    return values


def _check_checkpoint_of_the_run(run_dir: Path, values: dict[str, Any]) -> None:
    """`CheckpointError` unless the config `values` saved in the checkpoint of `run_dir` are those of its config.json
    (but for `RESUMABLE_KEYS`): a checkpoint copied from another run would train that run's settings here."""
    recorded = read_json_object(run_dir / CONFIG_FILENAME)
    if recorded is None:
        raise CheckpointError(f"{run_dir} has no readable {CONFIG_FILENAME}; a run to resume keeps the one "
                              "`morphogen train` wrote")
    saved = recorded_config_values(values)
    differing = sorted(key for key in set(saved) | set(recorded)
                       if key not in RESUMABLE_KEYS and saved.get(key) != recorded.get(key))
    if differing:
        raise CheckpointError(f"{run_dir / CHECKPOINT_NAME} was saved with another config than the one resuming it "
                              f"({CONFIG_FILENAME} differs in {', '.join(differing)}: was the checkpoint copied from "
                              "another run?); a resumed run keeps the config it started with")


def train_command(config: TrainConfig, *, resume_state: dict[str, Any] | None = None, resume: bool = False,
                  out: TextIO | None = None, context: DistributedContext | None = None) -> Path:
    """Train (or continue) a policy, printing one line per round to `out` (default: `sys.stdout` at call time).

    The run directory is locked for the whole command (`morphogen.run_directory`); a resumed run (`resume`, or a
    `resume_state`) first drops the events of rounds its checkpoint does not hold and the temporary files of killed
    writes. `resume` without a `resume_state` starts again from the beginning in `config.run_dir`, a run that stopped
    before its first checkpoint (`config_for_resume`).

    With a `context` (`train --distributed`, one call per rank) this rank trains its share of the envs
    (`control/distributed.py`); rank 0 alone makes, locks and writes the run directory, and tells the
    other ranks once it is ready (or why it is not, so that they stop with the same error).
    """
    out = sys.stdout if out is None else out
    resume = resume or resume_state is not None
    config = config.with_resolved_host()  # config.json and the checkpoint record the host's whole size
    device, devices = _process_devices(config, context)
    config, trainer = _prepared_trainer(config, device, devices, resume_state, context)
    if context is not None and not context.is_main:
        run_dir = Path(receive_run_directory(context))
        train(trainer, run_dir)  # no output, telemetry or checkpoint: `DistributedTrainer.save` is rank 0's
        return run_dir
    with announce_failure(context):
        if resume:
            run_dir = Path(str(config.run_dir))
        else:
            run_dir = make_run_dir(config.run_dir, config.runs_root, run_name(_run_label(config)))
    with hold_run_directory(run_dir, LockPurpose.RESUME if resume else LockPurpose.NEW_RUN):
        with announce_failure(context):
            dropped = _prepare_run_directory(trainer, config, run_dir, resuming=resume)
        if context is not None:
            send_run_directory(context, str(run_dir))
        where = f"device {device}" if devices is None else f"devices {','.join(devices)} (policy on {device})"
        _train_rounds(trainer, where, run_dir, dropped, out, context, restarted=resume and resume_state is None)
    if trainer.timer.enabled:
        print(trainer.timer.summary(), file=out)
    print(f"checkpoint: {run_dir / CHECKPOINT_NAME}", file=out)
    return run_dir


def _prepared_trainer(config: TrainConfig, device: str, devices: list[str] | None,
                      resume_state: dict[str, Any] | None,
                      context: DistributedContext | None) -> tuple[TrainConfig, PPOTrainer]:
    """The config with its tasks' names, and the trainer (its checkpoint loaded where resuming): everything that can
    fail on the user's input (slots, layout, an existing run) fails here, before any file of a run directory is
    created or written."""
    if context is not None and config.imitation.rounds:
        raise ConfigError("imitation.rounds: the imitation warm start runs in one process; "
                          "drop --distributed or set imitation.rounds = 0")
    tasks = load_mix_tasks(config, device)
    config = _with_task_names(config, tasks)
    # Training draws from generators seeded by (seed, round); the global RNG is seeded too (and saved in every
    # checkpoint, restored on resume) so that whatever may use it is replayed and checkpoints are reproducible.
    torch.manual_seed(derive_seed(config.seed, GLOBAL_RNG_STREAM))
    trainer = (PPOTrainer(config, tasks, devices=devices) if context is None else
               DistributedTrainer(config, tasks, context, devices=devices))
    if resume_state is not None:
        assert config.run_dir is not None, "config_for_resume sets run_dir"
        trainer.load_state_dict(resume_state, Path(config.run_dir))
    return config, trainer


def _with_task_names(config: TrainConfig, tasks: list[Task]) -> TrainConfig:
    """`config` with the name and score of the tasks it trains on (`task_name`, `task_metric`), where they share
    them, as `run` records its task's: `report` then shows a regression's rounds by their loss, not as accuracy."""
    names, metrics = {task.name for task in tasks}, {task.metric_name for task in tasks}
    return dataclasses.replace(config, task_name=names.pop() if len(names) == 1 else None,
                               task_metric=metrics.pop() if len(metrics) == 1 else None)


def load_mix_tasks(config: TrainConfig, device: str) -> list[Task]:
    """The task of every entry of the run's training mix, loaded on `device` with the entry's host size."""
    tasks = []
    for entry in config.training_mix():
        options = dataclasses.replace(config, task=entry.task, host=entry.host, tasks=None, mix=(),
                                      max_train_samples=entry.max_train_samples or config.max_train_samples)
        tasks.append(load_session_task(options, device))
    return tasks


def _run_label(config: TrainConfig) -> str:
    """What a training run's directory is named after: its task, or the tasks of its mix joined by '+'."""
    return "+".join(dict.fromkeys(entry.task for entry in config.training_mix()))
def _process_devices(config: TrainConfig, context: DistributedContext | None) -> tuple[str, list[str] | None]:
    """The policy's device and the devices of this process's envs (None: the policy's), a rank's own under
    `--distributed`."""
    device = resolve_device(config.device)
    devices = resolve_devices(config.devices) if config.devices else None
    if context is not None:
        device = rank_device(device, context.local_rank)
        devices = None if devices is None else [rank_device(name, context.local_rank) for name in devices]
    if devices is not None:
        device = devices[0]  # the policy, the training data and the shared batches live on the first device
    return device, devices


def _prepare_run_directory(trainer: PPOTrainer, config: TrainConfig, run_dir: Path, *, resuming: bool) -> int:
    """Write a new run's config, or cut a resumed run's events back to its checkpoint; clear the temporaries
    of killed writes. Returns the bytes of events dropped. The run directory is locked."""
    if not resuming:
        refuse_other_run(run_dir)  # again, now that no other command can start a run there
        write_resolved_config(run_dir, config)  # the whole run's config (a rank's trainer holds its share)
    remove_stale_temporaries(run_dir)
    if not resuming:
        return 0
    return cut_events_to_round(run_dir / EVENTS_FILENAME, trainer.state.next_round, imitated=trainer.state.imitated)


def _imitate(trainer: PPOTrainer, run_dir: Path, display: ProgressDisplay, epochs: TaskID | None) -> None:
    """The imitation warm start with one line per round of heuristic episodes; writes imitation.json."""
    config = trainer.config.imitation
    display.print(f"imitation: the policy watches the heuristic for {counted(config.rounds, 'round')}, then fits "
                  f"{counted(config.epochs, 'epoch')}")

    def on_round(index: int, summary: EpisodeMeans) -> None:
        display.print(f"imitation {index:3d}  return {summary.mean_return:+7.3f}  "
                      f"{format_round_score(summary.mean_final_accuracy, summary.metric_name)}  "
                      f"added {summary.mean_parameters_added:>7,.0f}  "
                      f"fossilized {summary.fossilized:.1f}  pruned {summary.pruned:.1f}")
        display.reset(epochs, description=f"imitation {index + 1} epochs" if index < config.rounds
                      else "round 1 epochs")

    statistics = trainer.imitate(on_round=on_round)
    display.print(f"imitation fit: action NLL {statistics.action_loss_before:.3f} -> {statistics.action_loss_after:.3f}"
                  f", agreement with the heuristic {100 * statistics.agreement:.1f}% of steps"
                  f", value loss {statistics.value_loss:.3f}")
    write_atomic(run_dir / IMITATION_FILENAME, (json.dumps(dataclasses.asdict(statistics), indent=2) + "\n").encode())
    trainer.save(run_dir)


def _train_rounds(trainer: PPOTrainer, where: str, run_dir: Path, dropped: int,
                  out: TextIO, context: DistributedContext | None = None, *, restarted: bool = False) -> None:
    """The round loop of `train_command` with its telemetry and progress display, in a locked `run_dir`;
    `where` says on which device(s) it runs; `restarted`: a resumed run that had saved no checkpoint."""
    config = trainer.config
    with Telemetry(run_dir, config=config.telemetry) as telemetry, ProgressDisplay(out) as display:
        trainer.attach_telemetry(telemetry, run_dir)
        first = trainer.state.next_round + 1
        envs = counted(config.n_envs, "env") if context is None else \
            f"{counted(config.n_envs * context.world_size, 'env')} on {context.world_size} ranks ({context.backend})"
        settings = ", ".join(f"{group.entry.label} ({counted(group.episode_length, 'epoch')})"
                             for group in trainer.groups)
        display.print(f"morphogen train: {'task' if len(trainer.mix) == 1 else 'mix'} {settings}, {envs} per round, "
                      f"rounds {first}..{config.rounds}, {where}")
        display.print(f"run dir: {run_dir}")
        if config.paired_baseline:  # the episodes' own returns (report, dashboard) are not net of the twin
            display.print("return: each episode's return minus its no-growth twin's (paired_baseline), what growth "
                          "added")
        if restarted:
            display.print("resume: the run stopped before its first checkpoint; it starts again from the beginning"
                          + (f" (dropped {dropped:,} bytes of {EVENTS_FILENAME})" if dropped else ""))
        elif dropped:
            checkpoint = f"round-{first - 1} checkpoint" if first > 1 else "checkpoint of the imitation warm start"
            display.print(f"resume: dropped {dropped:,} bytes of {EVENTS_FILENAME} written after the {checkpoint}")
        rounds = display.add("rounds", config.rounds - first + 1)
        epochs = display.add(f"round {first} epochs", trainer.group_of(first - 1).episode_length,
                             status=f"({counted(config.n_envs, 'env')})")
        trainer.on_step = lambda done: display.advance(epochs)

        def on_round(summary: RoundSummary) -> None:
            display.print(format_round(summary, setting=len(trainer.mix) > 1))
            if summary.rank_times is not None:
                display.print(format_rank_times(summary.rank_times))
            display.advance(rounds)
            if summary.round < config.rounds:
                display.reset(epochs, description=f"round {summary.round + 1} epochs",
                              total=trainer.group_of(summary.round).episode_length)

        with trainer.profiler:
            if config.imitation.rounds and not trainer.state.imitated:
                _imitate(trainer, run_dir, display, epochs)
            if trainer.state.next_round < config.rounds:
                display.print(ROUND_HEADER + ("  setting" if len(trainer.mix) > 1 else ""))
            train(trainer, run_dir, on_round=on_round)
