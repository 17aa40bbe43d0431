"""One training batch of a morphogenetic model: host and every live seed, each with its own optimizer.

A TRAINING seed learns in closed loop (docs/architecture.md#shadow-pass): its gradient comes from the
loss of the network with its output blended in at alpha 1 (the shadow pass), restricted to its own
parameters, while the host and blended seeds learn from the real model's loss.

Gradients are clipped per group (host, then each seed) so a young seed's large gradients cannot eat
the host's step budget, and vice versa; the clip reuses each group's total norm that the isolation
monitor computed of the same gradients just before. Nothing here synchronizes: the loss is accumulated on the
device and read once per epoch by the episode.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import Tensor, nn

from morphogen.core.isolation import IsolationMonitor
from morphogen.core.model import MorphogeneticModel, ShadowOutput, shadow_rows
from morphogen.core.training_mode import left_in_eval
from morphogen.env.compute import note_batch
from morphogen.env.evaluation import Objective, summable, task_loss
from morphogen.env.optimizer import OptimizerConfig, warmup_factor
from morphogen.inputs import Inputs, InputSpec, rows
from morphogen.telemetry.gradients import clip_gradients


def _scale(optimizer: torch.optim.Optimizer, change: float) -> None:
    """Multiply every learning rate of `optimizer` by `change` (nothing to do when it is 1)."""
    if change != 1.0:
        for group in optimizer.param_groups:
            group["lr"] *= change



def clear_stale_casts() -> None:
    """Forget the low-precision copies of the weights that an enclosing `torch.autocast` keeps.

    Autocast casts a weight once per region and reuses the cast until the region ends; a whole run called under
    one region (`with torch.autocast(...): morphogen.grow(...)`) would then train every batch with the weights of
    its first, while the optimizer moves the float32 ones (a language model's loss rose from 4.6 to 8.7 in its
    first epoch). One call per batch, before its forward; nothing without autocast.
    """
    torch.clear_autocast_cache()

class HostAndSeedTrainer:
    """Trains an episode's model batch by batch: the host and every live seed, each with its own optimizer.

    Owns those optimizers and the epoch's loss accumulator. (The policy's trainer is
    `morphogen.control.trainer.PPOTrainer`.)"""

    def __init__(self, model: MorphogeneticModel, config: OptimizerConfig, monitor: IsolationMonitor,
                 objective: Objective | None = None, shadow_fraction: float = 1.0) -> None:
        self.model, self.config, self.monitor = model, config, monitor
        #: Fraction of each batch the TRAINING seeds' shadow pass runs on (`EpisodeConfig.shadow_fraction`).
        self.shadow_fraction = shadow_fraction
        #: The task's loss (cross-entropy unless the task brings its own).
        self.objective = objective or Objective(task_loss, None, custom=False)
        self.host_optimizer = config.build(model.host_parameters(), seed=False)
        #: Modules of the host in eval mode while the rest trains when training began (a frozen backbone the user
        #: put in eval mode, whose batch norm must keep its statistics): they stay in eval mode.
        self.kept_in_eval = left_in_eval(model.host) or []
        self.seed_optimizers: dict[str, tuple[nn.Module, torch.optim.Optimizer]] = {}
        #: Steps each seed's optimizer has taken (for its learning-rate warm-up), by slot id.
        self.seed_steps: dict[str, int] = {}
        #: Product of the governor's back-offs of the seeds' learning rate in this episode.
        self.seed_lr_scale = 1.0
        #: The learning-rate schedule's factor of the host for the epoch being trained
        #: (`OptimizerConfig.schedule_factor`), and the epoch and the episode's epochs it was set for.
        self.schedule_factor = 1.0
        self.epoch, self.epochs = 0, 1
        #: Each seed's epoch of birth (its optimizer's first epoch) and its own schedule factor, by slot id: a
        #: seed's rates follow the schedule over the epochs left from its birth, so a late seed starts at the
        #: full rate, as new layers are re-warmed in growth methods, instead of the host's decayed one.
        self.seed_born: dict[str, int] = {}
        self.seed_schedule: dict[str, float] = {}
        self._loss_sum: Tensor | None = None
        self.batches = 0
        #: Input spec (shapes and dtypes) -> batches trained since the last `take_batch_shapes`: what the epoch's
        #: FLOPs are charged for.
        self.batch_shapes: Counter[InputSpec] = Counter()

    def state_dict(self) -> dict[str, Any]:
        """Optimizer states and learning-rate bookkeeping, between epochs (none of an epoch's losses pending)."""
        if self._loss_sum is not None or self.batch_shapes:
            raise RuntimeError("the trainer is saved between epochs, not while one is being trained")
        # Optimizers of seeds pruned since the last batch are dropped at the next one: they are not saved.
        live = [slot_id for slot_id, (seed, _) in self.seed_optimizers.items() if self.model.slot(slot_id).seed is seed]
        return {"host_optimizer": self.host_optimizer.state_dict(),
                "seed_optimizers": {slot_id: self.seed_optimizers[slot_id][1].state_dict() for slot_id in live},
                "seed_steps": {slot_id: self.seed_steps[slot_id] for slot_id in live},
                "seed_born": {slot_id: self.seed_born[slot_id] for slot_id in live},
                "seed_schedule": {slot_id: self.seed_schedule[slot_id] for slot_id in live},
                "seed_lr_scale": self.seed_lr_scale,
                "schedule_factor": self.schedule_factor, "epoch": self.epoch, "epochs": self.epochs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` onto a model whose seeds were loaded first (each seed's optimizer is rebuilt on
        its parameters, then given its saved state)."""
        self.host_optimizer.load_state_dict(state["host_optimizer"])
        self.seed_optimizers = {}
        for slot_id, optimizer_state in state["seed_optimizers"].items():
            slot = self.model.slot(slot_id)
            if slot.seed is None:
                raise ValueError(f"the saved trainer has an optimizer for a seed in {slot_id!r}, which holds none")
            optimizer = self.config.build(slot.seed_parameters(), seed=True)
            optimizer.load_state_dict(optimizer_state)
            self.seed_optimizers[slot_id] = (slot.seed, optimizer)
        self.seed_steps = {str(k): int(v) for k, v in state["seed_steps"].items()}
        self.seed_born = {str(k): int(v) for k, v in state["seed_born"].items()}
        self.seed_schedule = {str(k): float(v) for k, v in state["seed_schedule"].items()}
        self.seed_lr_scale, self.schedule_factor = float(state["seed_lr_scale"]), float(state["schedule_factor"])
        self.epoch, self.epochs = int(state["epoch"]), int(state["epochs"])

    def sync_seed_optimizers(self) -> dict[str, list[nn.Parameter]]:
        """Create optimizers for new seeds, drop those of removed ones; return the running seeds' params."""
        running: dict[str, list[nn.Parameter]] = {}
        for slot in self.model.slots():
            kept = self.seed_optimizers.get(slot.slot_id)
            if slot.seed is None:
                if kept is not None:
                    del self.seed_optimizers[slot.slot_id]
                    del self.seed_steps[slot.slot_id], self.seed_born[slot.slot_id], self.seed_schedule[slot.slot_id]
                continue
            if kept is None or kept[0] is not slot.seed:
                # A new seed: fresh optimizer state, and its learning rate re-warmed from the first step.
                self.seed_born[slot.slot_id] = self.epoch
                factor = self.seed_schedule[slot.slot_id] = self._seed_factor(slot.slot_id)
                optimizer = self.config.build(slot.seed_parameters(), seed=True, lr_scale=self.seed_lr_scale * factor)
                self.seed_optimizers[slot.slot_id] = (slot.seed, optimizer)
                self.seed_steps[slot.slot_id] = 0
            if slot.is_running:
                running[slot.slot_id] = [p for p in slot.seed_parameters() if p.requires_grad]
        return running

    def train_batch(self, inputs: Inputs, targets: Tensor) -> None:
        """Forward, backward, per-group clip and optimizer steps on one batch, the model in training mode."""
        model = self.model
        if self.batches == 0:
            # Once an epoch: nothing between two of its batches changes a mode (validation and the growth probes
            # restore the ones they found), and walking every module each batch was 2-5% of a step.
            model.train()
            for module in self.kept_in_eval:
                module.eval()
        clear_stale_casts()
        note_batch(self.batch_shapes, inputs)
        running = self.sync_seed_optimizers()
        model.zero_grad(set_to_none=True)
        output, shadow = model.forward_with_shadow(inputs, shadow_rows(rows(inputs), self.shadow_fraction))
        loss = self.objective.checked_loss(output, targets)
        torch.autograd.backward(loss)
        self.backward_shadow(shadow, targets)
        host_parameters = model.host_parameters()
        norms = self.monitor.accumulate(host_parameters, running)
        clip_gradients(host_parameters, self.config.clip_norm, norms.host)
        self.host_optimizer.step()
        for slot_id, parameters in running.items():
            if parameters:
                clip_gradients(parameters, self.config.clip_norm, norms.seeds.get(slot_id))
                self.step_seed(slot_id)
        self._add_loss(loss)
        self.batches += 1

    def step_seed(self, slot_id: str) -> None:
        """Step the optimizer of the seed in `slot_id`, at its warmed-up share of the learning rate."""
        optimizer = self.seed_optimizers[slot_id][1]
        step = self.seed_steps[slot_id] = self.seed_steps[slot_id] + 1
        if step <= self.config.seed_warmup_steps:
            lr = (self.config.seed_lr * self.seed_lr_scale * self.seed_schedule[slot_id]
                  * warmup_factor(step, self.config.seed_warmup_steps))
            for group in optimizer.param_groups:
                group["lr"] = lr
        optimizer.step()

    def warming_up(self) -> bool:
        """Whether some seed's learning rate is still being re-warmed (it changes from one step to the next)."""
        return any(step < self.config.seed_warmup_steps for step in self.seed_steps.values())

    def backward_shadow(self, shadow: ShadowOutput | None, targets: Tensor) -> None:
        """Backpropagate the shadow loss of every TRAINING seed into that seed's parameters only
        (docs/architecture.md#shadow-pass)."""
        if shadow is not None and shadow.parameters:
            shadow_loss = self.objective.shadow_loss(shadow.outputs, targets[:shadow.rows])  # the rows it ran on
            torch.autograd.backward(shadow_loss, inputs=list(shadow.parameters))

    def add_epoch_losses(self, loss_sum: Tensor, batches: int) -> None:
        """Add the summed training loss of `batches` batches trained elsewhere (the batched envs of a vector)."""
        self._add_loss(loss_sum)
        self.batches += batches

    def _add_loss(self, loss: Tensor) -> None:
        """Add `loss` to the epoch's sum, kept in float32 at least: in a bfloat16 model's dtype a sum of hundreds of
        batch losses rounds each new one away."""
        detached = summable(loss.detach())
        self._loss_sum = detached.clone() if self._loss_sum is None else self._loss_sum.add_(detached)

    def take_epoch_loss(self) -> Tensor:
        """Mean training loss of the batches since the last call, as a device tensor (no sync)."""
        if self._loss_sum is None or self.batches == 0:
            raise RuntimeError("no batch was trained this epoch")
        mean = self._loss_sum / self.batches
        self._loss_sum, self.batches = None, 0
        return mean

    def take_batch_shapes(self) -> Counter[InputSpec]:
        """The input specs of the batches trained since the last call (and forget them)."""
        shapes, self.batch_shapes = self.batch_shapes, Counter()
        return shapes

    def start_epoch(self, epoch: int, epochs: int) -> None:
        """Set the learning rates of the host and of every seed for epoch `epoch` (from 0) of `epochs`, as the
        config's schedule says: the host's over the episode, each seed's over the epochs left at its birth.
        Rates are multiplied by the change of the schedule's factor, as the governor's back-offs multiply them,
        so both compose."""
        self.epoch, self.epochs = epoch, epochs
        factor = self.config.schedule_factor(epoch, epochs)
        _scale(self.host_optimizer, factor / self.schedule_factor)
        self.schedule_factor = factor
        for slot_id, (_, optimizer) in self.seed_optimizers.items():
            factor = self._seed_factor(slot_id)
            _scale(optimizer, factor / self.seed_schedule[slot_id])
            self.seed_schedule[slot_id] = factor

    def _seed_factor(self, slot_id: str) -> float:
        """The schedule's factor of the seed in `slot_id` this epoch: the schedule over its epochs since birth."""
        born = self.seed_born[slot_id]
        return self.config.schedule_factor(self.epoch - born, self.epochs - born)

    def back_off(self, what: str, factor: float) -> None:
        """Multiply the learning rate of the host (`what="host"`) or of every seed (`"seeds"`, also those
        germinated later) by `factor`: the governor's response to a divergence it rolled back."""
        if what == "host":
            _scale(self.host_optimizer, factor)
            return
        assert what == "seeds", what
        self.seed_lr_scale *= factor  # a seed still warming up reads it at its next step
        for _, optimizer in self.seed_optimizers.values():
            _scale(optimizer, factor)

    def reset_host_momentum(self) -> None:
        """Forget the momentum of the host and of every kept seed (after a rollback it points the way that
        diverged, and after a non-finite epoch it is NaN: a fossilized seed would poison every later step).

        All optimizer state goes: SGD's momentum buffers, AdamW's running averages and step counts (AdamW
        then restarts with its bias correction, as on the first step)."""
        self.host_optimizer.state.clear()
        for _, optimizer in self.seed_optimizers.values():
            optimizer.state.clear()
