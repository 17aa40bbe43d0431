"""What a growth episode's training step costs besides the model's own work: morphogen's step against a naive one.

The naive step is the trainer with three things done the obvious way:
- every step sets the model to training mode (`model.train()`, a walk over every module), not each epoch's first;
- each group's gradients (host, then each seed) are clipped with `torch.nn.utils.clip_grad_norm_`, which computes
  again the total norm the isolation monitor computed of the same gradients just before;
- a segment that a widening seed cuts (its producer's tap, its consumer's output) runs as `nn.Sequential` slices,
  a new module for every cut of every forward.

A heuristic episode of each task is played until its slots run each of: no seed, a TRAINING seed (its shadow pass)
and a blended seed. At each, the episode's trainer (model, optimizers, monitor) is copied twice, and the two copies
train on the same batches of the training split, `--batches` at a time, morphogen's step and the naive one in
turn (the one that goes first alternating), for `--rounds` rounds: a drift in the load of this shared machine hits
both alike. Chunks are timed in CPU seconds of this process (`time.process_time`, one torch thread). A figure is
the median over rounds of the round's ratio (naive / morphogen). Afterwards the two copies must hold the same
parameters, bit for bit, and a whole episode played each way the same validation figures, or the script stops
before its table.

Run `python benchmarks/step_overhead.py --help`.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from arguments import BenchmarkParser, count, fail, run_script
from morphogen.control.heuristic import HeuristicController
from morphogen.core import width
from morphogen.core.slot import SlotMode
from morphogen.data import TASK_NAMES, Task, load_task
from morphogen.env import training
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.play import run_episode
from morphogen.env.training import HostAndSeedTrainer
from morphogen.inputs import Inputs

#: What the slots run in a step, in table order.
STATES = ("no seed", "TRAINING seed", "blended seed")


def naive_clip(params: Sequence[Tensor], max_norm: float, total_norm: Tensor | None = None) -> None:
    """Clip as a trainer without the monitor's norms does: the total norm computed again."""
    nn.utils.clip_grad_norm_(params, max_norm, foreach=True)


def sliced_layers(segment: nn.Sequential, start: int, stop: int, h: Tensor) -> Tensor:
    """Run part of a segment as its `nn.Sequential` slice, a module built for the call."""
    output: Tensor = segment[start:stop](h)
    return output


#: Morphogen's training step, which the naive one calls after setting the modes.
TRAIN_BATCH = HostAndSeedTrainer.train_batch


def train_batch_setting_modes(trainer: HostAndSeedTrainer, inputs: Inputs, targets: Tensor) -> None:
    """The step with the model set to training mode first, a walk over every module at every step."""
    trainer.model.train()
    TRAIN_BATCH(trainer, inputs, targets)


@contextmanager
def naive_step() -> Iterator[None]:
    """Train with the naive step inside the block: the modes set every step, the naive clip, the sliced segments."""
    kept = training.clip_gradients, width._run_layers
    training.clip_gradients, width._run_layers = naive_clip, sliced_layers
    HostAndSeedTrainer.train_batch = train_batch_setting_modes  # type: ignore[method-assign]
    try:
        yield
    finally:
        training.clip_gradients, width._run_layers = kept
        HostAndSeedTrainer.train_batch = TRAIN_BATCH  # type: ignore[method-assign]


def state_of(episode: MorphogenesisEpisode) -> str:
    """What the slots of `episode`'s model run in its next step, as one of `STATES`."""
    assert episode.model is not None
    modes = {slot.mode for slot in episode.model.slots()}
    if SlotMode.SHADOW in modes:
        return "TRAINING seed"
    return "blended seed" if SlotMode.BLENDED in modes else "no seed"


def trainers_by_state(task: Task, epochs: int, seed: int) -> dict[str, HostAndSeedTrainer]:
    """A copy of the trainer of a heuristic episode of `task` at the first epoch its slots run each state."""
    episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=epochs), seed=seed)
    episode.reset()
    controller = HeuristicController(episode.action_space, task.topology)
    found: dict[str, HostAndSeedTrainer] = {}

    def keep(_: object) -> None:
        found.setdefault(state_of(episode), copy.deepcopy(episode.trainer))

    run_episode(episode, controller, on_step=keep)
    return found


def play_both_ways(task: Task, epochs: int, seed: int) -> None:
    """Raise unless a heuristic episode trained with the naive step validates the same figures as morphogen's."""
    figures = []
    for naive in (False, True):
        episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=epochs), seed=seed)
        episode.reset()
        controller = HeuristicController(episode.action_space, task.topology)
        if naive:
            with naive_step():
                run_episode(episode, controller)
        else:
            run_episode(episode, controller)
        figures.append((list(episode.accuracies), list(episode.losses)))
    if figures[0] != figures[1]:
        raise RuntimeError(f"{task.name}: the naive step changed the episode's figures: {figures[1]} against "
                           f"{figures[0]}")


def check_same(ours: HostAndSeedTrainer, naive: HostAndSeedTrainer, what: str) -> None:
    """Raise unless the two trainers' models hold the same parameters and buffers, bit for bit."""
    tensors = zip([*ours.model.named_parameters(), *ours.model.named_buffers()],
                  [*naive.model.named_parameters(), *naive.model.named_buffers()], strict=True)
    for (name, a), (_, b) in tensors:
        if not torch.equal(a, b):
            raise RuntimeError(f"{what}: the naive step trained {name} to other values")


@dataclass(frozen=True)
class StepFigures:
    task: str
    state: str
    naive_ms: float
    ours_ms: float
    speed_up: float


def time_steps(trainer: HostAndSeedTrainer, batches: Sequence[tuple[Inputs, Tensor]], naive: bool) -> float:
    """CPU seconds of one training step of `trainer` on each of `batches`, the naive step or morphogen's."""
    started = time.process_time()
    if naive:
        with naive_step():
            for inputs, targets in batches:
                trainer.train_batch(inputs, targets)
    else:
        for inputs, targets in batches:
            trainer.train_batch(inputs, targets)
    return time.process_time() - started


def measure_state(task: Task, state: str, trainer: HostAndSeedTrainer, seed: int, batches: int,
                  rounds: int) -> StepFigures:
    """Morphogen's step against the naive one on two copies of `trainer`, in alternating chunks of `batches`."""
    ours, naive = copy.deepcopy(trainer), copy.deepcopy(trainer)
    generator = torch.Generator().manual_seed(seed)
    stream = list(task.train.iterate_batches(task.batch_size, generator=generator, augment=task.augment))
    chunks = [stream[start:start + batches] for start in range(0, len(stream) - batches + 1, batches)]
    if not chunks:
        fail("step_overhead.py", f"--batches: {task.name}'s training split has {len(stream)} batches, fewer than "
                                 f"{batches}")
    for warmup in chunks[:1]:
        time_steps(ours, warmup, naive=False)
        time_steps(naive, warmup, naive=True)
    ours_seconds, naive_seconds = [], []
    for index in range(rounds):
        chunk = chunks[index % len(chunks)]
        if index % 2:
            ours_seconds.append(time_steps(ours, chunk, naive=False))
            naive_seconds.append(time_steps(naive, chunk, naive=True))
        else:
            naive_seconds.append(time_steps(naive, chunk, naive=True))
            ours_seconds.append(time_steps(ours, chunk, naive=False))
    check_same(ours, naive, f"{task.name}, {state}")
    steps = len(chunks[0])
    return StepFigures(task.name, state, 1000 * statistics.median(naive_seconds) / steps,
                       1000 * statistics.median(ours_seconds) / steps,
                       statistics.median(n / o for n, o in zip(naive_seconds, ours_seconds, strict=True)))


def measure(task: Task, args: argparse.Namespace) -> list[StepFigures]:
    play_both_ways(task, args.epochs, args.seed)
    trainers = trainers_by_state(task, args.epochs, args.seed)
    return [measure_state(task, state, trainers[state], args.seed, args.batches, args.rounds)
            for state in STATES if state in trainers]


def format_table(figures: Sequence[StepFigures], args: argparse.Namespace) -> str:
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); CPU ms per training step, medians of "
             f"{args.rounds} rounds of {args.batches} steps each way", "",
             f"{'task':<9}{'slots run':<16}{'naive ms':>10}{'ours ms':>9}{'speed-up':>10}"]
    for row in figures:
        lines.append(f"{row.task:<9}{row.state:<16}{row.naive_ms:>10.2f}{row.ours_ms:>9.2f}{row.speed_up:>9.3f}x")
    lines.append("(naive: model.train() every step, clip_grad_norm_ computes each group's norm again, cut segments run "
                 "as Sequential slices; both trained the same parameters, bit for bit)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="digits,mnist1d", help="built-in tasks (default digits,mnist1d)")
    parser.add_argument("--epochs", type=count, default=20,
                        help="length of the heuristic episode played to reach the states (default 20)")
    parser.add_argument("--batches", type=count, default=5, help="training steps per timed chunk (default 5)")
    parser.add_argument("--rounds", type=count, default=40, help="timed chunks each way per state (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=count, default=1, help="torch.set_num_threads (default 1)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [name.strip() for name in args.tasks.split(",") if name.strip()]
    if not names or any(name not in TASK_NAMES for name in names):
        fail("step_overhead.py", f"--tasks: give some of the built-in tasks {', '.join(TASK_NAMES)}, "
                                 f"got {args.tasks!r}")
    torch.set_num_threads(args.threads)
    figures = [row for name in names for row in measure(load_task(name, seed=args.seed), args)]
    print(format_table(figures, args))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
