"""A growing run in the user's own loop saved between epochs and resumed: it goes on exactly as if never stopped."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path

import pytest
import torch
from models import blobs, eager_config, mlp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import morphogen
from morphogen import Grower
from morphogen.control.learned import PolicyController, build_agent
from morphogen.core.lifecycle import Stage
from morphogen.env.actions import Action
from morphogen.env.optimizer import OptimizerConfig
from morphogen.grower import EpochReport

EPOCHS = 10
TRAIN, VALIDATION = blobs(192, 0), blobs(96, 1)


def with_dropout() -> nn.Sequential:
    """`mlp()` with dropout after its first layer: a model that draws from torch's global generator as it trains."""
    layers = list(mlp())
    return nn.Sequential(layers[0], nn.Dropout(0.2), *layers[1:])


def build(controller: str = "heuristic", dropout: bool = False
          ) -> tuple[Grower, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The same Grower, optimizer and schedule every time: what a user's script rebuilds before loading a state."""
    torch.manual_seed(0)
    network, slots = (with_dropout(), ["2", "4"]) if dropout else (mlp(), ["1", "3"])  # after the same two ReLUs
    host = morphogen.host_from_module(network, slots, example_input=TRAIN[0][:2])
    config = eager_config(EPOCHS)
    keeps_any = dataclasses.replace(config.heuristic, fossilize_threshold=0.0, loss_fossilize_threshold=0.0,
                                    relative_fossilize_threshold=0.0)  # so that a seed is kept within EPOCHS
    options: dict[str, object] = {}
    if controller == "policy":
        options["controller"] = PolicyController(build_agent(16), deterministic=False, seed=3)
    # The seeds' rates re-warmed over 20 steps and decayed by their own schedule: state a resume must carry.
    seed_rates = OptimizerConfig(name="adamw", seed_lr=0.02, seed_warmup_steps=20, schedule="cosine")
    episode = dataclasses.replace(config.episode, optimizer=seed_rates)
    grower = Grower(host, VALIDATION, epochs=EPOCHS, episode=episode, heuristic=keeps_any,
                    **options)  # type: ignore[arg-type]
    optimizer = torch.optim.AdamW(grower.model.host_parameters(), lr=1e-2)
    return grower, optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, EPOCHS)


def train_batches(grower: Grower, optimizer: torch.optim.Optimizer,
                  schedule: torch.optim.lr_scheduler.LRScheduler, epoch: int) -> None:
    """An epoch's batches in an order fixed by the epoch number, so that a resumed run sees the same batches."""
    order = torch.randperm(len(TRAIN[1]), generator=torch.Generator().manual_seed(epoch))
    for rows in order.split(32):
        optimizer.zero_grad()
        grower.training_step(TRAIN[0][rows], TRAIN[1][rows]).backward()
        grower.after_backward()
        optimizer.step()
    schedule.step()


def train_epoch(grower: Grower, optimizer: torch.optim.Optimizer,
                schedule: torch.optim.lr_scheduler.LRScheduler, epoch: int) -> EpochReport:
    train_batches(grower, optimizer, schedule, epoch)
    return grower.end_epoch()


def figures(report: EpochReport) -> tuple[object, ...]:
    return report.epoch, report.score, report.loss, report.parameters, report.action, report.next_action, report.stages


def resumed(cut: int, path: Path, controller: str = "heuristic") -> tuple[list[EpochReport], Grower]:
    """Train `cut` epochs, save everything to `path`, build all anew, load, and train the rest."""
    grower, optimizer, schedule = build(controller)
    for epoch in range(cut):
        train_epoch(grower, optimizer, schedule, epoch)
    torch.save({"grower": grower.state_dict(), "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict()}, path)
    del grower, optimizer, schedule
    grower, optimizer, schedule = build(controller)
    saved = torch.load(path)  # weights_only=True: the state is plain values and tensors
    grower.load_state_dict(saved["grower"])
    optimizer.load_state_dict(saved["optimizer"])
    schedule.load_state_dict(saved["schedule"])
    return [train_epoch(grower, optimizer, schedule, epoch) for epoch in range(cut, EPOCHS)], grower


def test_a_grower_saved_in_any_stage_of_its_seeds_goes_on_exactly_as_if_never_stopped(tmp_path: Path) -> None:
    grower, optimizer, schedule = build()
    reference = [train_epoch(grower, optimizer, schedule, epoch) for epoch in range(EPOCHS)]
    stages_at_cut = {Stage(stage) for report in reference[:-1] for stage in report.stages.values()}
    # The cuts fall while a seed trains behind the host, blends in, is held and is kept: every state is exercised.
    assert {Stage.TRAINING, Stage.BLENDING, Stage.HOLDING, Stage.FOSSILIZED} <= stages_at_cut
    for cut in range(1, EPOCHS):
        reports, continued = resumed(cut, tmp_path / f"cut{cut}.pt")
        assert [figures(r) for r in reports] == [figures(r) for r in reference[cut:]], f"resumed after epoch {cut}"
        for (name, a), (_, b) in zip(grower.model.state_dict().items(), continued.model.state_dict().items(),
                                     strict=True):
            assert not isinstance(a, torch.Tensor) or torch.equal(a, b), f"{name} after a cut at epoch {cut}"
        assert continued.episode.compute.total == grower.episode.compute.total
        assert continued.episode.episode_return == grower.episode.episode_return


def same(a: object, b: object) -> bool:
    """Equal values, tensors compared element by element, containers recursively."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(same, a, b))
    return a == b or (a != a and b != b)  # NaN stands for a value not measured


def test_with_dropout_the_growth_draws_nothing_from_torchs_global_generator_and_resumes_to_the_bit(
        tmp_path: Path) -> None:
    """torch's global generator is the user's: `end_epoch` (validation, FLOP counts of each new plan, which run a
    copy in training mode, growth signals, germination) leaves it where it was. So a user who saves
    `torch.get_rng_state()` with the checkpoint resumes a model with dropout exactly, also at a cut after which a
    plan counted before the cut is met again (a fresh process counts it anew)."""
    whole, optimizer, schedule = build(dropout=True)
    reference = []
    for epoch in range(EPOCHS):
        train_batches(whole, optimizer, schedule, epoch)
        generator = torch.get_rng_state()
        reference.append(whole.end_epoch())
        assert torch.equal(torch.get_rng_state(), generator), f"end_epoch {epoch + 1} drew from it"
    # After these cuts the new process counts again a plan (of training or of validation's alphas) that the run
    # never stopped had counted before the cut: they resumed other dropout masks while the counts drew.
    for cut in (5, 8):
        grower, optimizer, schedule = build(dropout=True)
        for epoch in range(cut):
            train_epoch(grower, optimizer, schedule, epoch)
        torch.save({"grower": grower.state_dict(), "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(), "rng": torch.get_rng_state()}, tmp_path / "cut.pt")
        continued, optimizer, schedule = build(dropout=True)
        saved = torch.load(tmp_path / "cut.pt")
        continued.load_state_dict(saved["grower"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        torch.set_rng_state(saved["rng"])
        reports = [train_epoch(continued, optimizer, schedule, epoch) for epoch in range(cut, EPOCHS)]
        assert [figures(r) for r in reports] == [figures(r) for r in reference[cut:]], f"resumed after epoch {cut}"
        for name, value in whole.model.state_dict().items():
            assert same(value, continued.model.state_dict()[name]), f"{name} after a cut at epoch {cut}"


@pytest.mark.parametrize("controller", ["heuristic", "policy"])
def test_a_loaded_state_is_the_saved_state_in_every_field(controller: str) -> None:
    grower, optimizer, schedule = build(controller)
    for epoch in range(5):
        train_epoch(grower, optimizer, schedule, epoch)
    saved = grower.state_dict()
    loaded, _, _ = build(controller)
    loaded.load_state_dict(saved)
    assert same(loaded.state_dict(), saved)


def test_the_learned_policy_resumes_with_its_recurrent_state_and_sampling(tmp_path: Path) -> None:
    grower, optimizer, schedule = build("policy")
    reference = [train_epoch(grower, optimizer, schedule, epoch) for epoch in range(EPOCHS)]
    reports, _ = resumed(3, tmp_path / "policy.pt", "policy")
    assert [figures(r) for r in reports] == [figures(r) for r in reference[3:]]


def test_saving_or_loading_in_the_middle_of_an_epoch_is_an_error() -> None:
    grower, optimizer, schedule = build()
    train_epoch(grower, optimizer, schedule, 0)
    state = grower.state_dict()
    grower.training_step(TRAIN[0][:32], TRAIN[1][:32]).backward()
    with pytest.raises(RuntimeError, match="between epochs"):
        grower.state_dict()
    with pytest.raises(RuntimeError, match="before its first training_step"):
        grower.load_state_dict(state)


def test_a_state_of_another_kind_or_format_is_refused_in_one_line() -> None:
    grower, _, _ = build()
    with pytest.raises(ValueError, match=r"not a Grower state of format 1 \(found 0\)"):
        grower.load_state_dict({**grower.state_dict(), "format": 0})
    with pytest.raises(ValueError, match="found 'list'"):
        grower.load_state_dict([])  # type: ignore[arg-type]


def test_a_controller_that_cannot_be_saved_is_named() -> None:
    class Waits:
        def reset(self) -> None:
            """Nothing to forget."""

        def act(self, snapshot: object, masks: object) -> Action:
            return Action()

    torch.manual_seed(0)
    host = morphogen.host_from_module(mlp(), ["1", "3"], example_input=TRAIN[0][:2])
    grower = Grower(host, VALIDATION, epochs=2, controller=Waits())
    with pytest.raises(TypeError, match="the controller Waits cannot be saved"):
        grower.state_dict()


lightning = pytest.importorskip("lightning.pytorch", reason="the lightning extra is not installed")
from lightning_module import GrowingModule  # noqa: E402  # needs the extra checked just above


def fit(epochs: int, root: Path, checkpoint: Path | None = None) -> tuple[Grower, list[EpochReport]]:
    from morphogen.lightning import GrowthCallback

    grower, _, _ = build()
    callback = GrowthCallback(grower)
    trainer = lightning.Trainer(max_epochs=epochs, callbacks=[callback], accelerator="cpu", logger=False,
                                enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root))
    loader = DataLoader(TensorDataset(*TRAIN), batch_size=32)
    trainer.fit(GrowingModule(grower), loader, ckpt_path=None if checkpoint is None else str(checkpoint))
    return grower, callback.reports


def test_a_lightning_checkpoint_resumes_the_growth(tmp_path: Path) -> None:
    whole, reference = fit(EPOCHS, tmp_path / "whole")
    fit(3, tmp_path / "first")
    checkpoint = next((tmp_path / "first").rglob("*.ckpt"))
    continued, reports = fit(EPOCHS, tmp_path / "rest", checkpoint)
    assert [r.epoch for r in reports] == list(range(4, EPOCHS + 1)) and continued.done
    assert [figures(r) for r in reports] == [figures(r) for r in reference[3:]]
    assert all(torch.equal(a, b) for a, b in zip(whole.model.parameters(), continued.model.parameters(), strict=True))


class ValidatedModule(GrowingModule):
    """`GrowingModule` with a validation step of its own: Lightning runs it inside the training epoch."""

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_index: int) -> None:
        inputs, targets = batch
        self.log("accuracy", (self.model(inputs).argmax(1) == targets).float().mean())


def test_a_model_checkpoint_that_would_save_inside_an_epoch_is_refused_before_the_first_batch(tmp_path: Path) -> None:
    """A Grower is saved between epochs; a checkpoint taken inside one crashed `fit` where it fell (after hours,
    perhaps). Each setting that saves there is named when training starts, with the one to use instead."""
    from morphogen.lightning import GrowthCallback

    loader, validation = DataLoader(TensorDataset(*TRAIN), batch_size=32), DataLoader(TensorDataset(*VALIDATION))
    for checkpoint, validate_every, refused in (
            (lightning.callbacks.ModelCheckpoint(every_n_train_steps=5), 1,
             r"^GrowthCallback: ModelCheckpoint\(every_n_train_steps=5\) saves in the middle of an epoch, where a "
             r"grower cannot be saved .*; use ModelCheckpoint\(every_n_epochs=N\)"),
            (lightning.callbacks.ModelCheckpoint(), 2,
             r"ModelCheckpoint saves after validation, which Lightning runs inside the training epoch .*; use "
             r"ModelCheckpoint\(save_on_train_epoch_end=True\)$"),
            (lightning.callbacks.ModelCheckpoint(save_on_exception=True), 1,
             r"^GrowthCallback: ModelCheckpoint\(save_on_exception=True\) saves wherever an error stops training, "
             r"where a grower cannot be saved .*; use a ModelCheckpoint without save_on_exception"),
            (lightning.callbacks.ModelCheckpoint(save_on_train_epoch_end=True), 2, None)):
        grower, _, _ = build()
        callback = GrowthCallback(grower)
        trainer = lightning.Trainer(max_epochs=2, callbacks=[callback, checkpoint], accelerator="cpu", logger=False,
                                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                                    check_val_every_n_epoch=validate_every, default_root_dir=str(tmp_path))
        if refused is None:
            trainer.fit(ValidatedModule(grower), loader, validation)
            assert len(callback.reports) == 2 and Path(checkpoint.best_model_path).is_file()
            continue
        with pytest.raises(ValueError, match=refused):
            trainer.fit(ValidatedModule(grower), loader, validation)
        assert not callback.reports and grower.episode.trainer.batches == 0  # refused before any batch


def fit_by_steps(steps: int, root: Path, every_n_steps: int, checkpoint: Path | None = None,
                 callbacks: tuple[lightning.Callback, ...] = ()) -> tuple[Grower, list[EpochReport]]:
    """Train by `max_steps` on a loader of 6 batches an epoch, a growth period every `every_n_steps` steps."""
    from morphogen.lightning import GrowthCallback

    grower, _, _ = build()
    callback = GrowthCallback(grower, every_n_steps=every_n_steps)
    trainer = lightning.Trainer(max_steps=steps, callbacks=[callback, *callbacks], accelerator="cpu", logger=False,
                                enable_checkpointing=bool(callbacks), enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=str(root))
    trainer.fit(GrowingModule(grower), DataLoader(TensorDataset(*TRAIN), batch_size=32),
                ckpt_path=None if checkpoint is None else str(checkpoint))
    return grower, callback.reports


def test_a_lightning_run_by_steps_grows_once_every_n_steps_across_epochs_and_resumes_from_a_step(
        tmp_path: Path) -> None:
    """Periods of 4 steps over epochs of 6 batches: a period ends inside an epoch as often as at its end. A
    checkpoint every 8 steps is taken where a period ends, and `fit` from it goes on to the end of the growth."""
    grower, reports = fit_by_steps(EPOCHS * 4, tmp_path / "whole", 4)
    assert [r.epoch for r in reports] == list(range(1, EPOCHS + 1)) and grower.done
    assert any(r.action.startswith("GERMINATE") and r.succeeded for r in reports)
    saving = lightning.callbacks.ModelCheckpoint(dirpath=tmp_path / "checkpoints", every_n_train_steps=8,
                                                 save_top_k=-1)
    fit_by_steps(16, tmp_path / "first", 4, callbacks=(saving,))
    checkpoint = next((tmp_path / "checkpoints").glob("*step=16*.ckpt"))
    continued, rest = fit_by_steps(EPOCHS * 4, tmp_path / "rest", 4, checkpoint)
    assert [r.epoch for r in rest] == list(range(5, EPOCHS + 1)) and continued.done


def test_a_model_checkpoint_that_would_save_inside_a_period_of_steps_is_refused_before_the_first_batch(
        tmp_path: Path) -> None:
    from morphogen.lightning import GrowthCallback

    loader = DataLoader(TensorDataset(*TRAIN), batch_size=32)
    for checkpoint, refused in (
            (lightning.callbacks.ModelCheckpoint(every_n_train_steps=6),
             r"^GrowthCallback: ModelCheckpoint\(every_n_train_steps=6\) saves at steps that are not a multiple of "
             r"every_n_steps=4, where a grower cannot be saved \(its state is whole only between periods of "
             r"every_n_steps=4\); use ModelCheckpoint\(every_n_train_steps=k\*4\)"),
            (lightning.callbacks.ModelCheckpoint(),
             r"^GrowthCallback: ModelCheckpoint\(every_n_epochs=1\) saves at an epoch's end"),
            (lightning.callbacks.ModelCheckpoint(train_time_interval=datetime.timedelta(minutes=5)),
             r"^GrowthCallback: ModelCheckpoint\(train_time_interval=0:05:00\) saves at any step"),
            (lightning.callbacks.ModelCheckpoint(every_n_train_steps=8, save_on_exception=True),
             r"^GrowthCallback: ModelCheckpoint\(save_on_exception=True\) saves wherever an error stops training, "
             r"where a grower cannot be saved \(its state is whole only between periods of every_n_steps=4\)")):
        grower, _, _ = build()
        trainer = lightning.Trainer(max_steps=8, callbacks=[GrowthCallback(grower, every_n_steps=4), checkpoint],
                                    accelerator="cpu", logger=False, enable_progress_bar=False,
                                    enable_model_summary=False, default_root_dir=str(tmp_path))
        with pytest.raises(ValueError, match=refused):
            trainer.fit(GrowingModule(grower), loader)
        assert grower.episode.trainer.batches == 0  # refused before any batch
    for wrong in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match=r"every_n_steps must be a whole number >= 1"):
            GrowthCallback(grower, every_n_steps=wrong)  # type: ignore[arg-type]


def test_a_monitored_checkpoint_that_lightning_would_put_off_to_a_validation_inside_a_period_is_refused(
        tmp_path: Path) -> None:
    """Before the first validation logs the monitored metric, Lightning puts a step's save off to the end of the next
    validation (step 6 here, inside the period of steps 5-8): refused up front, and the setting it names instead
    saves only where periods end."""
    from morphogen.lightning import GrowthCallback

    loader, validation = DataLoader(TensorDataset(*TRAIN), batch_size=32), DataLoader(TensorDataset(*VALIDATION))
    for save_on_train_epoch_end in (False, True):
        grower, _, _ = build()
        checkpoint = lightning.callbacks.ModelCheckpoint(dirpath=tmp_path / str(save_on_train_epoch_end),
                                                         monitor="accuracy", every_n_train_steps=4, save_top_k=-1,
                                                         save_on_train_epoch_end=save_on_train_epoch_end)
        callback = GrowthCallback(grower, every_n_steps=4)
        trainer = lightning.Trainer(max_steps=12, callbacks=[callback, checkpoint], accelerator="cpu", logger=False,
                                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                                    default_root_dir=str(tmp_path))
        if not save_on_train_epoch_end:
            with pytest.raises(ValueError, match=(
                    r"^GrowthCallback: ModelCheckpoint\(monitor='accuracy'\) puts off a step's save to the end of the "
                    r"next validation .*; use ModelCheckpoint\(every_n_train_steps=k\*4, "
                    r"save_on_train_epoch_end=True\)$")):
                trainer.fit(ValidatedModule(grower), loader, validation)
            assert not callback.reports
            continue
        trainer.fit(ValidatedModule(grower), loader, validation)
        assert len(callback.reports) == 3
        saved = {path.name for path in (tmp_path / "True").glob("*.ckpt")}
        assert saved == {"epoch=1-step=8.ckpt", "epoch=1-step=12.ckpt"}  # step 4's save, put off, is not taken
