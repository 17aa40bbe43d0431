"""Training host and seeds (env/training.py) with SGD or AdamW: isolation of the shadow, governor hooks."""

from __future__ import annotations

import math

import pytest
import torch

from morphogen.core.hosts import CNNHost
from morphogen.core.isolation import IsolationMonitor
from morphogen.core.lifecycle import GateConfig, GateMode, Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SlotConfig
from morphogen.data import DEFAULT_OPTIMIZERS, load_task
from morphogen.env.actions import Action
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.optimizer import OptimizerConfig
from morphogen.env.training import HostAndSeedTrainer

ADAMW = OptimizerConfig(name="adamw", host_lr=1e-2, seed_lr=1e-2, host_weight_decay=0.1)


def small_model() -> MorphogeneticModel:
    torch.manual_seed(0)
    host = CNNHost(num_classes=3, in_channels=1, n_blocks=2, base_channels=4)
    return MorphogeneticModel(host, ("r0c0",), SlotConfig(gates=GateConfig(mode=GateMode.PERMISSIVE)))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 1, 8, 8, generator=generator), torch.randint(0, 3, (8,), generator=generator)


def training_seed(model: MorphogeneticModel) -> None:
    slot = model.germinate("r0c0", "conv_light", epoch=0)
    assert slot.advance(0).passed and slot.stage is Stage.TRAINING


def test_adamw_host_steps_exactly_as_without_the_training_seed() -> None:
    """Host and seed each get their own AdamW over their own parameters; a TRAINING seed changes nothing the
    host does (its parameters after a step are bit-identical to a seedless model's), and it learns itself."""
    inputs, targets = batch()
    plain, grown = small_model(), small_model()
    training_seed(grown)
    plain_trainer = HostAndSeedTrainer(plain, ADAMW, IsolationMonitor())
    trainer = HostAndSeedTrainer(grown, ADAMW, IsolationMonitor())
    seed = grown.slot("r0c0").seed
    assert seed is not None
    seed_before = [p.detach().clone() for p in seed.parameters()]
    for _ in range(2):
        plain_trainer.train_batch(inputs, targets)
        trainer.train_batch(inputs, targets)
    host_ids = {id(p) for p in grown.host_parameters()}
    seed_ids = {id(p) for p in seed.parameters()}
    assert isinstance(trainer.host_optimizer, torch.optim.AdamW)
    assert {id(p) for group in trainer.host_optimizer.param_groups for p in group["params"]} == host_ids
    seed_optimizer = trainer.seed_optimizers["r0c0"][1]
    assert isinstance(seed_optimizer, torch.optim.AdamW)
    assert {id(p) for group in seed_optimizer.param_groups for p in group["params"]} == seed_ids
    assert seed_optimizer.param_groups[0]["weight_decay"] == ADAMW.seed_weight_decay
    for expected, actual in zip(plain.host_parameters(), grown.host_parameters(), strict=True):
        assert torch.equal(expected, actual)
    assert any(not torch.equal(before, after) for before, after in zip(seed_before, seed.parameters(), strict=True))


def test_back_off_and_momentum_reset_work_on_adamw() -> None:
    model = small_model()
    trainer = HostAndSeedTrainer(model, ADAMW, IsolationMonitor())
    training_seed(model)
    trainer.train_batch(*batch())
    seed_optimizer = trainer.seed_optimizers["r0c0"][1]
    assert trainer.host_optimizer.state and seed_optimizer.state
    trainer.back_off("host", 0.5)
    trainer.back_off("seeds", 0.25)
    assert trainer.host_optimizer.param_groups[0]["lr"] == pytest.approx(5e-3)
    assert seed_optimizer.param_groups[0]["lr"] == pytest.approx(2.5e-3)
    trainer.reset_host_momentum()
    assert not trainer.host_optimizer.state and not seed_optimizer.state
    trainer.train_batch(*batch())  # AdamW starts its running averages and bias correction again
    state = trainer.host_optimizer.state[model.host_parameters()[0]]
    assert float(state["step"]) == 1.0


def test_text_episode_trains_with_adamw_unless_the_config_says_otherwise() -> None:
    task = load_task("text", max_train_samples=64, host={"d_model": 16, "n_layers": 2, "block_size": 16})
    episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=1))
    episode.reset()
    assert isinstance(episode.trainer.host_optimizer, torch.optim.AdamW)
    assert episode.trainer.host_optimizer.param_groups[0]["lr"] == DEFAULT_OPTIMIZERS["text"]["host_lr"]
    chosen = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=1, optimizer=OptimizerConfig()))
    chosen.reset()
    assert isinstance(chosen.trainer.host_optimizer, torch.optim.SGD)


def test_a_new_seed_starts_with_fresh_optimizer_state_and_a_rewarmed_learning_rate() -> None:
    """The host has trained (its AdamW holds moments and a step count); a seed germinated now gets an optimizer
    of its own with empty state, and its rate climbs seed_lr/4, /2, 3/4, then seed_lr over its first 4 steps."""
    model = small_model()
    config = OptimizerConfig(name="adamw", host_lr=1e-2, seed_lr=2e-2, seed_warmup_steps=4)
    trainer = HostAndSeedTrainer(model, config, IsolationMonitor())
    for _ in range(3):
        trainer.train_batch(*batch())
    training_seed(model)
    trainer.sync_seed_optimizers()
    seed_optimizer = trainer.seed_optimizers["r0c0"][1]
    assert not seed_optimizer.state and trainer.warming_up()
    rates = []
    for _ in range(6):
        trainer.train_batch(*batch())
        rates.append(seed_optimizer.param_groups[0]["lr"])
    assert rates == pytest.approx([5e-3, 1e-2, 1.5e-2, 2e-2, 2e-2, 2e-2])
    assert not trainer.warming_up()
    seed_step = seed_optimizer.state[model.seed_parameters("r0c0")[0]]["step"]
    host_step = trainer.host_optimizer.state[model.host_parameters()[0]]["step"]
    assert (float(seed_step), float(host_step)) == (6.0, 9.0)  # the seed's moments began with the seed
    assert trainer.host_optimizer.param_groups[0]["lr"] == 1e-2  # the host's rate is not re-warmed


def test_a_backed_off_seed_warms_up_to_its_backed_off_rate() -> None:
    model = small_model()
    trainer = HostAndSeedTrainer(model, OptimizerConfig(seed_lr=0.1, seed_warmup_steps=2), IsolationMonitor())
    trainer.back_off("seeds", 0.5)
    training_seed(model)
    rates = []
    for _ in range(3):
        trainer.train_batch(*batch())
        rates.append(trainer.seed_optimizers["r0c0"][1].param_groups[0]["lr"])
    assert rates == pytest.approx([0.025, 0.05, 0.05])


def test_the_cosine_schedule_decays_the_host_over_the_episode_and_each_seed_from_its_birth() -> None:
    """Host rates follow the cosine over the episode; a seed's over the epochs left when it was germinated, so a
    late seed starts at the full rate. Both compose with the governor's back-off and the seed's warm-up."""
    model = small_model()
    config = OptimizerConfig(host_lr=0.1, seed_lr=0.2, seed_warmup_steps=2, schedule="cosine")
    trainer = HostAndSeedTrainer(model, config, IsolationMonitor())
    host_rate = lambda: trainer.host_optimizer.param_groups[0]["lr"]  # noqa: E731
    trainer.start_epoch(0, 4)
    assert host_rate() == pytest.approx(0.1)
    trainer.start_epoch(2, 4)
    assert host_rate() == pytest.approx(0.05)  # (1 + cos(pi / 2)) / 2
    trainer.back_off("host", 0.5)
    trainer.back_off("seeds", 0.5)
    training_seed(model)  # germinated in epoch 2: the first of its 2 epochs, at its full (backed-off) rate
    trainer.train_batch(*batch())
    seed_rate = lambda: trainer.seed_optimizers["r0c0"][1].param_groups[0]["lr"]  # noqa: E731
    assert seed_rate() == pytest.approx(0.2 * 0.5 * 0.5)  # back-off, first of 2 warm-up steps
    trainer.train_batch(*batch())
    assert seed_rate() == pytest.approx(0.2 * 0.5)
    trainer.start_epoch(3, 4)
    host_factor = (1 + math.cos(math.pi * 3 / 4)) / 2
    assert host_rate() == pytest.approx(0.1 * 0.5 * host_factor)
    assert seed_rate() == pytest.approx(0.2 * 0.5 * 0.5)  # epoch 1 of its 2: (1 + cos(pi / 2)) / 2


def test_an_episode_decays_its_rates_along_the_cosine_and_a_constant_one_leaves_them() -> None:
    task = load_task("digits", max_train_samples=64)
    rates = {}
    for schedule in ("cosine", "constant"):
        episode = MorphogenesisEpisode(task, EpisodeConfig(max_epochs=4, optimizer=OptimizerConfig(schedule=schedule)))
        episode.reset()
        seen = []
        while not episode.done:
            episode.step(Action())
            seen.append(episode.trainer.host_optimizer.param_groups[0]["lr"])
        rates[schedule] = seen
    assert rates["cosine"] == pytest.approx([0.01 * (1 + math.cos(math.pi * epoch / 4)) / 2 for epoch in range(4)])
    assert rates["constant"] == [0.01] * 4


def test_a_training_step_computes_each_groups_gradient_norm_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clip of the host and of a TRAINING seed reuses the norm the isolation monitor just took of the same
    gradients: one per-tensor norm pass per group, where clipping on its own took a second one (4 passes)."""
    inputs, targets = batch()
    model = small_model()
    training_seed(model)
    trainer = HostAndSeedTrainer(model, OptimizerConfig(), IsolationMonitor())
    trainer.train_batch(inputs, targets)
    passes: list[int] = []
    foreach_norm = torch._foreach_norm

    def counted(tensors: list[torch.Tensor], *args: object, **kwargs: object) -> object:
        passes.append(len(tensors))
        return foreach_norm(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    trainer.train_batch(inputs, targets)
    seed_tensors = len(model.slot("r0c0").seed_parameters())
    assert passes == [len(model.host_parameters()), seed_tensors]


def test_the_model_is_set_to_training_mode_once_an_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each epoch's first batch sets every module to training mode, whatever the epoch before left (a model
    evaluated in eval mode); the later batches of the epoch do not walk the modules again."""
    inputs, targets = batch()
    model = small_model()
    training_seed(model)
    trainer = HostAndSeedTrainer(model, OptimizerConfig(), IsolationMonitor())
    calls: list[bool] = []
    train = MorphogeneticModel.train

    def counted(self: MorphogeneticModel, mode: bool = True) -> MorphogeneticModel:
        calls.append(mode)
        return train(self, mode)

    monkeypatch.setattr(MorphogeneticModel, "train", counted)
    for _ in range(2):
        model.eval()
        for _ in range(3):
            trainer.train_batch(inputs, targets)
            assert all(module.training for module in model.modules())
        trainer.take_epoch_loss()
    assert calls == [False, True, False, True]  # eval() goes through train(False)
