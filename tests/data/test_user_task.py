"""`task_from_data`: a task from a user's tensors, Dataset or DataLoader, with their loss and metric."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from morphogen import DataError, task_from_data
from morphogen.data import DeviceDataset, random_crop_flip
from morphogen.data.user import StreamedBatches, task_on_device


def pairs(count: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(count, dtype=torch.float32)[:, None].repeat(1, 3), torch.arange(count)


def test_tensors_are_held_as_a_device_dataset() -> None:
    task = task_from_data("mine", pairs(), pairs(4))
    assert isinstance(task.train, DeviceDataset) and len(task.train) == 10 and len(task.validation) == 4
    assert task.name == "mine" and task.source == "python" and task.metric_name == "accuracy"
    assert task.objective == "classification" and task.topology == ""  # no host yet


def test_a_dataset_is_batched_each_epoch_in_an_order_drawn_from_the_generator() -> None:
    task = task_from_data("mine", TensorDataset(*pairs()), TensorDataset(*pairs(4)))
    assert isinstance(task.train, StreamedBatches) and len(task.train) == 10

    def epoch(seed: int) -> list[int]:
        batches = task.train.iterate_batches(4, generator=torch.Generator().manual_seed(seed))
        return [int(t) for _, targets in batches for t in targets]

    assert sorted(epoch(0)) == list(range(10))
    assert epoch(0) == epoch(0) and epoch(0) != epoch(1)
    in_order = [int(t) for _, targets in task.validation.iterate_batches(3, shuffle=False) for t in targets]
    assert in_order == [0, 1, 2, 3]


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Yields samples one by one and counts how many were read: nothing may load it whole."""

    def __init__(self) -> None:
        self.read = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        for index in range(10):
            self.read += 1
            yield torch.full((3,), float(index)), torch.tensor(index)


def test_a_loader_is_streamed_batch_by_batch_with_its_own_batching() -> None:
    stream = Stream()
    task = task_from_data("stream", DataLoader(stream, batch_size=4), pairs(4))
    batches = task.train.iterate_batches(64)
    inputs, targets = next(batches)
    assert inputs.shape == (4, 3) and targets.tolist() == [0, 1, 2, 3]
    assert stream.read <= 8  # the loader's own batch size (64 is ignored), read as it goes
    assert sum(len(t) for _, t in batches) == 6
    assert len(task.train) == 0  # a stream of unknown length says so


def test_an_iterable_dataset_is_batched_here_in_its_own_order() -> None:
    """An `IterableDataset` is a Dataset of samples (it even has `__getitem__`, from `Dataset`): batched by the
    task's batch size, never shuffled, which a stream cannot be."""
    task = task_from_data("stream", Stream(), pairs(4))
    epoch = [targets.tolist() for _, targets in task.train.iterate_batches(4, generator=torch.Generator())]
    assert epoch == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_moving_a_task_to_a_device_moves_its_batches() -> None:
    task = task_on_device(task_from_data("mine", TensorDataset(*pairs()), pairs(4)), "meta")
    assert task.validation.device.type == "meta"
    inputs, targets = next(task.train.iterate_batches(4))
    assert inputs.device.type == "meta" and targets.device.type == "meta"


@pytest.mark.parametrize(("train", "message"), [
    ([(torch.zeros(2, 3),)], "train batch 0: expected a pair (inputs, targets) of tensors, got a 1-item tuple"),
    ([{"x": torch.zeros(2, 3)}], "train batch 0: a dict (keys 'x'); name its targets' entry with "
                                 "task_from_data(..., target_key=...)"),
    ([(torch.zeros(2, 3), torch.zeros(3))], "train batch 0: (2, 3) inputs but (3,) targets"),
    ([(torch.zeros(3), 1), (torch.zeros(3), 2)], "train batch 0: expected a pair (inputs, targets) of tensors, got a "
                                                 "2-item tuple; a list of samples is read as a list of batches"),
    (DataLoader(TensorDataset(torch.zeros(4, 3), torch.ones(4, 3), torch.zeros(4)), batch_size=2),
     "train batch 0: expected a pair (inputs, targets) of tensors, got a 3-item list; a model of several inputs takes "
     "them as one tuple, the targets last: ((tokens, mask), targets)"),
])
def test_a_loader_yielding_the_wrong_thing_is_a_data_error_naming_the_batch(train: object, message: str) -> None:
    task = task_from_data("bad", train, pairs(4))
    with pytest.raises(DataError) as caught:
        list(task.train.iterate_batches(4))
    assert str(caught.value).startswith(message)


class Samples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Each sample one dict, its label among the inputs, as a Hugging Face dataset in torch format gives them."""

    def __init__(self, count: int) -> None:
        self.inputs, self.labels = pairs(count)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.inputs[index], "label": self.labels[index], "mask": self.inputs[index] > 2}


@pytest.mark.parametrize("form", ["tensors", "dataset", "loader"])
def test_dicts_holding_their_targets_give_the_inputs_by_name_and_the_targets(form: str) -> None:
    inputs, labels = pairs()
    split = {"tensors": {"x": inputs, "label": labels, "mask": inputs > 2}, "dataset": Samples(10),
             "loader": DataLoader(Samples(10), batch_size=4)}[form]
    task = task_from_data("dicts", split, split, target_key="label")
    batches = list(task.validation.iterate_batches(4, shuffle=False))
    assert [targets.tolist() for _, targets in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    first = batches[0][0]
    assert isinstance(first, dict) and list(first) == ["x", "mask"]  # the model is called with x=..., mask=...
    assert torch.equal(first["x"], inputs[:4]) and torch.equal(first["mask"], inputs[:4] > 2)


@pytest.mark.parametrize(("split", "target_key", "message"), [
    ({"x": torch.zeros(3, 2), "y": torch.zeros(3)}, None, "train: a dict (keys 'x', 'y'); name its targets' entry "
                                                          "with task_from_data(..., target_key=...)"),
    ({"x": torch.zeros(3, 2), "y": torch.zeros(3)}, "label", "train: no 'label' entry for the targets (keys 'x', 'y')"),
    ({"x": torch.zeros(3, 2), "text": ["a", "b", "c"], "y": torch.zeros(3)}, "y",
     "train: its inputs are a dict of Tensor, list: every input must be a tensor"),
    ({"x": torch.zeros(3, 2), "y": [0, 1, 2]}, "y", "train: its 'y' entry is a list, not a tensor"),
    (pairs(), "", "target_key must be the name of the targets' entry in a dict batch, got ''"),
])
def test_a_dict_split_that_cannot_work_is_one_data_error(split: object, target_key: str | None, message: str) -> None:
    with pytest.raises(DataError) as caught:
        task_from_data("dicts", split, pairs(4), target_key=target_key)
    assert str(caught.value) == message


def test_a_loader_of_dicts_without_the_target_key_is_a_data_error_naming_the_batch() -> None:
    task = task_from_data("dicts", DataLoader(Samples(10), batch_size=4), pairs(4), target_key="labels")
    with pytest.raises(DataError, match=r"^train batch 0: no 'labels' entry for the targets \(keys 'x', 'label', "
                                        r"'mask'\)$"):
        next(iter(task.train.iterate_batches(4)))


_NUMPY = ("train: numpy arrays where torch tensors belong: convert them with torch.as_tensor (the inputs to the "
          "model's dtype, e.g. dtype=torch.float32; class indices to torch.int64)")


@pytest.mark.parametrize(("arguments", "message"), [
    ({"name": ""}, "task name must be a non-empty string"),
    ({"train": "data.csv"}, "train: expected (inputs, targets) tensors, a Dataset or a DataLoader, got str"),
    ({"train": (torch.zeros(3, 2), torch.zeros(4))}, "train: DeviceDataset needs as many targets as inputs"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"loss": 3}, "loss must be a function"),
    ({"loss": torch.nn.MSELoss(reduction="sum")}, "loss has reduction='sum'; give one that returns the batch's mean"),
    ({"loss": functools.partial(torch.nn.functional.l1_loss, reduction="none")}, "loss has reduction='none'"),
    ({"metric": torch.nn.L1Loss(reduction="sum")}, "metric has reduction='sum'"),
    ({"num_classes": -1}, "num_classes must be a positive integer"),
    ({"host": torch.nn.Linear(2, 2)}, "host must come from morphogen.host_from_module"),
    ({"device": "cuda:99"}, "task_from_data: device='cuda:99', but "),  # was torch's assertion
    ({"device": "gpu"}, "task_from_data: device='gpu' is not a torch device; use 'cpu', 'cuda', 'cuda:N' or 'mps'"),
    ({"device": "meta"}, "task_from_data: device='meta' holds shapes but no values"),  # was Tensor.item()'s error
    # Refused here, not as the first batch is drawn once training starts:
    ({"train": (torch.zeros(2, 3).numpy(), torch.zeros(2).numpy())}, _NUMPY),
    ({"train": (torch.zeros(2, 3), torch.zeros(2).numpy())}, _NUMPY),
    ({"validation": torch.zeros(2, 3).numpy()}, "validation: " + _NUMPY.removeprefix("train: ")),
    ({"train": ((torch.zeros(2, 3).numpy(), torch.zeros(2, 3)), torch.zeros(2))}, _NUMPY),
    ({"train": {"x": torch.zeros(2, 3).numpy(), "y": torch.zeros(2).numpy()}, "target_key": "y"}, _NUMPY),
    ({"train": (*pairs(), torch.zeros(10))}, "train: a split is (inputs, targets), got a tuple of 3; a model of "
                                             "several inputs takes them as one tuple, the targets last"),
    ({"train": [torch.zeros(10, 3)]}, "train: a split is (inputs, targets), got a list of 1"),
])
def test_bad_arguments_are_one_clear_data_error(arguments: dict[str, object], message: str) -> None:
    values: dict[str, object] = {"name": "mine", "train": pairs(), "validation": pairs(4), **arguments}
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        task_from_data(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("loss", [torch.nn.MSELoss(), torch.nn.KLDivLoss(reduction="batchmean"),
                                  functools.partial(torch.nn.functional.mse_loss, reduction="mean"),
                                  torch.nn.functional.mse_loss])
def test_a_loss_that_returns_the_batch_mean_is_taken(loss: object) -> None:
    task = task_from_data("mine", pairs(), pairs(4), loss=loss)  # type: ignore[arg-type]
    assert task.loss is loss and task.objective == "custom"


class Columns:
    """Samples by index with a length but no torch `Dataset`, as a Hugging Face `datasets.Dataset` is: iterated as
    it is, it yields single samples, which a DataLoader must batch."""

    def __init__(self) -> None:
        self.samples = Samples(10)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.samples[index]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (self.samples[index] for index in range(len(self)))


def test_samples_given_where_batches_belong_say_to_use_a_dataloader() -> None:
    task = task_from_data("columns", Columns(), pairs(4), target_key="label")
    with pytest.raises(DataError, match=r"\(\) targets; both need the same leading sample dimension \(one sample, not "
                                        r"a batch\? pass your samples in a DataLoader\)$"):
        next(iter(task.train.iterate_batches(4)))
    batched = task_from_data("columns", DataLoader(Columns(), batch_size=4), pairs(4), target_key="label")
    assert next(targets.tolist() for _, targets in batched.train.iterate_batches(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize(("split", "targets", "message"), [
    ("train", torch.tensor([0, 1, 2, 3]), r"^train: targets hold class 3, outside 0\.\.2 of num_classes=3"),
    ("validation", torch.tensor([0, -1, 2, 1]), r"^validation: targets hold class -1, outside 0\.\.2 of num_classes=3"),
    ("train", torch.tensor([[0, 5], [1, 2], [2, 0], [1, 1]]), r"^train: targets hold class 5"),
])
def test_class_targets_outside_num_classes_are_refused_before_anything_trains(split: str, targets: torch.Tensor,
                                                                              message: str) -> None:
    """With the default cross-entropy and num_classes given, a class index outside 0..num_classes-1 is one line
    naming the split and the class (on a GPU, cross-entropy meets it as a device-side assert that ends the
    process's CUDA context)."""
    inputs = torch.zeros(4, 3)
    good = (inputs, torch.tensor([0, 1, 2, 1]))
    splits = {"train": good, "validation": good, split: (inputs, targets)}
    with pytest.raises(DataError, match=message):
        task_from_data("mine", splits["train"], splits["validation"], num_classes=3)


def test_ignored_soft_and_own_loss_targets_are_not_class_indices_to_check() -> None:
    """-100 (cross-entropy's ignore_index), float targets (class probabilities) and a loss of one's own are taken
    as they are; so are targets when num_classes is not given."""
    inputs = torch.zeros(4, 3)
    task_from_data("mine", (inputs, torch.tensor([0, -100, 2, 1])), (inputs, torch.tensor([0, 1, 2, 1])),
                   num_classes=3)
    task_from_data("mine", (inputs, torch.full((4, 3), 1 / 3)), (inputs, torch.full((4, 3), 1 / 3)), num_classes=3)
    task_from_data("mine", (inputs, torch.tensor([0, 7, 2, 1])), (inputs, torch.tensor([0, 1, 2, 1])),
                   num_classes=3, loss=lambda outputs, targets: outputs.sum())
    task_from_data("mine", (inputs, torch.tensor([0, 7, 2, 1])), (inputs, torch.tensor([0, 1, 2, 1])))


def test_class_targets_are_checked_in_every_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check reads the targets in chunks: a class outside the range in the last chunk is found too."""
    monkeypatch.setattr("morphogen.data.user._CHECKED_VALUES_PER_CHUNK", 3)
    inputs, good = torch.zeros(7, 3), torch.tensor([0, 1, 2, 1, 0, 2, 1])
    with pytest.raises(DataError, match=r"^train: targets hold class 9"):
        task_from_data("mine", (inputs, torch.tensor([0, 1, 2, 1, 0, 2, 9])), (inputs, good), num_classes=3)


def test_data_computed_with_autograd_on_is_held_and_streamed_detached() -> None:
    """Features an encoder computed outside torch.no_grad are data: neither held tensors nor streamed batches carry
    the encoder's graph (training on them would backward through it once, then fail, and send it gradients)."""
    weight = torch.randn(3, 3, requires_grad=True)
    features, labels = pairs(8)[0] @ weight, torch.arange(8) % 3
    held = task_from_data("mine", (features, labels), ((features, features), labels))
    streamed = task_from_data("mine", DataLoader(TensorDataset(features, labels), batch_size=4),
                              {"x": features, "y": labels}, target_key="y")
    for task in (held, streamed):
        for split in (task.train, task.validation):
            for inputs, _ in split.iterate_batches(4):
                values = list(inputs.values()) if isinstance(inputs, dict) else (
                    list(inputs) if isinstance(inputs, tuple) else [inputs])
                assert values and not any(value.requires_grad for value in values)


def test_inputs_holding_nan_or_inf_warn_naming_the_split_and_the_first_sample(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN (a missing value read from a table) or Inf in held inputs: a warning naming the split and the first sample,
    in every chunk the check reads; the task is made all the same (a model may replace them itself)."""
    monkeypatch.setattr("morphogen.data.user._CHECKED_VALUES_PER_CHUNK", 6)  # two rows of 3 values per chunk
    inputs, labels = pairs(8)
    holed = inputs.clone()
    holed[5, 1] = float("nan")
    with pytest.warns(UserWarning, match=r"^task_from_data: train: the inputs hold NaN or infinite values \(the first "
                                         r"in sample 5\); unless your model replaces them"):
        task = task_from_data("mine", (holed, labels), (inputs, labels))
    assert torch.isnan(task.train.inputs[5, 1])
    infinite = inputs.clone()
    infinite[7, 0] = float("inf")
    with pytest.warns(UserWarning, match=r"validation: .*sample 7\)"):
        task_from_data("mine", (inputs, labels), ((inputs, infinite), labels))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task_from_data("mine", (inputs, labels), (inputs.long(), labels))


def _returns_none(inputs: torch.Tensor, generator: torch.Generator | None) -> None:
    return None


@pytest.mark.parametrize(("augment", "message"), [
    (random_crop_flip, r"^augment raised ValueError: random_crop_flip needs images shaped \[B, C, H, W\], got shape "
                       r"\(4, 3\) \(on a training batch of shape \(4, 3\)\)$"),
    (lambda inputs: inputs, r"^augment raised TypeError: .*takes 1 positional argument but 2 were given"),
    (_returns_none, r"^augment returned NoneType for a batch of shape \(4, 3\); return the batch's inputs"),
    (lambda inputs, generator: inputs[:2], r"^augment returned a tensor of shape \(2, 3\) for a batch of shape"),
], ids=["crop-of-features", "one-argument", "returns-none", "drops-rows"])
def test_an_augmentation_that_fails_is_one_data_error(augment: object, message: str) -> None:
    """The user's augment runs as training batches are drawn: what it raises or returns wrongly is one DataError,
    held or streamed, where it was a traceback out of the batch iterator."""
    for train in (pairs(8), DataLoader(TensorDataset(*pairs(8)), batch_size=4)):
        task = task_from_data("mine", train, pairs(4), augment=augment, batch_size=4)  # type: ignore[arg-type]
        with pytest.raises(DataError, match=message):
            list(task.train.iterate_batches(4, augment=task.augment))


def test_an_augmentation_is_checked_to_be_a_function_and_runs_as_given() -> None:
    with pytest.raises(DataError, match=r"^augment must be a function \(inputs, generator\) -> inputs, got int$"):
        task_from_data("mine", pairs(), pairs(4), augment=3)  # type: ignore[arg-type]
    task = task_from_data("mine", pairs(8), pairs(4), augment=lambda inputs, generator: -inputs, batch_size=8)
    [(inputs, _)] = list(task.train.iterate_batches(8, shuffle=False, augment=task.augment))
    assert torch.equal(inputs, -pairs(8)[0])


class _Unstackable(torch.utils.data.Dataset[tuple[object, int]]):
    """Samples the default collate cannot stack: tensors of two lengths, or objects that are no tensors."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[object, int]:
        if self.kind == "ragged":
            return torch.zeros(index % 2 + 1), index % 2
        if self.kind == "pil":
            image = pytest.importorskip("PIL.Image")
            return image.new("L", (4, 4)), index % 2
        return object(), index % 2


@pytest.mark.parametrize(("kind", "message"), [
    ("ragged", r"^train: the Dataset's samples cannot be batched \(RuntimeError: stack expects each tensor to be equal "
               r"size.*\); samples of different shapes: bring them to one in the Dataset"),
    ("pil", r"^train: the Dataset's samples cannot be batched \(TypeError: .*PIL.*\); a torchvision dataset gives "
            r"tensors with transform=torchvision\.transforms\.ToTensor\(\)$"),
    ("object", r"^train: the Dataset's samples cannot be batched \(TypeError: .*\); return \(inputs, target\)"),
])
def test_dataset_samples_that_cannot_be_batched_are_one_data_error(kind: str, message: str) -> None:
    """A Dataset morphogen batches itself: samples torch's collate cannot stack say why in one line, where torch's
    TypeError or RuntimeError came out of the batch iterator."""
    task = task_from_data("mine", _Unstackable(kind), pairs(4))
    with pytest.raises(DataError, match=message):
        list(task.train.iterate_batches(4))


def test_a_loader_without_a_batch_size_is_told_to_give_it_one() -> None:
    """DataLoader(batch_size=None) yields single samples: the message names that setting, rather than asking for
    the DataLoader the user already gave."""
    loader = DataLoader(TensorDataset(*pairs(6)), batch_size=None)
    task = task_from_data("mine", loader, pairs(4))
    with pytest.raises(DataError, match=r"^train batch 0: \(3,\) inputs but \(\) targets; both need the same leading "
                                        r"sample dimension \(one sample, not a batch: the DataLoader has "
                                        r"batch_size=None, which yields samples one by one; give it a batch_size\)$"):
        next(iter(task.train.iterate_batches(4)))


def test_a_list_of_three_batches_is_still_streamed_and_numpy_samples_of_a_dataset_still_batch() -> None:
    """What the refusals of numpy splits and of flat tuples leave alone: a list of (inputs, targets) batches, and a
    Dataset whose samples are numpy arrays (torch's collate converts them)."""
    batches = [pairs(4), pairs(4), pairs(4)]
    assert isinstance(task_from_data("listed", batches, pairs(4)).train, StreamedBatches)
    samples = [(row.numpy(), int(label)) for row, label in zip(*pairs(6), strict=True)]
    dataset = task_from_data("numpy samples", ListDataset(samples), pairs(4))
    inputs, targets = next(iter(dataset.train.iterate_batches(6, shuffle=False)))
    assert isinstance(inputs, torch.Tensor) and inputs.shape[0] == 6 and targets.dtype == torch.int64


class ListDataset(torch.utils.data.Dataset[tuple[object, int]]):
    """A map-style Dataset over a list of samples."""

    def __init__(self, samples: list[tuple[object, int]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[object, int]:
        return self.samples[index]
