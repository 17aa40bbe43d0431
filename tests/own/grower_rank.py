"""One process of a `Grower(distributed=True)` run (started by tests/own/test_distributed_grower.py), and the
same training in one process for comparison.

Usage: grower_rank.py OUT_DIR RANK WORLD_SIZE INIT_FILE. Each process trains the same MLP on its share of every
batch and validates on its share of the validation data, then writes its model and the growth it saw to
OUT_DIR/rank<RANK>.pt. Rank 1 starts from other weights: the first process's are copied to it.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch
from models import blobs, eager_config, mlp

import morphogen

EPOCHS, BATCH, TRAIN, VALIDATION = 5, 64, 192, 64


def train(rank: int, world: int, distributed: bool) -> dict[str, Any]:
    """Grow the MLP for `EPOCHS` epochs on rows `rank::world`-th share of each batch; what it ended as."""
    torch.manual_seed(rank)  # rank 1 starts from other weights than rank 0
    (x, y), (x_val, y_val) = blobs(TRAIN, 0), blobs(VALIDATION, 1)
    share = VALIDATION // world
    validation = (x_val[rank * share:(rank + 1) * share], y_val[rank * share:(rank + 1) * share])
    host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=x[:2])
    config = eager_config(EPOCHS)
    episode = dataclasses.replace(config.episode, shadow_fraction=1.0)
    optimizer = torch.optim.SGD(host.parameters(), lr=0.1)
    grower = morphogen.Grower(host, validation, epochs=EPOCHS, episode=episode, heuristic=config.heuristic,
                              optimizer=optimizer, distributed=distributed)
    actions = []
    part = BATCH // world
    for _ in range(EPOCHS):
        for start in range(0, TRAIN, BATCH):
            rows = slice(start + rank * part, start + (rank + 1) * part)
            optimizer.zero_grad()
            grower.training_step(x[rows], y[rows]).backward()
            grower.after_backward()
            optimizer.step()
        report = grower.end_epoch()
        actions.append((report.action, report.succeeded, report.score, report.loss))
    tensors = [*grower.model.named_parameters(), *grower.model.named_buffers()]
    return {"state": {name: tensor.detach().clone() for name, tensor in tensors}, "actions": actions,
            "stages": report.stages}


if __name__ == "__main__":
    out_dir, rank, world, init_file = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.save(train(rank, world, distributed=True), out_dir / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()
