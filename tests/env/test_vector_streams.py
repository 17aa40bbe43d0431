"""docs/architecture.md#devices-and-cuda-streams: a batch read on an env's side stream is
`record_stream`-ed on that stream.

There is no GPU here, so CUDA's stream API is replaced by stand-ins that record what the vector
asks of it; the rule checked is the one a real device needs: every tensor a side stream reads
(the batch inputs and targets themselves, not only something derived from them) is recorded on that
stream, after the stream was told to wait for the producing stream.
"""

from __future__ import annotations

import contextlib

import torch

from morphogen.data import load_task
from morphogen.env.episode import EpisodeConfig
from morphogen.env.vector import VectorEpisodes


class StandInStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.waited_for: list[str] = []

    def wait_stream(self, other: StandInStream) -> None:
        self.waited_for.append(other.name)


def test_shared_batch_is_recorded_on_every_env_stream(monkeypatch):
    task = load_task("digits", max_train_samples=64)
    vector = VectorEpisodes(task, EpisodeConfig(max_epochs=2), 3)
    vector.reset(0)
    producer = StandInStream("producer")
    vector.streams = [StandInStream(f"env{i}") for i in range(3)]
    active: list[StandInStream] = [producer]
    recorded: list[tuple[int, str, str]] = []  # (tensor id, stream it was recorded on, stream active then)
    trained_on: list[str] = []

    @contextlib.contextmanager
    def use_stream(stream):
        active.append(stream)
        yield
        active.pop()

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: producer)
    monkeypatch.setattr(torch.cuda, "stream", use_stream)
    monkeypatch.setattr(torch.Tensor, "record_stream",
                        lambda self, stream: recorded.append((id(self), stream.name, active[-1].name)))
    for episode in vector.episodes:
        monkeypatch.setattr(episode.trainer, "train_batch", lambda x, y: trained_on.append(active[-1].name))

    inputs, targets = next(task.train.iterate_batches(16))
    vector._train_all(inputs, targets)

    assert trained_on == ["env0", "env1", "env2"]
    for stream in vector.streams:
        assert stream.waited_for == ["producer"]
        assert (id(inputs), stream.name, stream.name) in recorded
        assert (id(targets), stream.name, stream.name) in recorded
