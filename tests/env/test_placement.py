"""Envs spread over devices (env/placement.py): who lands where, and one batch copy per device, not per env.

There is one CPU here; the `meta` device stands in for "another device". Tensors on it have shapes
and a device but no data, so these tests check placement (models, buffers, optimizers, monitors,
validation splits, batches) and the stream rules, never the maths (which `--devices cpu,cpu`
checks end to end in tests/control/test_devices.py).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from test_vector_streams import StandInStream
from torch import Tensor

from morphogen.control.trainer import PPOTrainer, TrainConfig
from morphogen.core.isolation import IsolationMonitor
from morphogen.data import Task, load_task
from morphogen.env.episode import EpisodeConfig
from morphogen.env.placement import DevicePlacement
from morphogen.env.training import HostAndSeedTrainer
from morphogen.env.vector import VectorEpisodes

CPU, META = torch.device("cpu"), torch.device("meta")


@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task("digits", max_train_samples=64)


def build_without_validating(vector: VectorEpisodes) -> None:
    """What `reset` builds for every env (model, monitor, trainer, its epoch), without its validation pass (maths)."""
    for episode in vector.episodes:
        episode.model = episode.build_model()
        episode.monitor = IsolationMonitor(device=episode.device)
        episode.trainer = HostAndSeedTrainer(episode.model, episode.optimizer_config, episode.monitor)
        episode.epoch = 0


def test_envs_go_round_robin_and_build_everything_on_their_device(digits: Task) -> None:
    vector = VectorEpisodes(digits, EpisodeConfig(max_epochs=2), 5, devices=["cpu", "meta"])
    build_without_validating(vector)
    assert vector.placement.env_devices == [CPU, META, CPU, META, CPU]
    for episode, device in zip(vector.episodes, vector.placement.env_devices, strict=True):
        assert episode.model is not None
        assert episode.device == device
        assert {p.device for p in episode.model.parameters()} == {device}
        assert {b.device for b in episode.model.buffers()} == {device}  # batch-norm statistics too
        assert {p.device for group in episode.trainer.host_optimizer.param_groups for p in group["params"]} == {device}
        assert episode.task.validation.device == device
        assert episode.task.train is digits.train  # the training split is never copied
    # One copy of the validation split per device, shared by that device's envs; the original on the first.
    assert vector.episodes[0].task is digits
    assert vector.episodes[1].task.validation is vector.episodes[3].task.validation
    assert vector.streams is None  # no env on a CUDA device


def test_the_trainer_keeps_policy_and_rollouts_on_the_first_device(digits: Task) -> None:
    config = TrainConfig(n_envs=2, hidden_size=16, episode=EpisodeConfig(max_epochs=2), devices=("cpu", "meta"))
    trainer = PPOTrainer(config, digits)
    assert {p.device for p in trainer.state.agent.policy.parameters()} == {CPU}
    assert trainer.groups[0].buffer.rewards.device == CPU
    assert trainer.groups[0].vector.placement.env_devices == [CPU, META]


def test_a_batch_is_copied_once_per_device_and_every_env_trains_on_its_device_copy(
        digits: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    vector = VectorEpisodes(digits, EpisodeConfig(max_epochs=2), 4, devices=["cpu", "meta"])
    build_without_validating(vector)
    copies: list[torch.device] = []
    original_to = Tensor.to

    def counting_to(self: Tensor, *args: object, **kwargs: object) -> Tensor:
        copies.append(torch.device(args[0]))  # type: ignore[arg-type]
        return original_to(self, *args, **kwargs)  # type: ignore[no-any-return]

    trained: list[tuple[int, Tensor, Tensor]] = []
    for index, episode in enumerate(vector.episodes):
        monkeypatch.setattr(episode.trainer, "train_batch",
                            lambda x, y, index=index: trained.append((index, x, y)))
    inputs, targets = next(digits.train.iterate_batches(16))
    monkeypatch.setattr(Tensor, "to", counting_to)
    vector._train_all(inputs, targets)
    monkeypatch.undo()

    assert copies == [META, META]  # inputs and targets, once for the two envs on meta
    assert [index for index, _, _ in trained] == [0, 1, 2, 3]
    assert trained[0][1] is inputs and trained[2][1] is inputs  # the first device trains on the batch itself
    assert trained[1][1].device == META and trained[1][1] is trained[3][1]  # one meta copy, shared
    assert trained[1][2].device == META and trained[1][2] is trained[3][2]
    assert trained[1][1].shape == inputs.shape


def test_each_env_stream_waits_for_its_own_device_and_records_its_device_copy(
        digits: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stream rules (docs/architecture.md#devices-and-cuda-streams) on several devices: the copy an env
    stream reads is recorded on that stream, after the stream waited for the current stream of the env's
    device (where the copy was made)."""
    vector = VectorEpisodes(digits, EpisodeConfig(max_epochs=2), 4, devices=["cpu", "meta"])
    build_without_validating(vector)
    producers = {CPU: StandInStream("cpu producer"), META: StandInStream("meta producer")}
    vector.streams = [StandInStream(f"env{i}") for i in range(4)]
    active: list[StandInStream] = [producers[CPU]]
    recorded: list[tuple[int, str, str]] = []  # (tensor id, stream recorded on, stream active then)
    trained: list[tuple[str, int, int]] = []  # (active stream, id of inputs, id of targets)

    @contextlib.contextmanager
    def use_stream(stream: StandInStream):  # type: ignore[no-untyped-def]
        active.append(stream)
        yield
        active.pop()

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: producers[torch.device(device)])
    monkeypatch.setattr(torch.cuda, "stream", use_stream)
    monkeypatch.setattr(Tensor, "record_stream",
                        lambda self, stream: recorded.append((id(self), stream.name, active[-1].name)))
    for episode in vector.episodes:
        monkeypatch.setattr(episode.trainer, "train_batch",
                            lambda x, y: trained.append((active[-1].name, id(x), id(y))))
    inputs, targets = next(digits.train.iterate_batches(16))
    vector._train_all(inputs, targets)

    assert [name for name, _, _ in trained] == ["env0", "env1", "env2", "env3"]
    for index, stream in enumerate(vector.streams):
        device = vector.placement.env_devices[index]
        assert stream.waited_for == [producers[device].name]
        _, inputs_id, targets_id = trained[index]
        assert (inputs_id, stream.name, stream.name) in recorded
        assert (targets_id, stream.name, stream.name) in recorded
    assert trained[0][1] == id(inputs) and trained[1][1] != id(inputs)


def test_data_on_another_device_than_the_first_is_refused(digits: Task) -> None:
    with pytest.raises(ValueError, match="the task's data is on cpu but the first of devices is meta"):
        DevicePlacement(digits, 2, ["meta", "cpu"])


def test_identical_devices_share_one_task_and_copy_nothing(digits: Task) -> None:
    placement = DevicePlacement(digits, 3, ["cpu", "cpu"])
    assert placement.env_devices == [CPU, CPU, CPU]
    assert placement.tasks == {CPU: digits}
    inputs, targets = next(digits.train.iterate_batches(8))
    assert placement.copy_batch(inputs, targets) == {CPU: (inputs, targets)}
