"""Does a learned growth policy transfer? It, the heuristic and no growth on the same fresh seeds, per setting.

Settings are the tasks and host sizes the policy trained on and some it never saw (`SETTINGS`; the
`digits32` settings feed the digits images resized to 32x32x3 through the `cifar10` task's reader, from a
directory this script writes in the CIFAR-10 format, with the learning rate decaying over the episode:
`Setting.optimizer`; `digits32-3x4` on a host half as wide). Every episode is played as `morphogen eval` plays it
(`evaluation_setting`: the policy's training episode settings at the setting's length). Per setting it prints
mean ± std of final accuracy and parameters added per controller, then the differences paired by seed as
mean ± standard error: learned - heuristic, learned - no growth, and how many seeds the learned policy led
or trailed on. It also prints the share of the variance of each controller's final accuracy that the no-growth
accuracy of the same seed explains (R², the host's seed: how well that initialization trains at all).

The heuristic's and no growth's episodes do not depend on the policy: they are kept in `--cache` (JSON, keyed
by setting and seed) and replayed from there when another policy is evaluated on the same seeds.

    python benchmarks/transfer.py --policy default --seeds 20 --threads 1
    python benchmarks/transfer.py --policy runs/<train run> --settings digits,mnist1d --seeds 5
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arguments import BenchmarkParser, count, output_file, run_script
from morphogen.commands.evaluate import EVALUATION_STREAM, EvalConfig, evaluation_setting, read_policy_run
from morphogen.config import config_to_dict
from morphogen.control.controller import NoGrowthController
from morphogen.control.heuristic import HeuristicController
from morphogen.control.learned import PolicyController, agent_from_checkpoint
from morphogen.core.lifecycle import GateConfig
from morphogen.data import load_task
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.optimizer import task_optimizer_config
from morphogen.env.play import Controller, run_episode
from morphogen.env.seeding import derive_seed
from morphogen.paired_statistics import format_mean_error, format_mean_std
from morphogen.session import load_session_task


@dataclass(frozen=True)
class Setting:
    """A task and host size to evaluate on; `held_out` when the default policy never trained on it."""

    task: str
    host: dict[str, int] = field(default_factory=dict)
    held_out: bool = False
    episode_length: int | None = None
    optimizer: dict[str, Any] = field(default_factory=dict)
    """Keys of `[episode.optimizer]` over the task's default optimizer (eval's `[optimizer]` table)."""


SETTINGS = {
    "digits": Setting("digits"),
    "mnist1d": Setting("mnist1d"),
    "mnist1d-3x12": Setting("mnist1d", {"n_blocks": 3, "base_channels": 12}, held_out=True),
    "digits-2x4": Setting("digits", {"base_channels": 4}, held_out=True),
    # 3 blocks: a 2x8 host trains to only 37% in 30 epochs on these images (seed 0, no growth), a 3x8 one to 87.5%.
    # A decaying rate: at the task's constant one the last epoch's accuracy of this host ranged from 63% to 88% by
    # seed (SGD, 11 steps an epoch), too noisy for ten or twenty seeds to tell controllers apart.
    "digits32": Setting("cifar10", {"n_blocks": 3, "base_channels": 8}, held_out=True,
                        optimizer={"schedule": "cosine"}),
    # The same images on a host of half the width, which they hold back: growth is worth 0.2 points to any controller
    # on the 3x8 host and about 1.6 to the heuristic on this one (6 seeds).
    "digits32-3x4": Setting("cifar10", {"n_blocks": 3, "base_channels": 4}, held_out=True,
                            optimizer={"schedule": "cosine"}),
    # A user's own model and input format: the MLP of your_model.py on MNIST-1D signals as flat vectors.
    "user-mlp": Setting("your_model:mlp_task", held_out=True),
    # A user's small 1-D CNN (your_model.py): branch sites, which no built-in host has.
    "user-cnn1d": Setting("your_model:cnn1d_task", held_out=True),
    # A user's transformer of two inputs (token ids, a padding mask), AdamW: grown by copies of its own blocks.
    "user-transformer": Setting("your_model:padded_task", held_out=True),
}
CONTROLLERS = ("learned", "heuristic", "no growth")


def write_digits_as_cifar10(directory: Path) -> Path:
    """scikit-learn's digits, resized to 32x32 (bilinear) on 3 channels as uint8, in CIFAR-10's on-disk format:
    the digits task's training split in `data_batch_1..5`, its validation split in `test_batch`."""
    folder = directory / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    task = load_task("digits")

    def as_bytes(images: torch.Tensor) -> np.ndarray:
        resized = torch.nn.functional.interpolate(images, size=32, mode="bilinear", align_corners=False)
        low, high = resized.amin(), resized.amax()
        pixels = ((resized - low) / (high - low) * 255).round().to(torch.uint8).repeat(1, 3, 1, 1)
        return pixels.reshape(len(images), -1).numpy()  # [N, 3072]: red, green, blue planes

    train = as_bytes(task.train.inputs), task.train.targets.tolist()
    parts = np.array_split(np.arange(len(train[1])), 5)
    for number, part in enumerate(parts, start=1):
        batch = {b"data": train[0][part], b"labels": [train[1][i] for i in part]}
        (folder / f"data_batch_{number}").write_bytes(pickle.dumps(batch))
    test = {b"data": as_bytes(task.validation.inputs), b"labels": task.validation.targets.tolist()}
    (folder / "test_batch").write_bytes(pickle.dumps(test))
    meta = {b"label_names": [str(digit).encode() for digit in range(10)]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    return directory


def with_gates(config: EpisodeConfig, gates: GateConfig) -> EpisodeConfig:
    """`config` with `gates` in place of its slots' gates."""
    return dataclasses.replace(config, slots=dataclasses.replace(config.slots, gates=gates))


def evaluate_setting(name: str, policy: str, seeds: int, seed_base: int, cache: dict[str, Any], data_dir: Path,
                     save: Callable[[dict[str, Any]], None], controllers: tuple[str, ...] = CONTROLLERS,
                     ) -> dict[str, list[tuple[float, float]]]:
    """(final accuracy, parameters added) of `controllers` on every seed of one setting; `cache` gains the
    heuristic's and no growth's outcomes, keyed by setting, episode settings and seed."""
    setting = SETTINGS[name]
    trained, state = read_policy_run(policy, "cpu")
    config = EvalConfig(policy=policy, task=setting.task, host=setting.host, episode_length=setting.episode_length,
                        data_dir=str(data_dir) if setting.task == "cifar10" else None,
                        optimizer=task_optimizer_config(setting.task, setting.optimizer, "optimizer")
                        if setting.optimizer else None)
    session, episode_config = evaluation_setting(config, trained)
    task = load_session_task(session.with_resolved_host(), "cpu")
    agent = agent_from_checkpoint(state, "cpu", source=policy)
    # The episode settings (gates, reward, length) come from the policy's training: part of the cache key, with
    # the gates' criterion as the task resolves it, so that a change of that default does not replay old episodes.
    keyed = with_gates(episode_config, episode_config.slots.gates.judging(task.objective))
    episode_key = hashlib.sha1(json.dumps(config_to_dict(keyed), sort_keys=True).encode()).hexdigest()[:12]
    results: dict[str, list[tuple[float, float]]] = {controller: [] for controller in controllers}
    for index in range(seeds):
        seed = derive_seed(seed_base, EVALUATION_STREAM, index)
        for controller in controllers:
            key = f"{name}/{episode_key}/{seed}/{controller}"
            if controller != "learned" and key in cache:
                results[controller].append(tuple(cache[key]))  # type: ignore[arg-type]
                continue
            episode = MorphogenesisEpisode(task, episode_config, seed=seed)
            episode.reset()
            chosen: Controller = (PolicyController(agent) if controller == "learned" else
                                  HeuristicController(episode.action_space, task.topology)
                                  if controller == "heuristic" else NoGrowthController())
            outcome = run_episode(episode, chosen)
            result = (outcome.final_accuracy, float(outcome.parameters - outcome.host_parameters))
            results[controller].append(result)
            if controller != "learned":
                cache[key] = result
                save(cache)
        line = "  ".join(f"{c} {results[c][-1][0]:.2f}%" for c in controllers)
        print(f"  {name} seed {index + 1}/{seeds}: {line}", flush=True)
    return results


def _r_squared(values: list[float], reference: list[float]) -> float:
    if statistics.pstdev(values) == 0 or statistics.pstdev(reference) == 0:
        return float("nan")
    return float(np.corrcoef(values, reference)[0, 1] ** 2)


def report(name: str, results: dict[str, list[tuple[float, float]]]) -> str:
    accuracy = {c: [a for a, _ in results[c]] for c in CONTROLLERS}
    added = {c: [p for _, p in results[c]] for c in CONTROLLERS}
    versus_heuristic = [a - b for a, b in zip(accuracy["learned"], accuracy["heuristic"], strict=True)]
    versus_none = [a - b for a, b in zip(accuracy["learned"], accuracy["no growth"], strict=True)]
    ahead = sum(d > 0 for d in versus_heuristic)
    behind = sum(d < 0 for d in versus_heuristic)
    setting = SETTINGS[name]
    where = "held out" if setting.held_out else "trained on"
    return (f"| {name} ({where}) | {format_mean_std(accuracy['learned'])}% ({format_mean_std(added['learned'])}) | "
            f"{format_mean_std(accuracy['heuristic'])}% ({format_mean_std(added['heuristic'])}) | "
            f"{format_mean_std(accuracy['no growth'])}% | **{format_mean_error(versus_heuristic)}** "
            f"({ahead} ahead, {behind} behind) | "
            f"{format_mean_error(versus_none)} | {_r_squared(accuracy['heuristic'], accuracy['no growth']):.2f} / "
            f"{_r_squared(accuracy['learned'], accuracy['no growth']):.2f} |")


def main() -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="default", help="run directory of `morphogen train`, or default")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument("--seeds", type=count, default=20, help="fresh seeds per setting")
    parser.add_argument("--seed", type=int, default=3000, help="base of the evaluation seeds (as eval --seed)")
    parser.add_argument("--cache", type=output_file, default="runs/transfer_cache.json",
                        help="JSON file of the heuristic's and no growth's outcomes (read and extended)")
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--baselines-only", action="store_true",
                        help="play only the heuristic and no growth (fills the cache before a policy is ready)")
    args = parser.parse_args()
    settings = [name.strip() for name in args.settings.split(",") if name.strip()]
    unknown = [name for name in settings if name not in SETTINGS]
    if unknown or not settings:
        parser.error(f"--settings: {unknown[0]!r} is not a setting; valid: {', '.join(SETTINGS)}" if unknown
                     else "--settings: give at least one setting")
    read_policy_run(args.policy, "cpu")  # a policy that does not load is one line now, not after the baselines
    torch.set_num_threads(args.threads)
    cache_path = Path(args.cache)
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    cache: dict[str, Any] = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = write_digits_as_cifar10(Path(scratch))
        controllers = CONTROLLERS[1:] if args.baselines_only else CONTROLLERS
        for name in settings:
            results = evaluate_setting(name, args.policy, args.seeds, args.seed, cache, data_dir,
                                       lambda table: cache_path.write_text(json.dumps(table, indent=1) + "\n"),
                                       controllers)
            if not args.baselines_only:
                rows.append(report(name, results))
                print(rows[-1], flush=True)
    print(f"\npolicy {args.policy}, {args.seeds} seeds (base {args.seed}); accuracy mean ± std (parameters added); "
          "differences paired by seed, mean ± standard error")
    print("| setting | learned | heuristic | no growth | learned - heuristic | learned - no growth | "
          "R² on no growth (heuristic / learned) |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    run_script(main)
