"""`morphogen eval`: the learned policy, the heuristic and no growth on the same fresh seeds."""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from morphogen.config import ConfigError, build_config
from morphogen.control.checkpoint import CheckpointError, check_layout, load_checkpoint
from morphogen.control.controller import Controller, NoGrowthController
from morphogen.control.heuristic import HeuristicController
from morphogen.control.learned import PolicyController, agent_from_checkpoint
from morphogen.control.options import load_session_task
from morphogen.control.trainer import TrainConfig
from morphogen.data import Task
from morphogen.env.episode import MorphogenesisEpisode
from morphogen.env.seeding import derive_seed
from morphogen.limits import MAX_EVAL_EPISODES, MAX_SEED
from morphogen.runner import EpisodeOutcome, resolve_device, run_episode

#: Evaluation seeds are drawn from a stream the training rounds never use.
EVALUATION_STREAM = 99_991
CONTROLLERS = ("learned", "heuristic", "no growth")


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
    return build_config(TrainConfig, values), state


def _mean_std(values: tuple[float, ...]) -> str:
    if not values:
        return "-"
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):8.2f} ± {spread:5.2f}"


def evaluate_command(policy_dir: str, episodes: int, *, seed: int = 0, device: str = "cpu",
                     out: TextIO | None = None) -> list[ControllerScores]:
    """Play `episodes` fresh seeds with each controller and print the comparison table to `out`
    (default: `sys.stdout` at call time)."""
    out = sys.stdout if out is None else out
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed must be between 0 and {MAX_SEED:,}, got {seed:,}")
    if episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {episodes}")
    if episodes > MAX_EVAL_EPISODES:
        raise ConfigError(f"--episodes must be <= {MAX_EVAL_EPISODES:,}, got {episodes:,}")
    device = resolve_device(device)
    config, state = read_policy_run(policy_dir, device)
    task = load_session_task(config, device)  # with the host size the policy was trained with
    agent = agent_from_checkpoint(state, task.topology, device, source=policy_dir)
    makers: dict[str, Callable[[MorphogenesisEpisode], Controller]] = {
        "learned": lambda episode: PolicyController(agent),
        "heuristic": lambda episode: HeuristicController(episode.action_space, task.topology),
        "no growth": lambda episode: NoGrowthController(),
    }
    outcomes: dict[str, list[tuple[EpisodeOutcome, int, int]]] = {name: [] for name in CONTROLLERS}
    print(f"morphogen eval: {episodes} episodes of {config.episode_length} epochs on {task.name}, "
          f"policy {policy_dir}", file=out, flush=True)
    for index in range(episodes):
        episode_seed = derive_seed(seed, EVALUATION_STREAM, index)
        for name in CONTROLLERS:
            episode = MorphogenesisEpisode(task, config.episode, seed=episode_seed, slots=config.slots,
                                           pool_slots=config.pool_slots)
            episode.reset()
            check_layout(state, {"slot_ids": episode.action_space.slot_ids}, policy_dir)
            outcome = run_episode(episode, makers[name](episode))
            outcomes[name].append((outcome, episode.fossilized, episode.pruned))
        line = "  ".join(f"{name} {outcomes[name][-1][0].final_accuracy:.2f}%" for name in CONTROLLERS)
        print(f"episode {index + 1}/{episodes} (seed {episode_seed % 100_000}): {line}", file=out, flush=True)
    scores = _scores(outcomes)
    _print_table(scores, out)
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


def policy_controller_factory(policy_dir: str, task: Task, device: str,
                              episode_length: int) -> tuple[Callable[[MorphogenesisEpisode], Controller], TrainConfig]:
    """For `morphogen run --policy`: a controller factory and the training config (checked against the run)."""
    config, state = read_policy_run(policy_dir, device)
    if config.task != task.name:
        raise CheckpointError(f"policy {policy_dir} was trained on task {config.task!r}, not {task.name!r}")
    if episode_length != config.episode_length:
        raise CheckpointError(f"policy {policy_dir} was trained for {config.episode_length}-epoch episodes; "
                              f"this run has {episode_length} (use --epochs {config.episode_length})")
    agent = agent_from_checkpoint(state, task.topology, device, source=policy_dir)

    def make(episode: MorphogenesisEpisode) -> Controller:
        check_layout(state, {"slot_ids": episode.action_space.slot_ids}, policy_dir)
        return PolicyController(agent)

    return make, config
