"""One rank of the bit-identity test (run by tests/control/test_distributed.py with torchrun's variables).

Usage: distributed_worker.py OUT_DIR ROUNDS. Trains tiny rounds with `DistributedTrainer` and writes, after
every PPO update, the SHA-256 of the policy's parameters to OUT_DIR/rank<R>.txt, one line per round.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch

from morphogen.control.distributed import DistributedTrainer, init_distributed, shutdown
from morphogen.control.trainer import TrainConfig
from morphogen.env.episode import EpisodeConfig
from morphogen.session import load_session_task


def main(out_dir: Path, rounds: int) -> None:
    context = init_distributed("cpu", timeout_s=60)
    config = TrainConfig(n_envs=4, rounds=rounds, hidden_size=16, max_train_samples=100,
                         episode=EpisodeConfig(max_epochs=2)).with_resolved_host()
    trainer = DistributedTrainer(config, load_session_task(config, "cpu"), context)
    lines = []
    for _ in range(rounds):
        trainer.run_round()
        digest = hashlib.sha256()
        for tensor in trainer.state.agent.policy.state_dict().values():
            digest.update(tensor.detach().contiguous().numpy().tobytes())
        lines.append(digest.hexdigest())
    (out_dir / f"rank{context.rank}.txt").write_text("\n".join(lines) + "\n")
    shutdown()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), int(sys.argv[2]))
