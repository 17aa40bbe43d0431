"""Growth in your own loop on several processes: `Grower(distributed=True)` against one process, same batches.

A CNN of a user's (two residual stages of `--width` channels, slots after both) grows for `--epochs` epochs on the
digits task's images (8x8, 1,437 training / 360 validation) in your own training loop, with the heuristic. One
process trains on whole batches of `--batch` samples and validates on all the data; `--processes` gloo processes
each train on their share of every batch and validate on their share of the data, as `torch.distributed` users
do. Every process has `--threads` torch threads. The same network trained without growth, on one process and
with its gradients all-reduced, gives the speed-up data parallelism alone reaches on this machine. Printed: the
wall time of each loop (the first epoch untimed: it builds the FLOP counts), the speed-up over one process, and
what each growing run grew and reached. The processes must agree
with each other; with one process they agree only as DistributedDataParallel would: batch norm normalizes each
process's share of a batch by its own statistics.

Run `python benchmarks/grower_processes.py --help`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import morphogen
from arguments import BenchmarkParser, count, run_script
from morphogen.data import DeviceDataset, load_task


class Block(nn.Module):
    """A residual block of two 3x3 convolutions with batch norm."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                                  nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


def network(width: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), Block(width),
                         Block(width), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


def digits() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The digits task's (images, labels) for training and for validation."""
    task = load_task("digits")
    train, validation = task.train, task.validation
    assert isinstance(train, DeviceDataset) and isinstance(validation, DeviceDataset)
    assert isinstance(train.inputs, torch.Tensor) and isinstance(validation.inputs, torch.Tensor)
    return (train.inputs, train.targets), (validation.inputs, validation.targets)


def epochs_of_rows(count: int, rank: int, processes: int, args: argparse.Namespace) -> Iterator[list[torch.Tensor]]:
    """Per epoch, this process's rows of every batch: the same batches, in the same order, in every run."""
    generator = torch.Generator().manual_seed(0)
    part = args.batch // processes
    for _ in range(args.epochs):
        order = torch.randperm(count, generator=generator)
        yield [order[start + rank * part:start + (rank + 1) * part]
               for start in range(0, count - args.batch + 1, args.batch)]


def train_plain(rank: int, processes: int, args: argparse.Namespace) -> dict[str, Any]:
    """The same network, data and batches without growth: what data parallelism alone gives on this machine
    (gradients averaged by one all-reduce per step, as DistributedDataParallel does)."""
    torch.set_num_threads(args.threads)
    (x, y), _ = digits()
    torch.manual_seed(0)
    net = network(args.width)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    started = 0.0
    for epoch, steps in enumerate(epochs_of_rows(len(y), rank, processes, args)):
        started = time.perf_counter() if epoch == 1 else started
        for rows in steps:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(x[rows]), y[rows])
            torch.autograd.backward(loss)
            if processes > 1:
                gradients = [p.grad for p in net.parameters() if p.grad is not None]
                flat = torch.cat([g.reshape(-1) for g in gradients]).div_(processes)
                torch.distributed.all_reduce(flat)
                for gradient, averaged in zip(gradients, torch.split(flat, [g.numel() for g in gradients]),
                                              strict=True):
                    gradient.copy_(averaged.view_as(gradient))
            optimizer.step()
    return {"seconds": time.perf_counter() - started, "score": float("nan"), "stages": {}, "parameters": 0}


def grow(rank: int, processes: int, args: argparse.Namespace) -> dict[str, Any]:
    """Grow on this process's share of every batch and of the validation data; the loop's seconds and outcome."""
    torch.set_num_threads(args.threads)
    (x, y), (x_val, y_val) = digits()
    share = -(-len(y_val) // processes)
    validation = (x_val[rank * share:(rank + 1) * share], y_val[rank * share:(rank + 1) * share])
    torch.manual_seed(0)
    host = morphogen.host_from_module(network(args.width), ["3", "4"], example_input=x[:2])
    optimizer = torch.optim.SGD(host.parameters(), lr=0.05, momentum=0.9)
    grower = morphogen.Grower(host, validation, epochs=args.epochs, optimizer=optimizer,
                              distributed=processes > 1)
    started = 0.0
    for epoch, steps in enumerate(epochs_of_rows(len(y), rank, processes, args)):
        started = time.perf_counter() if epoch == 1 else started
        for rows in steps:
            optimizer.zero_grad()
            grower.training_step(x[rows], y[rows]).backward()
            grower.after_backward()
            optimizer.step()
        report = grower.end_epoch()
    return {"seconds": time.perf_counter() - started, "score": report.score, "stages": report.stages,
            "parameters": report.parameters}


def _process(rank: int, processes: int, args: argparse.Namespace, init_file: str, out_dir: str, plain: bool) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=processes)
    try:
        outcome = (train_plain if plain else grow)(rank, processes, args)
        torch.save(outcome, Path(out_dir) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def on_processes(processes: int, args: argparse.Namespace, plain: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        init_file = str(Path(directory) / "rendezvous")
        torch.multiprocessing.spawn(
            _process, args=(processes, args, init_file, directory, plain), nprocs=processes)
        outcomes = [torch.load(Path(directory) / f"rank{rank}.pt") for rank in range(processes)]
    assert all(o["stages"] == outcomes[0]["stages"] for o in outcomes), "the processes grew different models"
    return {**outcomes[0], "seconds": max(o["seconds"] for o in outcomes)}


def main() -> None:
    parser = BenchmarkParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=count, default=2)
    parser.add_argument("--threads", type=count, default=1, help="torch threads per process")
    parser.add_argument("--epochs", type=count, default=14)
    parser.add_argument("--batch", type=count, default=256, help="samples per step, over all processes")
    parser.add_argument("--width", type=count, default=32)
    args = parser.parse_args()
    plain_alone, plain_shared = train_plain(0, 1, args), on_processes(args.processes, args, plain=True)
    alone, shared = grow(0, 1, args), on_processes(args.processes, args)
    print(f"| run | processes x threads | seconds (epochs 2-{args.epochs}) | speed-up | grew | final score |")
    print("|---|---|---|---|---|---|")
    rows = (("plain training, one process", plain_alone, plain_alone, 1),
            ("plain training, gradients all-reduced", plain_shared, plain_alone, args.processes),
            ("`Grower`, one process", alone, alone, 1),
            ("`Grower(distributed=True)`", shared, alone, args.processes))
    for name, outcome, reference, processes in rows:
        grew = ", ".join(f"{slot} {stage}" for slot, stage in outcome["stages"].items()) or "-"
        score = f"{outcome['score']:.2f}%" if outcome["stages"] else "-"
        print(f"| {name} | {processes} x {args.threads} | {outcome['seconds']:.1f} | "
              f"{reference['seconds'] / outcome['seconds']:.2f}x | {grew} | {score} |")


if __name__ == "__main__":
    run_script(main)
