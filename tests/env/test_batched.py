"""Batched envs (env/batched.py): the vmapped path trains every env as its own `HostAndSeedTrainer` would.

Tolerance: the batched path computes the same formulas in another float summation order (a grouped
convolution reduces over its inputs in another order than N separate convolutions; per-tensor norms
are square roots of sums of squares instead of `_foreach_norm`). Each batch then differs by float32
rounding (~1e-7 relative), and a few epochs of SGD compound that to ~1e-6. Parameters, momentum
buffers, running statistics, losses and gradient norms are compared with `rtol=1e-4, atol=1e-5`,
orders of magnitude above that rounding and far below any real difference (a wrong clip, a missed
weight decay, one batch too many, another env's state: all 1e-3 or more). Validation accuracies may
differ by one image, when a sample sits on a float32 tie between two classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest
import torch
from torch import Tensor, nn

from morphogen import host_from_module
from morphogen.control.heuristic import HeuristicConfig, HeuristicController
from morphogen.core.lifecycle import GateConfig, GateMode, Stage
from morphogen.core.slot import SlotConfig
from morphogen.data import Task, load_task
from morphogen.data.user import task_from_data
from morphogen.env.actions import Action, Op
from morphogen.env.batched import StackedEnvs, architecture_signature, training_groups
from morphogen.env.episode import SYNCS_PER_STEP, EpisodeConfig, StepResult, task_with_host
from morphogen.env.optimizer import OptimizerConfig
from morphogen.env.training import HostAndSeedTrainer
from morphogen.env.vector import VectorEpisodes

SEED, ROUND = 3, 5
RTOL, ATOL = 1e-4, 1e-5
WAIT = Action()
GERMINATE_CONV = Action(op=Op.GERMINATE, slot="r0c0", blueprint="conv_light")
GERMINATE_NORM = Action(op=Op.GERMINATE, slot="r0c1", blueprint="norm")
ADVANCE = Action(op=Op.ADVANCE, slot="r0c0")


@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task("digits", max_train_samples=200)


def episode_config(**optimizer: float) -> EpisodeConfig:
    gates = GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=1)
    return EpisodeConfig(max_epochs=8, slots=SlotConfig(gates=gates, blend_epochs=2),
                         optimizer=OptimizerConfig(**optimizer))


def make_vectors(task: Task, config: EpisodeConfig, n_envs: int) -> tuple[VectorEpisodes, VectorEpisodes]:
    """The per-env vector and the batched one, same seeds, reset for the same round."""
    vectors = (VectorEpisodes(task, config, n_envs, seed=SEED),
               VectorEpisodes(task, dataclasses.replace(config, batch_identical=True), n_envs, seed=SEED))
    for vector in vectors:
        vector.reset(ROUND)
    return vectors


def close(expected: Tensor, actual: Tensor, what: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda message: f"{what}: {message}")


def momentum_buffers(trainer: HostAndSeedTrainer) -> dict[str, Tensor]:
    """Every momentum buffer of an env's optimizers, by parameter name."""
    assert trainer.model is not None
    names = {id(p): name for name, p in trainer.model.named_parameters()}
    optimizers = [trainer.host_optimizer, *(optimizer for _, optimizer in trainer.seed_optimizers.values())]
    return {names[id(p)]: state["momentum_buffer"] for optimizer in optimizers for p, state in optimizer.state.items()
            if state.get("momentum_buffer") is not None}


def assert_same_envs(reference: VectorEpisodes, batched: VectorEpisodes, expected: Sequence[StepResult],
                     actual: Sequence[StepResult], step: int) -> None:
    one_image = 100.0 / len(reference.task.validation)
    for env, (lone, grouped) in enumerate(zip(reference.episodes, batched.episodes, strict=True)):
        where = f"step {step} env {env}"
        before, after = expected[env].snapshot, actual[env].snapshot
        assert [s.stage for s in before.slots] == [s.stage for s in after.slots], where
        assert before.train_loss is not None and after.train_loss is not None
        assert after.train_loss == pytest.approx(before.train_loss, rel=RTOL, abs=ATOL), where
        assert after.val_loss == pytest.approx(before.val_loss, rel=RTOL, abs=ATOL), where
        assert abs(after.val_accuracy - before.val_accuracy) <= one_image + 1e-9, where
        assert lone.model is not None and grouped.model is not None
        state, grouped_state = lone.model.state_dict(), grouped.model.state_dict()
        assert state.keys() == grouped_state.keys(), where
        for key, value in state.items():  # parameters, running statistics, batch counts, alphas
            if isinstance(value, Tensor):
                close(value, grouped_state[key], f"{where} {key}")
        buffers, grouped_buffers = momentum_buffers(lone.trainer), momentum_buffers(grouped.trainer)
        assert buffers.keys() == grouped_buffers.keys(), where
        for name, buffer in buffers.items():
            close(buffer, grouped_buffers[name], f"{where} momentum {name}")
        for name, parameter in lone.model.named_parameters():  # the last batch's clipped gradients
            gradient = dict(grouped.model.named_parameters())[name].grad
            assert (parameter.grad is None) == (gradient is None), f"{where} gradient {name}"
            if parameter.grad is not None and gradient is not None:
                close(parameter.grad, gradient, f"{where} gradient {name}")
        report, grouped_report = lone.gradients, grouped.gradients
        assert grouped_report.batches == report.batches, where
        assert grouped_report.host_gradient_norm == pytest.approx(report.host_gradient_norm, rel=RTOL), where
        assert list(grouped_report.seeds) == list(report.seeds), where
        for slot_id, health in report.seeds.items():
            other = grouped_report.seeds[slot_id]
            assert other.gradient_norm == pytest.approx(health.gradient_norm, rel=RTOL), where
            assert other.vanishing_fraction == health.vanishing_fraction, where
            assert other.exploding_fraction == health.exploding_fraction, where


def count_syncs(monkeypatch: pytest.MonkeyPatch, work: Callable[[], object]) -> int:
    """Host syncs (`.item()`, `.tolist()`, `.cpu()`) made by `work()`."""
    calls: list[str] = []
    for name in ("item", "tolist", "cpu"):
        original = getattr(Tensor, name)

        def counted(self: Tensor, *args: object, _name: str = name, _original: Callable[..., object] = original,
                    **kwargs: object) -> object:
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Tensor, name, counted)
    work()
    monkeypatch.undo()
    return len(calls)


def count_alone_batches(monkeypatch: pytest.MonkeyPatch) -> list[HostAndSeedTrainer]:
    """Record every `HostAndSeedTrainer.train_batch` call (the per-env path), then train as usual."""
    calls: list[HostAndSeedTrainer] = []
    original = HostAndSeedTrainer.train_batch

    def recording(trainer: HostAndSeedTrainer, inputs: Tensor, targets: Tensor) -> None:
        calls.append(trainer)
        original(trainer, inputs, targets)

    monkeypatch.setattr(HostAndSeedTrainer, "train_batch", recording)
    return calls


def run_both(reference: VectorEpisodes, batched: VectorEpisodes, steps: Sequence[Sequence[Action]],
             between: Callable[[int, VectorEpisodes], None] | None = None) -> None:
    for step, actions in enumerate(steps):
        expected, actual = reference.step(actions), batched.step(actions)
        assert_same_envs(reference, batched, expected, actual, step)
        if between is not None:
            between(step, reference)
            between(step, batched)


def test_no_seed_envs_train_in_one_group_like_alone(digits: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    # A small clip norm so that clipping engages, and seeds with weight decay (used once they exist).
    reference, batched = make_vectors(digits, episode_config(clip_norm=0.5), 3)
    calls = count_alone_batches(monkeypatch)
    run_both(reference, batched, [[WAIT] * 3] * 3)
    batched_trainers = {id(episode.trainer) for episode in batched.episodes}
    assert not [trainer for trainer in calls if id(trainer) in batched_trainers], \
        "three envs without a seed share one architecture: none may train alone"


def test_germination_splits_groups_and_identical_seeds_stay_batched(digits: Task,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Envs 0 and 1 grow the same seed (TRAINING: shadow pass; then BLENDING) and stay one group; env 2 grows
    another and trains alone; env 3 keeps no seed and trains alone once the others have left its group."""
    reference, batched = make_vectors(digits, episode_config(seed_weight_decay=1e-3, clip_norm=1.0), 4)
    calls = count_alone_batches(monkeypatch)
    actions = [[WAIT] * 4,
               [GERMINATE_CONV, GERMINATE_CONV, GERMINATE_NORM, WAIT],
               [WAIT] * 4,
               [ADVANCE, ADVANCE, WAIT, WAIT],
               [WAIT] * 4]
    run_both(reference, batched, actions)
    stages = [episode.model.slot("r0c0").stage for episode in batched.episodes if episode.model is not None]
    assert stages[:2] == [Stage.BLENDING] * 2, "the identical seeds must have been trained into BLENDING"
    alone = {id(trainer) for trainer in calls}
    assert alone == {id(batched.episodes[2].trainer), id(batched.episodes[3].trainer),
                     *(id(episode.trainer) for episode in reference.episodes)}, \
        "only the envs whose architecture is unique train alone"


def test_learning_rate_back_off_of_one_env_is_honoured(digits: Task) -> None:
    reference, batched = make_vectors(digits, episode_config(), 3)

    def back_off(step: int, vector: VectorEpisodes) -> None:
        if step == 0:
            vector.episodes[1].trainer.back_off("host", 0.5)
            vector.episodes[2].trainer.reset_host_momentum()
        if step == 1:
            vector.episodes[1].trainer.back_off("seeds", 0.25)

    run_both(reference, batched, [[WAIT] * 3, [GERMINATE_CONV, GERMINATE_CONV, WAIT], [WAIT] * 3, [WAIT] * 3],
             between=back_off)
    lrs = [episode.trainer.seed_optimizers["r0c0"][1].param_groups[0]["lr"] for episode in batched.episodes[:2]]
    assert lrs == [pytest.approx(0.01), pytest.approx(0.0025)], "env 1's seeds learn at a quarter of the rate"


def test_heuristic_episode_makes_the_same_decisions(digits: Task) -> None:
    config = dataclasses.replace(episode_config(), max_epochs=10)
    reference, batched = make_vectors(digits, config, 3)
    eager = HeuristicConfig(warmup_epochs=1, plateau_epochs=1, plateau_threshold=100.0, min_training_epochs=2)
    decisions: list[list[list[str]]] = []
    for vector in (reference, batched):
        controllers = [HeuristicController(episode.action_space, digits.topology, eager)
                       for episode in vector.episodes]
        snapshots = [episode.snapshot for episode in vector.episodes]
        taken: list[list[str]] = []
        for _ in range(config.max_epochs):
            actions = [controller.act(snapshot, masks)
                       for controller, snapshot, masks in zip(controllers, snapshots, vector.masks(), strict=True)]
            taken.append([action.describe() for action in actions])
            snapshots = [result.snapshot for result in vector.step(actions)]
        decisions.append(taken)
    assert decisions[1] == decisions[0]
    assert any("GERMINATE" in action for step in decisions[0] for action in step), "the episode must have grown"


def test_architecture_signature_groups_what_trains_alike(digits: Task) -> None:
    vector = VectorEpisodes(digits, episode_config(), 4, seed=SEED)
    vector.reset(ROUND)
    assert training_groups(vector.episodes).groups == ((0, 1, 2, 3),)
    vector.step([GERMINATE_CONV, GERMINATE_CONV, GERMINATE_NORM, WAIT])
    grouping = training_groups(vector.episodes)
    assert grouping.groups == ((0, 1),) and grouping.alone == (2, 3)
    models = [episode.model for episode in vector.episodes]
    assert models[0] is not None and models[3] is not None
    models[0].slot("r0c0").prune(1, "test")  # a pruned (embargoed) slot holds no seed: the env is empty again
    assert architecture_signature(models[0]) == architecture_signature(models[3])
    assert training_groups(vector.episodes, min_group_size=1).groups == ((0, 3), (1,), (2,))


def test_batched_step_never_syncs(digits: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    vector = VectorEpisodes(digits, dataclasses.replace(episode_config(), batch_identical=True), 3, seed=SEED)
    vector.reset(ROUND)
    vector.step([GERMINATE_CONV, GERMINATE_CONV, WAIT])  # envs 0 and 1: a TRAINING seed, the shadow path
    stacked = StackedEnvs(vector.episodes[:2])
    inputs, targets = next(iter(digits.train.iterate_batches(64, shuffle=False)))
    assert count_syncs(monkeypatch, lambda: [stacked.step(inputs, targets) for _ in range(3)]) == 0
    stacked.write_back()
    syncs = count_syncs(monkeypatch, lambda: vector.step([WAIT] * 3))
    assert syncs == 3 * SYNCS_PER_STEP, "batching adds no sync to the per-env budget"


def test_adamw_envs_train_alone_and_match_the_per_env_path(digits: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stacked step is SGD's: AdamW envs with batch_identical on must take the per-env path, not a
    silent SGD step. Same path, same arithmetic: the two vectors agree exactly."""
    adamw = dataclasses.replace(episode_config(), optimizer=OptimizerConfig(name="adamw", host_lr=3e-3))
    reference, batched = make_vectors(digits, adamw, 3)
    grouping = training_groups(batched.episodes)
    assert grouping.groups == () and grouping.alone == (0, 1, 2)
    calls = count_alone_batches(monkeypatch)
    expected, actual = reference.step([WAIT] * 3), batched.step([WAIT] * 3)
    batched_trainers = {id(episode.trainer) for episode in batched.episodes}
    assert {id(trainer) for trainer in calls if id(trainer) in batched_trainers} == batched_trainers
    for lone, grouped, before, after in zip(reference.episodes, batched.episodes, expected, actual, strict=True):
        assert isinstance(grouped.trainer.host_optimizer, torch.optim.AdamW)
        assert after.snapshot.train_loss == before.snapshot.train_loss
        assert lone.model is not None and grouped.model is not None
        for (name, value), other in zip(lone.model.named_parameters(), grouped.model.parameters(), strict=True):
            assert torch.equal(value, other), name


def test_a_group_with_one_adamw_env_is_not_stacked(digits: Task) -> None:
    """Envs of one architecture but different optimizers: the SGD ones still stack, the AdamW one is alone."""
    vector = VectorEpisodes(digits, episode_config(), 3, seed=SEED)
    vector.reset(ROUND)
    episode = vector.episodes[1]
    assert episode.model is not None
    episode.trainer = HostAndSeedTrainer(episode.model, OptimizerConfig(name="adamw"), episode.monitor)
    grouping = training_groups(vector.episodes)
    assert grouping.groups == ((0, 2),) and grouping.alone == (1,)
    with pytest.raises(AssertionError, match="plain SGD only"):
        StackedEnvs([episode])


class MaskedMLP(nn.Module):
    """A user's model of two inputs, called `model(x, mask)`: an MLP on the masked features."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        return self.layers(x * mask)


def masked_task() -> Task:
    """Three classes of 12 features; every batch's inputs are a tuple `(x, mask)`, as the model takes them."""
    generator = torch.Generator().manual_seed(0)
    x, labels = torch.randn(160, 12, generator=generator), torch.randint(0, 3, (160,), generator=generator)
    x[torch.arange(160), labels] += 2.0
    mask = (torch.rand(160, 12, generator=generator) > 0.2).float()
    example = (x[:2], mask[:2])
    return task_with_host(task_from_data("masked", ((x[:128], mask[:128]), labels[:128]),
                                         ((x[128:], mask[128:]), labels[128:]), batch_size=32,
                                         host=lambda: host_from_module(MaskedMLP(), ["layers.1", "layers.3"],
                                                                       example_input=example)))


def test_envs_of_a_model_of_two_inputs_train_stacked_as_they_would_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of `(x, mask)` go through the vmapped step (and a TRAINING seed's shadow pass) like through each
    env's own trainer, and every batch is charged to every env."""
    reference, batched = make_vectors(masked_task(), episode_config(), 2)
    calls = count_alone_batches(monkeypatch)
    germinate = Action(op=Op.GERMINATE, slot="layers_3", blueprint="mlp_small")
    run_both(reference, batched, [[WAIT] * 2, [germinate] * 2, [WAIT] * 2])
    batched_trainers = {id(episode.trainer) for episode in batched.episodes}
    assert not [trainer for trainer in calls if id(trainer) in batched_trainers], "both envs train stacked"
    for lone, grouped in zip(reference.episodes, batched.episodes, strict=True):
        assert grouped.model is not None and grouped.model.slot("layers_3").stage is Stage.TRAINING
        assert grouped.compute == lone.compute and grouped.compute.shadow > 0
