"""Growth inside your own training loop: three calls, and the loop, the host's optimizer and its schedule stay yours.

    optimizer = torch.optim.AdamW(host.parameters(), lr=1e-3)  # your model's parameters; a rollback resets it
    grower = morphogen.Grower(host, validation=(x_val, y_val), epochs=20, optimizer=optimizer)
    for epoch in range(20):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = grower.training_step(inputs, targets)  # forward; TRAINING seeds learn from their shadow
            loss.backward()
            grower.after_backward()                        # gradient health; the seeds' optimizers step
            optimizer.step()
        report = grower.end_epoch()                        # counterfactual validation; the controller acts

What each call does, and why it must be there:
- `training_step` runs the model with every TRAINING seed's shadow (the network with that seed blended in
  at alpha 1), backpropagates the shadow loss into those seeds' parameters only, and returns the host
  loss for you to backpropagate (under your autocast, scaled by your `GradScaler`, accumulated as you like).
- `after_backward` reads the gradients of the host and of the live seeds for the gradient-health gate, then
  clips and steps each live seed's own optimizer. Seeds keep their own optimizers (morphogen's seed
  optimizer settings), so a new seed never has to be added to yours. With a `GradScaler`, pass it: the
  blended seeds' gradients, which came through your scaled loss, are unscaled with it, and their step is skipped
  when they are not finite (a TRAINING seed's gradients come from its shadow loss, never scaled).
- `end_epoch` validates the model and its counterfactual configurations on the validation data, lets the
  governor judge the epoch (a divergence rolls host and seeds back; with `optimizer=` given, your optimizer's
  state is cleared and its learning rate backed off too), advances the seeds' lifecycle, and has the
  controller decide the action the next epoch starts with.
A forgotten call is an error that names it at the next `end_epoch`, never a silent refusal later.

Between epochs, `state_dict()` saves where the growth stands and `load_state_dict()` resumes it on a Grower built
the same way: a stopped job goes on exactly as if it had not stopped. With `distributed=True`, processes that each
train a share of every batch grow one model (`grower_replicas.Replicas`; no DistributedDataParallel, which cannot
follow a model that gains parameters).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from morphogen.commands.run import ConfigSource, depth_growth_note, settings_from
from morphogen.control.heuristic import HeuristicConfig, HeuristicController
from morphogen.core.hosts import SegmentedHost
from morphogen.core.model import MorphogeneticModel, shadow_rows
from morphogen.core.slot import SlotMode
from morphogen.core.training_mode import left_in_eval, modes_kept
from morphogen.data.user import LossFunction, task_from_data
from morphogen.env.actions import Action
from morphogen.env.compute import note_batch
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode, StepResult, task_with_host
from morphogen.env.evaluation import refuse_first_batch_classes
from morphogen.env.play import Controller, connect, savable
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.env.training import clear_stale_casts
from morphogen.grower_checks import check_optimizer, kind_problem, state_problem, targets_dtype_problem
from morphogen.grower_replicas import Replicas
from morphogen.inputs import Inputs, dtype_mismatch, rows
from morphogen.inputs import problem as inputs_problem
from morphogen.limits import MAX_EPOCHS, check_count
from morphogen.telemetry.gradients import clip_gradients
from morphogen.telemetry.sinks import Telemetry

#: The version of what `Grower.state_dict` writes; a state of another is refused when loaded.
GROWER_STATE_FORMAT = 1
#: The entries of `Grower.state_dict` that `load_state_dict` reads.
_STATE_KEYS = ("episode", "controller", "next_action", "applied")
#: What a call after the last epoch is told.
EPISODE_OVER = ("the growth episode is over (all its epochs were played); build a new Grower to grow again, or train "
                "grower.model on as any module, with an optimizer over all of grower.model.parameters() (the seeds' "
                "too)")


@dataclass(frozen=True)
class EpochReport:
    """What happened in one epoch of a `Grower`: the validation figures, the action and the next one."""

    epoch: int
    score: float
    """The validation score (accuracy in percent unless the task brought its own metric)."""
    loss: float
    parameters: int
    """Parameters of the model's output path: host plus blended seeds."""
    action: str
    """The action this epoch started with, e.g. "GERMINATE r0c1 conv_light", and whether it took effect."""
    succeeded: bool
    reason: str
    rolled_back: bool
    """The governor restored the last good state (training diverged)."""
    next_action: str | None
    """The action the next epoch starts with (already applied), None once the episode is over."""
    stages: dict[str, str]
    """Slot id -> stage of its seed ("dormant" when empty)."""
    snapshot: EpisodeSnapshot



class Grower:
    """Growth of a host inside a training loop you write; see the module docstring for the three calls."""

    def __init__(self, host: SegmentedHost, validation: object, *, epochs: int, loss: LossFunction | None = None,
                 metric: LossFunction | None = None, metric_name: str | None = None, num_classes: int | None = None,
                 optimizer: torch.optim.Optimizer | None = None, controller: Controller | None = None,
                 episode: EpisodeConfig | None = None, heuristic: HeuristicConfig | None = None, seed: int = 0,
                 slots: list[str] | None = None, telemetry: Telemetry | None = None,
                 validation_batch_size: int = 512, target_key: str | None = None, distributed: bool = False,
                 config: ConfigSource | None = None, policy: str | None = None) -> None:
        """`host` comes from `morphogen.host_from_module` and stays yours (no copy); `validation` is what
        `task_from_data` takes for a split (`target_key` as there). `optimizer` is the host's optimizer, given so
        that a rollback can reset it; `controller` defaults to the heuristic with `heuristic` settings.
        `config` gives `episode` and `heuristic` as `grow` takes its settings: a preset's name, a config file, a
        mapping of tables or a `RunConfig`. `policy` decides with a learned policy instead, as `grow(policy=...)`
        does: "default" (the one shipped with morphogen) or the run directory of a `morphogen train`.
        `distributed=True`: every process of the default `torch.distributed` group trains this model on its own
        batches and validates on its own share of the validation data (see `grower_replicas.Replicas`)."""
        if not isinstance(host, SegmentedHost):
            raise TypeError(f"Grower needs a host from morphogen.host_from_module, got {type(host).__name__}")
        check_optimizer(optimizer, host)
        check_count("Grower's epochs", epochs, MAX_EPOCHS)  # the episode's max_epochs, a name the loop never gave
        if policy is not None and controller is not None:
            raise ValueError("Grower: give controller= or policy=, not both")
        if config is not None:
            if episode is not None or heuristic is not None:
                raise ValueError("Grower: give config, or episode and heuristic, not both")
            settings = settings_from(config, "own loop", host.topology)
            episode, heuristic = settings.episode, settings.heuristic
        self._replicas = Replicas() if distributed else None
        # Parts of the host the loop put in eval mode (a frozen backbone's batch norm) stay so while it is probed.
        with modes_kept(host):
            device = next(host.parameters()).device
            # The grower trains nothing itself: the episode reads only the validation split, so it doubles as train.
            task = task_from_data("own loop", validation, validation, loss=loss, metric=metric, metric_name=metric_name,
                                  num_classes=num_classes, device=device, host=host, target_key=target_key)
            episode_config = dataclasses.replace(episode or EpisodeConfig(), max_epochs=epochs,
                                                 validation_batch_size=validation_batch_size)
            self.episode = MorphogenesisEpisode(task_with_host(task), episode_config, seed=seed, slots=slots,
                                                telemetry=telemetry, host=host)
            if self._replicas is not None:
                self.episode.sum_over_processes = self._replicas.sum
            self.episode.divergence_advice = ("lower your optimizer's learning rate (it steps the host) or the seeds' "
                                              "seed_lr (Grower(config={'episode': {'optimizer': {'seed_lr': ...}}}))")
            self.optimizer = optimizer
            self.snapshot = self.episode.reset()
            assert self.episode.model is not None
            self.model: MorphogeneticModel = self.episode.model
            if policy is not None:
                from morphogen.commands.evaluate import load_learned_policy  # loads the policy's modules only here

                controller = load_learned_policy(policy, str(device)).factory(self.episode)
            self.controller = controller or HeuristicController(self.episode.action_space,
                                                                task_with_host(task).topology, heuristic)
            # The episode measures what the controller chooses by (the heuristic's growth signals), as `run` does.
            connect(self.episode, self.controller)
            self.controller.reset()
            note = depth_growth_note(self.controller, self.model)  # `run` prints it; a loop of one's own has no lines
            if note:
                warnings.warn(note.removeprefix("note: "), UserWarning, stacklevel=2)
            self._running: dict[str, list[nn.Parameter]] = {}
            self._training_modes: list[bool] | None = None  # of the host's modules, as the last step trained
            self._steps = self._after_backward_calls = 0
            self._targets_checked = False  # the class indices of the first batch that trains, read once
            self._action, self._applied = self._decide(self.snapshot)
        self._left = self._seeds_now()

    def _seeds_now(self) -> list[tuple[str, str, str | None]]:
        """Each slot's stage and blueprint: what the Grower left the model with, checked when an epoch begins."""
        return [(slot.slot_id, slot.stage.value, slot.blueprint) for slot in self.model.slots()]

    def _seeds_changed(self) -> str | None:
        """Which slot's seed changed since the Grower last left the model (its state loaded from elsewhere), or None."""
        for (slot_id, stage, blueprint), now in zip(self._left, self._seeds_now(), strict=True):
            if (stage, blueprint) != now[1:]:
                was, found = f"{blueprint} {stage}" if blueprint else stage, f"{now[2]} {now[1]}" if now[2] else now[1]
                return f"slot {slot_id} holds {found}, where the Grower left it {was}"
        return None

    def use_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Have a rollback clear `optimizer`'s state and back off its rate, as for `optimizer=`: for a host's optimizer
        built after the Grower (Lightning's `configure_optimizers`, which `GrowthCallback` hands on)."""
        check_optimizer(optimizer, self.model.host)
        self.optimizer = optimizer

    @property
    def done(self) -> bool:
        """The episode's epochs are all played."""
        return self.episode.done

    def training_step(self, inputs: Inputs, targets: Tensor) -> Tensor:
        """The host loss of one batch, for you to backpropagate; the TRAINING seeds' shadow loss is already in
        their gradients. `inputs` are what the model is called with: a tensor, or a tuple, list or dict of them.
        The model trains in training mode, but for layers of the host the loop left in eval mode while others train."""
        if self.done:
            raise RuntimeError(EPISODE_OVER)
        if self._steps == 0:  # the first batch says what the model is called with; later ones are not checked
            changed = self._seeds_changed()
            if changed is not None:
                raise RuntimeError(f"grower.model's seeds are not where the Grower left them ({changed}): its state "
                                   "was loaded from elsewhere. To resume, load grower.load_state_dict(state) from a "
                                   "grower.state_dict(), not grower.model's state")
            problem = inputs_problem(inputs) or kind_problem(self.model.host, inputs)
            if problem is not None:
                raise ValueError(f"training_step's inputs must be a tensor, or a tuple or dict of tensors, each "
                                 f"with a leading sample dimension, as the host's example_input was; got {problem}")
        model, trainer = self.model, self.episode.trainer
        self._into_training_mode()
        clear_stale_casts()  # an autocast around the whole loop would reuse the weights cast before your last step
        self._running = trainer.sync_seed_optimizers()
        for parameters in self._running.values():
            for parameter in parameters:
                parameter.grad = None  # seeds are stepped here every batch, not by your optimizer
        try:
            output, shadow = model.forward_with_shadow(inputs, shadow_rows(rows(inputs), trainer.shadow_fraction))
        except RuntimeError as error:
            hint = dtype_mismatch(inputs, model.parameters(), error) if self._steps == 0 else ""
            if hint:
                raise ValueError(f"training_step: {hint} (the model failed on them: {error})") from None
            raise
        if not self._targets_checked:  # until a step succeeds: reading the targets' values waits for the device
            refuse_first_batch_classes(trainer.objective, self.episode.task.num_classes, targets,
                                       "training_step (the first batch)", output)
        try:
            loss = trainer.objective.checked_loss(output, targets)
        except RuntimeError as error:
            problem = targets_dtype_problem(self.episode.task.objective, output, targets)
            if problem:
                said = str(error).strip().splitlines()
                raise ValueError(f"training_step: {problem} (the loss failed on them: {said[0] if said else ''})") \
                    from None
            raise
        self._targets_checked = True
        trainer.backward_shadow(shadow, targets)
        trainer.add_epoch_losses(loss.detach(), 1)
        note_batch(trainer.batch_shapes, inputs)
        self._steps += 1
        return loss

    def _into_training_mode(self) -> None:
        """`model.train()`, but for the layers of the host the loop left in eval mode while others of it train (a
        frozen backbone's batch norm, whose running statistics must stay). A host wholly in eval mode (the loop
        validated the model itself) goes back to the modes the last step trained in."""
        model = self.model
        modules = list(model.host.modules())
        frozen = left_in_eval(model.host)
        model.train()
        if frozen is not None:
            for module in frozen:
                module.eval()
        elif self._training_modes is not None and len(self._training_modes) == len(modules):
            for module, mode in zip(modules, self._training_modes, strict=True):
                module.training = mode
        self._training_modes = [module.training for module in modules]

    def after_backward(self, scaler: torch.amp.GradScaler | None = None) -> None:
        """After `loss.backward()` and before your optimizer steps: gradient health, then the seeds' steps.

        With a `GradScaler`, call `scaler.unscale_(optimizer)` first if you want the host's gradient health
        measured unscaled, and pass `scaler` so that the blended seeds' gradients, which came through your scaled
        loss, are unscaled (one host sync); a TRAINING seed's came from its unscaled shadow loss and are left as
        they are.
        """
        if self._after_backward_calls >= self._steps:
            raise RuntimeError("after_backward() called more often than training_step() this epoch")
        if self._after_backward_calls == 0:  # once an epoch: a loop that calls it before backward does so every time
            trainable = [p for p in self.model.host_parameters() if p.requires_grad]
            if trainable and all(p.grad is None for p in trainable):
                raise RuntimeError("after_backward() found no gradient on the host: call it after "
                                   "training_step()'s loss.backward(), before optimizer.step()")
        self._after_backward_calls += 1
        trainer = self.episode.trainer
        if self._replicas is not None:
            self._replicas.average_gradients([*self.model.host_parameters(), *(p for ps in self._running.values()
                                                                                for p in ps)])
        # Only a blended seed's gradients came through your loss, which the scaler scaled; a TRAINING seed's came
        # from its shadow loss, which training_step backpropagated unscaled. Unscaled before the gradient health
        # reads them, so that a blended seed is not judged by gradients 65536 times its own.
        finite = {slot_id: _unscaled(parameters, scaler if self.model.slot(slot_id).mode is SlotMode.BLENDED else None)
                  for slot_id, parameters in self._running.items()}
        norms = self.episode.monitor.accumulate(self.model.host_parameters(), self._running)
        for slot_id, parameters in self._running.items():
            if finite[slot_id]:
                clip_gradients(parameters, trainer.config.clip_norm, norms.seeds.get(slot_id))
                trainer.step_seed(slot_id)

    def end_epoch(self) -> EpochReport:
        """Validate, judge and advance the growth; the next epoch's action is decided and applied."""
        self._check_epoch_calls()
        self._steps = self._after_backward_calls = 0
        action, (succeeded, reason) = self._action, self._applied
        # A loop may call this under `torch.no_grad()` or `inference_mode()`, as one wraps a validation; the growth
        # signals and a new seed's measurements take gradients, and a seed built under inference mode never trains.
        # Validating and probing leave the host's modes as the loop set them (a frozen backbone's in eval).
        with torch.inference_mode(False), torch.enable_grad(), modes_kept(self.model.host):
            result = self.episode.finish_epoch(action, succeeded, reason)
            self.episode.telemetry.end_epoch(result.snapshot.epoch)
            if result.rollback is not None and self.optimizer is not None:
                self.optimizer.state.clear()  # its moments point the way that diverged
                if result.rollback.backed_off == "host":
                    for group in self.optimizer.param_groups:
                        group["lr"] *= self.episode.config.governor.backoff
            self.snapshot = result.snapshot
            next_action = None
            if not result.done:
                self._action, self._applied = self._decide(result.snapshot)
                next_action = self._action.describe()
        self._left = self._seeds_now()
        return self._report(result, action, next_action)

    def _check_epoch_calls(self) -> None:
        """Refuse an `end_epoch` after the last epoch, or one whose epoch missed a call."""
        if self.done:
            raise RuntimeError(f"end_epoch() after the last epoch: {EPISODE_OVER}")
        if self._steps == 0:
            raise RuntimeError("end_epoch() without a training_step() this epoch: call training_step(inputs, "
                               "targets) for every batch")
        if self._after_backward_calls != self._steps:
            raise RuntimeError(f"after_backward() was called for {self._after_backward_calls} of {self._steps} "
                               "batches this epoch: call it once after each training_step()'s loss.backward() (with "
                               "gradient accumulation, after every micro-batch's), before optimizer.step()")

    def state_dict(self) -> dict[str, Any]:
        """Everything the growth needs to go on where it stands, saved between epochs (after `end_epoch`): the
        model (host, seeds and their stages), the seeds' optimizers, the governor, the controller's memory and the
        action the next epoch starts with. Plain values and tensors: `torch.load(path)` reads it with its default
        `weights_only=True`. Your optimizer's state is yours to save beside it."""
        if self._steps:
            raise RuntimeError("save a Grower between epochs (after end_epoch()), not in the middle of one")
        return {"format": GROWER_STATE_FORMAT, "episode": self.episode.state_dict(),
                "controller": savable(self.controller, "saved").state_dict(),
                "controller_kind": type(self.controller).__name__, "next_action": self._action.state(),
                "applied": [self._applied[0], self._applied[1]]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from `state_dict`, on a Grower built as the saved one was (the same host architecture, slots,
        validation data, settings and controller), before its first `training_step`. The model's host
        parameters are loaded in place, so an optimizer built on them keeps working; load its own state too."""
        if self._steps:
            raise RuntimeError("load a Grower's state before its first training_step(), not in the middle of an epoch")
        if not isinstance(state, dict) or state.get("format") != GROWER_STATE_FORMAT:
            found = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a Grower state of format {GROWER_STATE_FORMAT} (found {found!r}): save it with "
                             "Grower.state_dict() of this version of morphogen")
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"not a whole Grower state: it lacks {', '.join(missing)} (save it with "
                             "Grower.state_dict(), and load that dict as it was saved)")
        controller = savable(self.controller, "restored")
        problem = state_problem(state, self.controller, self.snapshot, self.model)
        if problem:
            raise ValueError(f"this Grower is not built as the saved one was: {problem}; build it with the same "
                             "network, slots, epochs and settings")
        self.snapshot = self.episode.load_state_dict(state["episode"])
        controller.load_state_dict(state["controller"], self.episode.action_space)
        succeeded, reason = state["applied"]
        self._action, self._applied = Action.from_state(state["next_action"]), (bool(succeeded), str(reason))
        self._left = self._seeds_now()

    def _decide(self, snapshot: EpisodeSnapshot) -> tuple[Action, tuple[bool, str]]:
        action = self.controller.act(snapshot, self.episode.masks())
        if self._replicas is None:
            return action, self.episode.apply_action(action)
        action = self._replicas.first_process_action(action)
        applied = self.episode.apply_action(action)
        self._replicas.copy_first_process_model(self.model)  # a new seed's initial weights, batch-norm statistics
        return action, applied

    def _report(self, result: StepResult, action: Action, next_action: str | None) -> EpochReport:
        s = result.snapshot
        return EpochReport(
            epoch=s.epoch, score=s.val_accuracy, loss=s.val_loss, parameters=s.active_parameters,
            action=action.describe(), succeeded=result.action_succeeded, reason=result.reason,
            rolled_back=result.rollback is not None, next_action=next_action,
            stages={slot.slot_id: slot.stage.value for slot in s.slots}, snapshot=s)


def _unscaled(parameters: list[nn.Parameter], scaler: torch.amp.GradScaler | None) -> bool:
    """Unscale the gradients of `parameters` with `scaler`; False when they are not finite (skip the step)."""
    gradients = [p.grad for p in parameters if p.grad is not None]
    if scaler is None or not scaler.is_enabled() or not gradients:
        return bool(gradients)
    torch._foreach_mul_(gradients, 1.0 / scaler.get_scale())  # get_scale() syncs: the fp16 path only
    return bool(torch.stack([g.isfinite().all() for g in gradients]).all())
