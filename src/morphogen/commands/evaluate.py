"""`morphogen eval`: the learned policy, the heuristic and no growth on the same fresh seeds.

The policy acts on any task and host (`control/growth_policy.py`): `task`, `[host]`, slots and the episode
length are chosen as `morphogen run` chooses them; left out, eval plays the first setting the policy
trained on. `--policy default` is the policy shipped in the package (`DEFAULT_POLICY_FILE`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TextIO

import torch

from morphogen.commands.run import recorded_config_values, write_resolved_config
from morphogen.commands.run_policy import DEFAULT_POLICY, check_same_policy, recorded_policy_path
from morphogen.commands.run_state import cut_events, read_resume_state, remove_resume_state, write_resume_state
from morphogen.commands.workers import WorkerJob, spawned_workers
from morphogen.config import build_config, config_to_dict
from morphogen.control.checkpoint import CheckpointError, checkpoint_path, load_checkpoint
from morphogen.control.controller import NoGrowthController
from morphogen.control.heuristic import HeuristicController
from morphogen.control.integrity import state_checksum
from morphogen.control.learned import PolicyAgent, PolicyController, agent_from_checkpoint
from morphogen.control.trainer import TrainConfig
from morphogen.core.compilation import CompileSettings
from morphogen.data.tasks import Task
from morphogen.devices import resolve_device
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.optimizer import OptimizerConfig, task_optimizer_config
from morphogen.env.play import Controller, run_episode
from morphogen.env.seeding import derive_seed, seeded
from morphogen.limits import MAX_EPOCHS, MAX_EVAL_EPISODES, MAX_JOBS, MAX_SEED, MAX_TRAIN_SAMPLES, check_count
from morphogen.paired_statistics import format_mean_std
from morphogen.run_directory import (
    CHECKPOINT_NAME,
    CONFIG_FILENAME,
    EVAL_RESUME_FILENAME,
    EVENTS_FILENAME,
    RESUME_FILENAME,
    SCORES_FILENAME,
    SUMMARY_FILENAME,
    LockPurpose,
    RunDirectoryRefused,
    evaluation_env_id,
    hold_run_directory,
    make_run_dir,
    refuse_other_run,
    remove_stale_temporaries,
    write_atomic,
)
from morphogen.session import CompileOptions, check_task_host, load_session_task
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.events import Event
from morphogen.telemetry.sinks import Telemetry
from morphogen.telemetry.story import NEGATIVE_LOSS
from morphogen.ui.progress import ProgressDisplay
from morphogen.ui.terminal_text import printable
from morphogen.ui.units import counted
from morphogen.user_paths import expand_path_settings

#: Evaluation seeds are drawn from a stream the training rounds never use.
EVALUATION_STREAM = 99_991
CONTROLLERS = ("learned", "heuristic", "no growth")
#: `--policy default` (`DEFAULT_POLICY`): the policy trained by the project on the built-in mix, shipped in the package
#: (README).
DEFAULT_POLICY_FILE = Path(__file__).resolve().parents[1] / "control" / "default_policy.pt"


@dataclass(frozen=True)
class EvalConfig(CompileOptions):
    """Settings of `morphogen eval` (file keys and CLI flags share these names)."""

    #: Run directory (or checkpoint file) of `morphogen train` whose policy is evaluated; "default" for the
    #: policy shipped in the package.
    policy: str = ""
    #: Task to play (as `task` of `morphogen run`); None plays the first task the policy trained on, with its host.
    task: str | None = None
    #: Host size arguments changed from the task's defaults (a `[host]` table).
    host: dict[str, int] = field(default_factory=dict)
    #: Epochs per episode; None: the policy's training episode length (of that first setting).
    episode_length: int | None = None
    #: Slots to place (ids like r0c1); None places a slot at every injection point of the host.
    slots: tuple[str, ...] | None = None
    #: Also place slots after each pooling layer of the CNN host (ids r1c{i}).
    pool_slots: bool = False
    #: CIFAR-10 directory (torchvision's cifar-10-batches-py layout).
    data_dir: str | None = None
    #: Text file for the `text` task.
    text_file: str | None = None
    #: Cap on training samples; None uses the whole training split.
    max_train_samples: int | None = None
    #: How host and seeds train in the played episodes (an `[optimizer]` table: the keys of `run`'s
    #: `[episode.optimizer]`, over `task`'s default optimizer); None: the policy's training optimizer on the
    #: task it trained on, else the task's default.
    optimizer: OptimizerConfig | None = None
    #: Episodes per controller.
    episodes: int = 5
    #: Base of the evaluation seeds (drawn from a stream the training rounds never use).
    seed: int = 0
    #: Device: cpu, cuda, cuda:N, mps, or auto.
    device: str = "cpu"
    #: Worker processes playing episodes side by side (1: all in this process). Each takes `--threads` threads;
    #: results are the same for any number.
    jobs: int = 1
    #: Where to record the evaluation (config, events of every episode, the table as eval.json); None
    #: records nothing. In events, the episode `i` of controller `c` (order learned, heuristic, no
    #: growth) has `env_id = c * episodes + i`.
    run_dir: str | None = None
    #: Telemetry level and thresholds of the recorded episodes (used only with `run_dir`).
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    #: The played task's own name and what its score is, filled in by `eval` from the task it loaded (that of the
    #: policy's first setting where `task` is None), as `run` records them; reports show them. Setting them
    #: changes nothing else.
    task_name: str | None = None
    task_metric: str | None = None
    #: Run the hosts' training forward and the policy's forward under torch.compile (as `train --compile`).
    compile: bool = False
    #: torch.compile mode: auto (reduce-overhead on CUDA, default elsewhere), default, reduce-overhead,
    #: max-autotune or max-autotune-no-cudagraphs.
    compile_mode: str = "auto"
    #: torch.compile backend: inductor, or aot_eager / eager to tell a compiler problem from a model problem.
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        expand_path_settings(self, ("policy", "data_dir", "text_file", "run_dir"))
        self.check_compile_options()
        if not self.policy:
            raise ValueError("policy must name the run directory of `morphogen train` (--policy RUN_DIR), or be "
                             "default")
        check_count("episodes", self.episodes, MAX_EVAL_EPISODES)
        check_count("jobs", self.jobs, MAX_JOBS)
        # An empty path is the current directory: the evaluation's files would be written among the user's own.
        if self.run_dir is not None and not self.run_dir.strip():
            raise ValueError(f"run_dir must name a directory, got {self.run_dir!r} (leave it out to record nothing)")
        check_count("seed", self.seed, MAX_SEED, lower=0)
        if self.task is not None:
            check_task_host(self.task, self.host, self.max_train_samples)
        elif self.host:
            raise ValueError("host: a [host] table sizes the host of `task`; name the task too")
        elif self.optimizer is not None:
            raise ValueError("optimizer: an [optimizer] table says how the hosts of `task` train; name the task too")
        if self.episode_length is not None:
            check_count("episode_length", self.episode_length, MAX_EPOCHS)
        if self.max_train_samples is not None:
            check_count("max_train_samples", self.max_train_samples, MAX_TRAIN_SAMPLES)


@dataclass(frozen=True)
class ControllerScores:
    name: str
    accuracies: tuple[float, ...]
    added: tuple[float, ...]
    gain_per_thousand: tuple[float, ...]
    fossilized: tuple[float, ...]
    pruned: tuple[float, ...]
    losses: tuple[float, ...] = ()
    """Final validation losses (what a task with its own loss is compared by)."""


def policy_source(policy: str) -> Path:
    """The checkpoint `policy` names: a run directory of `morphogen train`, a checkpoint file, or "default"."""
    return DEFAULT_POLICY_FILE if policy == DEFAULT_POLICY else checkpoint_path(policy)


def read_policy_run(policy: str | Path, device: str) -> tuple[TrainConfig, dict[str, Any]]:
    """The training config and checkpoint of a policy (see `policy_source`)."""
    source = policy_source(str(policy))
    state = load_checkpoint(source, map_location=device)
    try:
        values = json.loads(state["config"])
    except (TypeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint {source} has an unreadable config: {error}") from None
    values["device"] = device
    values["devices"] = None  # evaluation plays on `device`, whatever devices the policy was trained on
    values["run_dir"] = None
    return build_config(TrainConfig, values), state


def evaluation_setting(config: EvalConfig, trained: TrainConfig) -> tuple[TrainConfig, EpisodeConfig]:
    """The session options (task, host, slots, data) and episode settings `eval` plays: those of `config`, or,
    for what it leaves out, the first setting the policy trained on.

    The episode keeps the policy's training settings (gates, reward, governor) at the chosen length; on another
    task than it trained on (any task of its training mix), the host trains with that task's default optimizer,
    and with `config.optimizer` where given."""
    mix = trained.training_mix()
    first = mix[0]
    task, host = (first.task, first.host) if config.task is None else (config.task, config.host)
    session = dataclasses.replace(
        trained, task=task, host=host, tasks=None, mix=(), slots=config.slots, pool_slots=config.pool_slots,
        data_dir=config.data_dir or trained.data_dir, text_file=config.text_file or trained.text_file,
        max_train_samples=config.max_train_samples if config.task is not None else
        first.max_train_samples or trained.max_train_samples)
    length = config.episode_length or first.episode_length or trained.episode_length
    optimizer = (config.optimizer if config.optimizer is not None else
                 trained.episode.optimizer if task in {entry.task for entry in mix} else None)
    return session, dataclasses.replace(trained.episode, max_epochs=length, optimizer=optimizer)


def _mean_std(values: tuple[float, ...], number: str = "8.2f", spread_number: str = "5.2f") -> str:
    """Mean ± sample std (`format_mean_std`) of an episode figure, `12.34 ±  0.56`; one episode has no spread:
    `12.34 ±   n/a`."""
    return format_mean_std(values, number, spread_number) if values else "-"


def _mean_std_count(values: tuple[float, ...]) -> str:
    """Mean ± std of counts (parameters), as whole numbers with thousands separators: `5,328 ± 120`."""
    return _mean_std(values, "8,.0f", "5,.0f")


class _Played(NamedTuple):
    """What the comparison reads of one played episode."""

    final_accuracy: float
    final_loss: float
    parameters: int
    host_parameters: int
    fossilized: int
    pruned: int


@dataclass(frozen=True)
class _Setting:
    """What every episode of an evaluation plays, built once per process from its config."""

    config: EvalConfig
    session: TrainConfig
    episode: EpisodeConfig
    task: Task
    agent: PolicyAgent
    policy_checksum: str
    """`policy_checksum` of the checkpoint `agent` was read from: a resumed evaluation goes on with those weights."""


def _setting(config: EvalConfig, optimizer_table: Mapping[str, Any] | None = None) -> _Setting:
    """The policy, task and episode settings `config` names (`optimizer_table`: see `evaluate_command`)."""
    device = resolve_device(config.device)
    trained, state = read_policy_run(config.policy, device)
    session, episode_config = evaluation_setting(config, trained)
    task = load_session_task(session.with_resolved_host(), device)
    if optimizer_table is not None:
        optimizer = task_optimizer_config(task.name, optimizer_table, "optimizer", topology=task.topology)
        config = dataclasses.replace(config, optimizer=optimizer)
        episode_config = dataclasses.replace(episode_config, optimizer=optimizer)
    # Every episode builds this model: an unknown slot fails here, before the evaluation's run directory is made.
    MorphogenesisEpisode(task, episode_config, slots=session.slots, pool_slots=session.pool_slots).build_model()
    agent = agent_from_checkpoint(state, device, source=policy_source(config.policy))
    agent.policy.compile_forward(config.compile_settings)
    return _Setting(config, session, episode_config, task, agent, policy_checksum(state))


class _EventList:
    """A telemetry sink keeping an episode's events, written to the run's events file once the episode is over
    (an episode played in a worker process), or at once to `forward_to` (one played in this process: the live
    dashboard sees it as it goes)."""

    def __init__(self, forward_to: Telemetry | None = None) -> None:
        self.events: list[Event] = []
        self.forward_to = forward_to

    def write(self, event: Event) -> None:
        if self.forward_to is not None:
            self.forward_to.write(event)
        else:
            self.events.append(event)

    def close(self) -> None:
        """Nothing to close: the events stay for the caller."""


def _play(setting: _Setting, index: int, position: int,
          forward_to: Telemetry | None = None) -> tuple[_Played, list[Event]]:
    """Episode `index` of controller `CONTROLLERS[position]`, and the events it emitted (none when they went to
    `forward_to` as they came).

    An episode depends on nothing played before it, so that episodes can be played in any process and order:
    torch's global generator (dropout in a user's model draws from it) starts from the episode's seed, and the
    telemetry's escalation from the configured level."""
    config, name = setting.config, CONTROLLERS[position]
    seed = derive_seed(config.seed, EVALUATION_STREAM, index)
    recorded = _EventList(forward_to)
    telemetry = Telemetry(None, config=dataclasses.replace(config.telemetry, tensorboard=False), sinks=[recorded]) \
        if config.run_dir is not None else Telemetry(None, level="off")
    with telemetry, seeded(seed, torch.device(resolve_device(config.device))):
        episode = MorphogenesisEpisode(setting.task, setting.episode, seed=seed, slots=setting.session.slots,
                                       pool_slots=setting.session.pool_slots, telemetry=telemetry,
                                       env_id=evaluation_env_id(position, index, config.episodes))
        episode.compile_settings = config.compile_settings
        episode.reset()  # the heuristic reads the action space the model's slots make
        controller: Controller = PolicyController(setting.agent) if name == "learned" else \
            HeuristicController(episode.action_space, setting.task.topology) if name == "heuristic" else \
            NoGrowthController()
        outcome = run_episode(episode, controller)
    played = _Played(outcome.final_accuracy, outcome.final_loss, outcome.parameters, outcome.host_parameters,
                     episode.fossilized, episode.pruned)
    return played, recorded.events


#: The evaluation a worker process of `--jobs` plays episodes of (set once per process by `_start_worker`).
_worker_setting: _Setting | None = None


def _start_worker(config: EvalConfig) -> None:
    """Build the evaluation's setting in a worker process."""
    global _worker_setting
    _worker_setting = _setting(config)


def _play_in_worker(job: tuple[int, int]) -> tuple[_Played, list[Event]]:
    assert _worker_setting is not None, "a worker plays only after _start_worker"
    return _play(_worker_setting, *job)


def _played_in_order(setting: _Setting, jobs: list[tuple[int, int]], telemetry: Telemetry,
                     stack: contextlib.ExitStack) -> Iterator[tuple[_Played, list[Event]]]:
    """The outcome and events of each of `jobs` (episode index, controller position), in their order: played here
    one after another (their events written to `telemetry` as they come, none returned), or by `config.jobs` worker
    processes."""
    if setting.config.jobs == 1 or len(jobs) <= 1:
        return (_play(setting, *job, forward_to=telemetry) for job in jobs)
    # Each worker with torch's threads of this process.
    pool = stack.enter_context(spawned_workers(min(setting.config.jobs, len(jobs)), torch.get_num_threads(),
                                               _start_worker, (setting.config,)))
    return pool.map(WorkerJob(_play_in_worker), jobs)


def evaluate_command(config: EvalConfig, out: TextIO | None = None, *,
                     optimizer_table: Mapping[str, Any] | None = None, resume: bool = False) -> list[ControllerScores]:
    """Play `config.episodes` fresh seeds with each controller and print the comparison table to `out`
    (default: `sys.stdout` at call time); with `config.run_dir`, record everything there too, and save after every
    episode what `resume` goes on from (an evaluation in `config.run_dir` stopped before its table).

    `optimizer_table`: an `[optimizer]` table that names no optimizer, for a task of the user's own, to lay over
    that task's default (AdamW for a transformer) once it is loaded; it replaces `config.optimizer`."""
    out = sys.stdout if out is None else out
    setting = _setting(config, optimizer_table)
    task = setting.task
    config = dataclasses.replace(setting.config, task_name=task.name, task_metric=task.metric_name)
    with contextlib.ExitStack() as stack:
        record = _open_record(config, setting.session.task, setting.policy_checksum, resume, stack)
        display = stack.enter_context(ProgressDisplay(out))
        display.print(f"morphogen eval: {counted(config.episodes, 'episode')} of "
                      f"{counted(setting.episode.max_epochs, 'epoch')} on {printable(task.name)} "
                      f"({task.topology} host), policy {config.policy}"
                      + (f", {config.jobs} processes" if config.jobs > 1 else ""))
        bar = display.add("episodes", config.episodes * len(CONTROLLERS))
        played = record.played
        if resume:
            display.print(f"resume: {len(played)} of {config.episodes * len(CONTROLLERS)} episodes played "
                          f"({config.episodes} for each of {', '.join(CONTROLLERS)})")
            display.advance(bar, len(played))
        jobs = [(index, position) for index in range(config.episodes) for position in range(len(CONTROLLERS))]
        jobs = jobs[len(played):]
        outcomes = _played_in_order(setting, jobs, record.telemetry, stack)
        for (index, position), (result, events) in zip(jobs, outcomes, strict=True):
            for event in events:
                record.telemetry.write(event)
            played.append(result)
            record.save()
            display.advance(bar, status=CONTROLLERS[position])
            if position == len(CONTROLLERS) - 1:
                line = "  ".join(f"{name} {_final(result, task.metric_name)}"
                                 for name, result in zip(CONTROLLERS, played[-len(CONTROLLERS):], strict=True))
                seed = derive_seed(config.seed, EVALUATION_STREAM, index)
                display.print(f"episode {index + 1}/{config.episodes} (seed {seed}): {line}")
    scores = _scores({name: played[position::len(CONTROLLERS)] for position, name in enumerate(CONTROLLERS)})
    if task.metric_name == "accuracy":
        _print_table(scores, out)
    else:
        _print_loss_table(scores, out)
    if record.run_dir is not None:
        table = [config_to_dict(score) for score in scores]
        write_atomic(record.run_dir / SCORES_FILENAME, (json.dumps(table, indent=2) + "\n").encode())
        remove_resume_state(record.run_dir / EVAL_RESUME_FILENAME)  # the evaluation is whole: nothing to resume
        print(f"recorded in {record.run_dir}", file=out)
    return scores


@dataclass
class _Record:
    """Where an evaluation is recorded (`run_dir` None: nowhere), the episodes it has played and its telemetry."""

    run_dir: Path | None
    config: str
    """The evaluation's config as JSON text: a saved state is resumed only by the same evaluation."""
    played: list[_Played]
    telemetry: Telemetry
    policy_checksum: str = ""
    """`policy_checksum` of the policy played, saved with the episodes (see `_open_record`)."""

    def save(self) -> None:
        """Save what `eval --resume` goes on from: the scores of the episodes played (each episode depends on nothing
        played before it, `_play`)."""
        if self.run_dir is None:
            return
        events = self.run_dir / EVENTS_FILENAME if self.telemetry.configured_level != "off" else None
        state = {"played": [list(result) for result in self.played], "policy_checksum": self.policy_checksum}
        write_resume_state(self.run_dir / EVAL_RESUME_FILENAME, state, kind="eval", config=self.config, events=events)


def _open_record(config: EvalConfig, task_name: str, checksum: str, resume: bool,
                 stack: contextlib.ExitStack) -> _Record:
    """The evaluation's record, its run directory locked (one writer per directory) and its telemetry open on
    `stack`; resuming, the episodes played before, their events cut back to the last saved episode.

    config.json records the policy's path absolute (as `run` does), so `eval --config DIR/config.json` and
    `eval --resume DIR` find it from any directory; a resume refuses a policy whose weights (`checksum`) are not
    those the saved episodes were played with, say a `train` run continued in between."""
    config = dataclasses.replace(config, policy=recorded_policy_path(config.policy))
    text = _config_text(config)
    if config.run_dir is None:
        return _Record(None, text, [], stack.enter_context(Telemetry(None, config=TelemetryConfig(level="off"))))
    run_dir = resumable_eval_dir(config.run_dir) if resume else make_run_dir(config.run_dir, "runs", task_name)
    stack.enter_context(hold_run_directory(run_dir, LockPurpose.RESUME if resume else LockPurpose.NEW_RUN))
    state = None
    if resume:  # again, now that no other command can finish it
        resumable_eval_dir(config.run_dir)
        remove_stale_temporaries(run_dir)
        state = read_resume_state(run_dir / EVAL_RESUME_FILENAME, kind="eval", config=text, required=("played",))
        if state is not None:
            _refuse_other_weights(run_dir, config.policy, state.get("policy_checksum"), checksum)
        cut_events(run_dir / EVENTS_FILENAME, state)
    else:
        refuse_other_run(run_dir)  # again, now that no other command can start a run there
        write_resolved_config(run_dir, config)  # no run_dir in it, as `run`'s: a replay records where it is told
    telemetry = stack.enter_context(Telemetry(run_dir, config=config.telemetry))
    if state is None:
        return _Record(run_dir, text, [], telemetry, checksum)
    return _Record(run_dir, text, _saved_episodes(state, config.episodes, run_dir / EVAL_RESUME_FILENAME), telemetry,
                   checksum)


def _refuse_other_weights(run_dir: Path, policy: str, saved: object, checksum: str) -> None:
    """`CheckpointError` naming both unless the policy `policy` now holds the weights (`checksum`) that the episodes
    saved in `run_dir` were played with (`saved`; a state saved before it was recorded passes)."""
    if saved is not None:
        check_same_policy(f"the evaluation in {run_dir}", policy, saved, policy, checksum,
                          advice="was its `train` run continued? evaluate the new weights afresh in another --run-dir")


def _saved_episodes(state: dict[str, Any], episodes: int, path: Path) -> list[_Played]:
    """The played episodes of a resume state, each checked to be of the right kinds; `CheckpointError` if not."""
    saved = state["played"]
    if not isinstance(saved, list) or len(saved) > episodes * len(CONTROLLERS) or not all(map(_is_played, saved)):
        raise CheckpointError(f"{path} is not the resume state of a morphogen eval of {episodes} episodes: its "
                              "episodes are of the wrong kind")
    return [_Played(*entry) for entry in saved]


def _is_played(entry: object) -> bool:
    """Whether `entry` is a saved `_Played`: two floats, then four integers."""
    kinds = (float, float, int, int, int, int)
    return isinstance(entry, list) and len(entry) == len(kinds) and all(
        isinstance(value, kind) and not isinstance(value, bool) for value, kind in zip(entry, kinds, strict=True))


def resumable_eval_dir(run_dir: str) -> Path:
    """The directory of an evaluation that `eval --resume` can continue; `RunDirectoryRefused` naming why not."""
    path = Path(run_dir)
    if not (path / CONFIG_FILENAME).is_file() or (not os.path.lexists(path / EVAL_RESUME_FILENAME) and any(
            os.path.lexists(path / name) for name in (SUMMARY_FILENAME, RESUME_FILENAME, CHECKPOINT_NAME))):
        raise RunDirectoryRefused(f"{path} holds no evaluation of `morphogen eval --run-dir` to resume")
    if os.path.lexists(path / SCORES_FILENAME):
        raise RunDirectoryRefused(f"the evaluation in {path} is finished ({SCORES_FILENAME} is written); nothing to "
                                  "resume")
    return path


def _config_text(config: EvalConfig) -> str:
    """`config` as JSON text without where and how it runs (`run_dir`, `device`, `jobs`: a resumed evaluation may
    move) and what it fills in for readers (`task_name`, `task_metric`: an evaluation recorded before it did has
    none)."""
    values = recorded_config_values(config_to_dict(config))  # the data paths absolute, as config.json has them
    for key in ("run_dir", "device", "jobs", "task_name", "task_metric"):
        values.pop(key, None)
    return json.dumps(values, sort_keys=True)


def _scores(outcomes: dict[str, list[_Played]]) -> list[ControllerScores]:
    baseline = [o.final_accuracy for o in outcomes["no growth"]]
    scores = []
    for name in CONTROLLERS:
        runs = outcomes[name]
        added = tuple(float(o.parameters - o.host_parameters) for o in runs)
        gains = tuple((o.final_accuracy - base) / (extra / 1000.0)
                      for o, base, extra in zip(runs, baseline, added, strict=True) if extra > 0)
        scores.append(ControllerScores(
            name=name, accuracies=tuple(o.final_accuracy for o in runs), added=added, gain_per_thousand=gains,
            fossilized=tuple(float(o.fossilized) for o in runs), pruned=tuple(float(o.pruned) for o in runs),
            losses=tuple(o.final_loss for o in runs)))
    return scores


def _final(outcome: _Played, metric_name: str) -> str:
    """An episode's final score as a progress line shows it: accuracy in percent, the loss where the score is the
    negated loss, any other metric in four significant digits."""
    if metric_name == "accuracy":
        return f"{outcome.final_accuracy:.2f}%"
    return f"loss {outcome.final_loss:.4g}" if metric_name == NEGATIVE_LOSS else f"{outcome.final_accuracy:.4g}"


def _print_table(scores: list[ControllerScores], out: TextIO) -> None:
    header = f"{'controller':<11}{'final acc %':>18}{'params added':>20}{'acc pts / 1k params':>22}" \
             f"{'fossilized':>16}{'pruned':>16}"
    print("\n" + header, file=out)
    for s in scores:
        print(f"{s.name:<11}{_mean_std(s.accuracies):>18}{_mean_std_count(s.added):>20}"
              f"{_mean_std(s.gain_per_thousand):>22}"
              f"{_mean_std(s.fossilized):>16}{_mean_std(s.pruned):>16}", file=out)
    print("(acc pts / 1k params: accuracy gained over no growth on the same seed per 1,000 added parameters, "
          "over episodes that added any)", file=out)


def _print_loss_table(scores: list[ControllerScores], out: TextIO) -> None:
    """The comparison for a task with its own loss or metric, whose scale only its author knows: final
    validation loss, and its change against no growth on the same seed, in percent."""
    baseline = next(s.losses for s in scores if s.name == "no growth")
    header = f"{'controller':<11}{'final loss':>22}{'loss vs no growth %':>22}{'params added':>20}" \
             f"{'fossilized':>16}{'pruned':>16}"
    print("\n" + header, file=out)
    for s in scores:
        losses = _mean_std(s.losses, ".4g", ".2g")
        change = tuple(100.0 * (loss / base - 1.0) for loss, base in zip(s.losses, baseline, strict=True) if base > 0)
        print(f"{s.name:<11}{losses:>22}{_mean_std(change):>22}{_mean_std_count(s.added):>20}"
              f"{_mean_std(s.fossilized):>16}{_mean_std(s.pruned):>16}", file=out)
    print("(loss vs no growth: the final validation loss against no growth's on the same seed, mean over seeds)",
          file=out)


class LearnedPolicy(NamedTuple):
    """A policy loaded for `morphogen run --policy`, and what identifies it."""

    factory: Callable[[MorphogenesisEpisode], Controller]
    """A controller factory acting with the policy on whatever task and host the run plays."""
    checksum: str
    """`policy_checksum` of its checkpoint."""


def policy_checksum(state: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of what a checkpoint's policy acts with: its width, weights and observation statistics."""
    return state_checksum({key: state[key] for key in ("hidden_size", "policy", "observation_normalizer")})


def load_learned_policy(policy: str, device: str, compile_settings: CompileSettings | None = None) -> LearnedPolicy:
    """The policy `policy` names (see `policy_source`) on `device`; with `compile_settings` its forward runs
    compiled."""
    _, state = read_policy_run(policy, device)
    agent = agent_from_checkpoint(state, device, source=policy_source(policy))
    agent.policy.compile_forward(compile_settings)
    return LearnedPolicy(lambda episode: PolicyController(agent), policy_checksum(state))
