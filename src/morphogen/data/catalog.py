"""The built-in tasks by name: their names, descriptions, host topologies, host sizes and optimizers.

Plain values, no torch: the command line lists and checks task names without loading it, and the data
layer imports no other morphogen layer.
"""

from __future__ import annotations

TASK_DESCRIPTIONS: dict[str, str] = {
    "digits": "scikit-learn's 8x8 handwritten digits, 10 classes (no download)",
    "cifar10": "CIFAR-10 32x32 colour images, 10 classes (run and train need --data-dir with cifar-10-batches-py)",
    "text": "character-level language model on the Python standard library's sources (or --text-file)",
    "mnist1d": "MNIST-1D: 40-step 1D sequences, 10 classes, generated offline (Conv1dHost)",
}
"""One line per task, for `morphogen list tasks`."""

TASK_NAMES: tuple[str, ...] = ("digits", "cifar10", "text", "mnist1d")


def unknown_task_message(name: str) -> str:
    """The line for a task name that is no built-in task: the valid names, and how a task of one's own is named
    (a name without its module's `:function` is the usual slip)."""
    return (f"unknown task {name!r}; valid task names: {', '.join(TASK_NAMES)}, or module:function for a task of "
            "your own (my_task:make_task)")

CNN_HOST_SIZE = {"n_blocks": 3, "base_channels": 32, "kernel_size": 3}
"""CNNHost size for `cifar10`: 3 blocks of width 32/64/128."""
DIGITS_HOST_SIZE = {"n_blocks": 2, "base_channels": 8, "kernel_size": 3}
"""CNNHost size for `digits`: 2 blocks of width 8/16 (1,442 parameters, ~97.7% without growth). Small on
purpose, so that growth has room: the 3-block width-32 host (94k parameters) reaches ~99.4%, and a
conv seed at r0c0 of this host trained from scratch with it reaches ~98.5%."""
TRANSFORMER_HOST_SIZE = {"d_model": 32, "n_heads": 4, "n_layers": 2, "block_size": 64, "n_segments": 2}
"""TransformerHost size for `text`: 2 layers of width 32, ~31k parameters for a ~100-character vocabulary.
Measured on 1,000 training windows, 30 epochs, AdamW (tuning seed 100): it reaches ~50.7% character accuracy,
as much as the 4-layer width-64 host (210k parameters, ~50.8%) in a third of the time; width 16 reaches ~44.6%."""
MNIST1D_HOST_SIZE = {"n_blocks": 2, "base_channels": 8, "kernel_size": 5}
"""Conv1dHost size for `mnist1d`: 2 blocks of width 8/16 (898 parameters; 40 points pool to 20, 10), ~90%
without growth. Deliberately small, below the ~5k-parameter CNN of the MNIST-1D paper (94%), so that
growth has room: a 3-block width-8 host reaches ~95%, and this host with a conv_heavy seed in r0c1
trained from scratch ~95.6%."""

TASK_TOPOLOGIES: dict[str, str] = {"digits": "cnn", "cifar10": "cnn", "text": "transformer", "mnist1d": "cnn1d"}
"""The host topology of each task."""
DEFAULT_HOST_SIZES: dict[str, dict[str, int]] = {
    "digits": DIGITS_HOST_SIZE, "cifar10": CNN_HOST_SIZE, "text": TRANSFORMER_HOST_SIZE, "mnist1d": MNIST1D_HOST_SIZE,
}
"""Each task's host size: the host constructor arguments a `[host]` table may override, with their defaults."""

TEXT_OPTIMIZER = {"name": "adamw", "host_lr": 5e-3, "seed_lr": 5e-3, "host_weight_decay": 0.01,
                  "seed_weight_decay": 0.0, "seed_warmup_steps": 100}
"""AdamW for the `text` transformer: under the image tasks' SGD (lr 0.01, momentum 0.9) the 210k-parameter host
stayed far from fitting (39% character accuracy after 30 epochs on 1,000 windows); AdamW at lr 2e-3 took it
to ~50.8%. For the default 2-layer width-32 host, lr 5e-3 beat 2e-3 (50.7% against 49.3%, tuning seed 100).
A new seed's rate is re-warmed over its first 100 steps (a quarter of an epoch of the whole corpus): Adam's first
steps on empty moments move every weight of a new block by about the learning rate."""
DEFAULT_OPTIMIZERS: dict[str, dict[str, object]] = {"text": TEXT_OPTIMIZER}
"""Each task's default optimizer, as `[episode.optimizer]` keys (`morphogen.env.optimizer.OptimizerConfig`)
over that class's defaults; a task not listed trains with those of its host's topology (`TOPOLOGY_OPTIMIZERS`),
else with the class's (SGD, lr 0.01, momentum 0.9). Plain values: the data layer imports no other morphogen
layer."""
TOPOLOGY_OPTIMIZERS: dict[str, dict[str, object]] = {"transformer": TEXT_OPTIMIZER}
"""The default optimizer of a task not in `DEFAULT_OPTIMIZERS` (a user's), by its host's topology: a user's
transformer trains with AdamW as `text` does. On the padded-sequence classifier of `benchmarks/your_model.py`
(`padded`: two attention blocks of width 16, 4,000 sequences, 30 epochs) the host without growth ended at 68.31%
(mean over seeds 0-9) with AdamW and 53.89% with SGD (lr 0.01, momentum 0.9)."""
