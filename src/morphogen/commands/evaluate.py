"""`morphogen eval`: the learned policy, the heuristic and no growth on the same fresh seeds."""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from morphogen.commands.run import write_resolved_config
from morphogen.config import build_config, config_to_dict
from morphogen.control.checkpoint import CheckpointError, check_layout, load_checkpoint
from morphogen.control.controller import NoGrowthController
from morphogen.control.heuristic import HeuristicController
from morphogen.control.learned import PolicyController, agent_from_checkpoint
from morphogen.control.trainer import TrainConfig
from morphogen.core.compilation import CompileSettings
from morphogen.data import Task
from morphogen.devices import resolve_device
from morphogen.env.episode import MorphogenesisEpisode
from morphogen.env.play import Controller, EpisodeOutcome, run_episode
from morphogen.env.seeding import derive_seed
from morphogen.limits import MAX_EVAL_EPISODES, MAX_SEED, check_count
from morphogen.run_directory import SCORES_FILENAME, hold_run_directory, make_run_dir, refuse_other_run, write_atomic
from morphogen.session import CompileOptions, load_session_task
from morphogen.telemetry.config import TelemetryConfig
from morphogen.telemetry.sinks import Telemetry
from morphogen.ui.progress import ProgressDisplay

#: Evaluation seeds are drawn from a stream the training rounds never use.
EVALUATION_STREAM = 99_991
CONTROLLERS = ("learned", "heuristic", "no growth")


@dataclass(frozen=True)
class EvalConfig(CompileOptions):
    """Settings of `morphogen eval` (file keys and CLI flags share these names)."""

    #: Run directory of `morphogen train` whose policy is evaluated.
    policy: str = ""
    #: Episodes per controller.
    episodes: int = 5
    #: Base of the evaluation seeds (drawn from a stream the training rounds never use).
    seed: int = 0
    #: Device: cpu, cuda, cuda:N, mps, or auto.
    device: str = "cpu"
    #: Where to record the evaluation (config, events of every episode, the table as eval.json); None
    #: records nothing. In events, the episode `i` of controller `c` (order learned, heuristic, no
    #: growth) has `env_id = c * episodes + i`.
    run_dir: str | None = None
    #: Telemetry level and thresholds of the recorded episodes (used only with `run_dir`).
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    #: Run the hosts' training forward and the policy's forward under torch.compile (as `train --compile`).
    compile: bool = False
    #: torch.compile mode: auto (reduce-overhead on CUDA, default elsewhere), default, reduce-overhead,
    #: max-autotune or max-autotune-no-cudagraphs.
    compile_mode: str = "auto"
    #: torch.compile backend: inductor, or aot_eager / eager to tell a compiler problem from a model problem.
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        self.check_compile_options()
        if not self.policy:
            raise ValueError("policy must name the run directory of `morphogen train` (--policy RUN_DIR)")
        check_count("episodes", self.episodes, MAX_EVAL_EPISODES)
        check_count("seed", self.seed, MAX_SEED, lower=0)


@dataclass(frozen=True)
class ControllerScores:
    name: str
    accuracies: tuple[float, ...]
    added: tuple[float, ...]
    gain_per_thousand: tuple[float, ...]
    fossilized: tuple[float, ...]
    pruned: tuple[float, ...]


def read_policy_run(policy_dir: str | Path, device: str) -> tuple[TrainConfig, dict[str, Any]]:
    """The training config and checkpoint of a training run directory."""
    state = load_checkpoint(policy_dir, map_location=device)
    try:
        values = json.loads(state["config"])
    except (TypeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint in {policy_dir} has an unreadable config: {error}") from None
    values["device"] = device
    values["devices"] = None  # evaluation plays on `device`, whatever devices the policy was trained on
    return build_config(TrainConfig, values), state


def _mean_std(values: tuple[float, ...]) -> str:
    if not values:
        return "-"
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):8.2f} ± {spread:5.2f}"


def evaluate_command(config: EvalConfig, out: TextIO | None = None) -> list[ControllerScores]:
    """Play `config.episodes` fresh seeds with each controller and print the comparison table to `out`
    (default: `sys.stdout` at call time); with `config.run_dir`, record everything there too."""
    out = sys.stdout if out is None else out
    device = resolve_device(config.device)
    policy_dir = config.policy
    trained, state = read_policy_run(policy_dir, device)
    task = load_session_task(trained, device)  # with the host size the policy was trained with
    agent = agent_from_checkpoint(state, task.topology, device, source=policy_dir)
    agent.policy.compile_forward(config.compile_settings)
    makers: dict[str, Callable[[MorphogenesisEpisode], Controller]] = {
        "learned": lambda episode: PolicyController(agent),
        "heuristic": lambda episode: HeuristicController(episode.action_space, task.topology),
        "no growth": lambda episode: NoGrowthController(),
    }
    outcomes: dict[str, list[tuple[EpisodeOutcome, int, int]]] = {name: [] for name in CONTROLLERS}
    run_dir = None if config.run_dir is None else make_run_dir(config.run_dir, "runs", trained.task)
    lock = contextlib.ExitStack()  # one writer per run directory, from before its first file is written
    if run_dir is not None:
        lock.enter_context(hold_run_directory(run_dir))
        refuse_other_run(run_dir)  # again, now that no other command can start a run there
        write_resolved_config(run_dir, config)
    telemetry = Telemetry(run_dir, config=config.telemetry if run_dir is not None else TelemetryConfig(level="off"))
    with lock, telemetry, ProgressDisplay(out) as display:
        display.print(f"morphogen eval: {config.episodes} episodes of {trained.episode_length} epochs on {task.name}, "
                      f"policy {policy_dir}")
        bar = display.add("episodes", config.episodes * len(CONTROLLERS))
        for index in range(config.episodes):
            episode_seed = derive_seed(config.seed, EVALUATION_STREAM, index)
            for position, name in enumerate(CONTROLLERS):
                episode = MorphogenesisEpisode(task, trained.episode, seed=episode_seed, slots=trained.slots,
                                               pool_slots=trained.pool_slots, telemetry=telemetry,
                                               env_id=position * config.episodes + index)
                episode.compile_settings = config.compile_settings
                episode.reset()
                check_layout(state, {"slot_ids": episode.action_space.slot_ids}, policy_dir)
                outcome = run_episode(episode, makers[name](episode))
                outcomes[name].append((outcome, episode.fossilized, episode.pruned))
                display.advance(bar, status=name)
            line = "  ".join(f"{name} {outcomes[name][-1][0].final_accuracy:.2f}%" for name in CONTROLLERS)
            display.print(f"episode {index + 1}/{config.episodes} (seed {episode_seed % 100_000}): {line}")
    scores = _scores(outcomes)
    _print_table(scores, out)
    if run_dir is not None:
        table = [config_to_dict(score) for score in scores]
        write_atomic(run_dir / SCORES_FILENAME, (json.dumps(table, indent=2) + "\n").encode())
        print(f"recorded in {run_dir}", file=out)
    return scores


def _scores(outcomes: dict[str, list[tuple[EpisodeOutcome, int, int]]]) -> list[ControllerScores]:
    baseline = [o.final_accuracy for o, _, _ in outcomes["no growth"]]
    scores = []
    for name in CONTROLLERS:
        runs = outcomes[name]
        added = tuple(float(o.parameters - o.host_parameters) for o, _, _ in runs)
        gains = tuple((o.final_accuracy - base) / (extra / 1000.0)
                      for (o, _, _), base, extra in zip(runs, baseline, added, strict=True) if extra > 0)
        scores.append(ControllerScores(
            name=name, accuracies=tuple(o.final_accuracy for o, _, _ in runs), added=added, gain_per_thousand=gains,
            fossilized=tuple(float(f) for _, f, _ in runs), pruned=tuple(float(p) for _, _, p in runs)))
    return scores


def _print_table(scores: list[ControllerScores], out: TextIO) -> None:
    header = f"{'controller':<11}{'final acc %':>18}{'params added':>20}{'acc pts / 1k params':>22}" \
             f"{'fossilized':>16}{'pruned':>16}"
    print("\n" + header, file=out)
    for s in scores:
        print(f"{s.name:<11}{_mean_std(s.accuracies):>18}{_mean_std(s.added):>20}{_mean_std(s.gain_per_thousand):>22}"
              f"{_mean_std(s.fossilized):>16}{_mean_std(s.pruned):>16}", file=out)
    print("(acc pts / 1k params: accuracy gained over no growth on the same seed per 1,000 added parameters, "
          "over episodes that added any)", file=out)


def policy_controller_factory(policy_dir: str, task: Task, device: str, episode_length: int,
                              compile_settings: CompileSettings | None = None,
                              ) -> tuple[Callable[[MorphogenesisEpisode], Controller], TrainConfig]:
    """For `morphogen run --policy`: a controller factory and the training config (checked against the run);
    with `compile_settings` the policy's forward runs compiled."""
    config, state = read_policy_run(policy_dir, device)
    named = task.name if task.source == "builtin" else task.source  # a user's task: the import path that made it
    if config.task != named:
        raise CheckpointError(f"policy {policy_dir} was trained on task {config.task!r}, not {named!r}")
    if episode_length != config.episode_length:
        raise CheckpointError(f"policy {policy_dir} was trained for {config.episode_length}-epoch episodes; "
                              f"this run has {episode_length} (use --epochs {config.episode_length})")
    agent = agent_from_checkpoint(state, task.topology, device, source=policy_dir)
    agent.policy.compile_forward(compile_settings)

    def make(episode: MorphogenesisEpisode) -> Controller:
        check_layout(state, {"slot_ids": episode.action_space.slot_ids}, policy_dir)
        return PolicyController(agent)

    return make, config
