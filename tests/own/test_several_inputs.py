"""A user's model of several inputs (token ids and a padding mask every block reads) is cut, grown and exported."""

from __future__ import annotations

import io
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from models import PaddedClassifier, eager_config, padded_sequences
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

import morphogen
from morphogen.core.lifecycle import Stage
from morphogen.core.model import MorphogeneticModel
from morphogen.core.module_host import HostBuildError
from morphogen.data import DataError
from morphogen.inputs import Inputs, call, take_rows
from morphogen.model_file import load_model_state, read_model_file, save_model_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from slot_driver import EASY_CONFIG, drive_to, perturb_seed


def _host(example: Inputs, seed: int = 0) -> tuple[nn.Module, morphogen.ModuleHost]:
    torch.manual_seed(seed)
    net = PaddedClassifier()
    return net, morphogen.host_from_module(net, slots=["blocks.0", "blocks.1"], example_input=example)


def _batch(count: int = 6, seed: int = 1) -> tuple[Tensor, Tensor]:
    (ids, padding), _ = padded_sequences(count, seed)
    return ids, padding


@pytest.mark.parametrize("as_dict", [False, True])
def test_the_cut_model_computes_what_the_model_computes_on_any_batch(as_dict: bool) -> None:
    ids, padding = _batch(2)
    example: Inputs = {"ids": ids, "padding": padding} if as_dict else (ids, padding)
    net, host = _host(example)
    assert host.topology == "transformer" and host.injection_points == {"blocks_0": 16, "blocks_1": 16}
    assert host.side_inputs is not None, "the blocks after the first cut read the mask"
    assert "blocks_0" not in host.measured_shapes  # a branch cannot read several inputs
    net.eval()
    model = MorphogeneticModel(host).eval()
    other_ids, other_padding = _batch(7, seed=5)
    other: Inputs = {"ids": other_ids, "padding": other_padding} if as_dict else (other_ids, other_padding)
    with torch.no_grad():
        torch.testing.assert_close(model(other), net(other_ids, other_padding), rtol=0, atol=1e-6)
        # The mask matters: the same ids with another padding give other outputs.
        assert not torch.allclose(model(other), net(other_ids, torch.zeros_like(other_padding)))
        # Called as the user's model is: its inputs as arguments (keywords for a dict), not one structure.
        as_called = model(ids=other_ids, padding=other_padding) if as_dict else model(other_ids, other_padding)
        torch.testing.assert_close(as_called, model(other), rtol=0, atol=0)
    wrong = (other_ids, other_padding) if as_dict else ()
    with pytest.raises(TypeError, match=r"this model takes its inputs as (keyword|positional) arguments"):
        model(*wrong, **({} if as_dict else {"ids": other_ids, "padding": other_padding}))


class _WithOptions(nn.Module):
    """A forward with options beside its input, as models often have."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: Tensor, mask: Tensor | None = None, scale: float = 2.0) -> Tensor:
        h = self.first(x) * scale
        if mask is not None:
            h = h * mask
        return self.second(h)


class _MaskedMLP(nn.Module):
    """Features and a mask over them, read by both hidden layers."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.head = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        h = torch.relu(self.first(x * mask))
        return self.head(torch.relu(self.second(h)) * mask.mean(1, keepdim=True))


def test_a_branch_grows_beside_every_segment_but_the_one_that_takes_the_inputs() -> None:
    x, mask = torch.randn(2, 4), torch.ones(2, 4)
    host = morphogen.host_from_module(_MaskedMLP(), slots=["first", "second"], example_input=(x, mask))
    model = MorphogeneticModel(host)
    assert model.slot("first").branch_site is None and model.slot("second").branch_site is not None
    assert not model.can_graft("first", "branch_wide") and model.can_graft("second", "branch_wide")


def test_parameters_the_example_does_not_give_keep_their_defaults() -> None:
    net = _WithOptions().eval()
    x = torch.randn(5, 4)
    host = morphogen.host_from_module(net, slots=["first"], example_input=x[:2])  # mask None, scale 2.0
    assert host.side_inputs is None, "nothing after the cut reads an input"
    with torch.no_grad():
        torch.testing.assert_close(MorphogeneticModel(host).eval()(x), net(x))
        mask = torch.ones(2, 4)
        host = morphogen.host_from_module(net, slots=["first"], example_input={"x": x[:2], "mask": mask})
        torch.testing.assert_close(MorphogeneticModel(host).eval()({"x": x[:2], "mask": 0 * mask}),
                                   net(x[:2], 0 * mask))


def test_inputs_the_example_did_not_give_are_refused_rather_than_ignored(tmp_path: Path) -> None:
    """A host traced without `mask` (the example left it at its default) would drop a mask the data gives: the
    host, the grown model, `grow` and a `Grower` refuse such inputs in one line naming the input."""
    x, y = torch.randn(40, 4), torch.randint(0, 2, (40,))
    host = morphogen.host_from_module(_WithOptions(), slots=["first"], example_input={"x": x[:2]})
    masked = {"x": x, "mask": torch.ones(40, 4)}
    with pytest.raises(ValueError, match="hold 'mask', which the host's example_input did not give"):
        host(masked)
    with pytest.raises(ValueError, match="hold 'mask', which the host's example_input did not give"):
        MorphogeneticModel(host)(masked)
    both = morphogen.host_from_module(_WithOptions(), slots=["first"], example_input={"x": x[:2], "mask": x[:2]})
    with pytest.raises(ValueError, match="lack 'mask', which the host's example_input gave"):
        MorphogeneticModel(both)({"x": x})
    task = morphogen.task_from_data("masked", ({**masked, "y": y}), ({**masked, "y": y}), num_classes=2,
                                    target_key="y")
    with pytest.raises(DataError, match=r"^task 'masked': the inputs hold 'mask', which the host's example_input "
                                        r"did not give: it was traced without them and would ignore them; [^\n]*$"):
        morphogen.grow(task, host, epochs=1, run_dir=str(tmp_path / "run"), out=io.StringIO(), baseline=False,
                       from_scratch=False)
    grower = morphogen.Grower(host, validation=({"x": x}, y), epochs=1, num_classes=2)
    with pytest.raises(ValueError, match="hold 'mask', which the host's example_input did not give"):
        grower.training_step(masked, y)
    positional = morphogen.host_from_module(_WithOptions(), slots=["first"], example_input=(x[:2],))
    with pytest.raises(ValueError, match="the inputs are 2 tensors, but the host's example_input gave 1"):
        MorphogeneticModel(positional)((x, torch.ones(40, 4)))


@pytest.mark.parametrize(("model", "example", "message"), [
    (nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.zeros(2, 4), torch.zeros(2, 4)), "nn.Sequential takes one"),
    (PaddedClassifier(), {"ids": torch.zeros(2, 10, dtype=torch.long), "mask": torch.zeros(2, 10)},
     "names 'mask', which PaddedClassifier.forward does not take"),
    (PaddedClassifier(), (torch.zeros(2, 10, dtype=torch.long),), "parameter 'padding' has no default"),
    (PaddedClassifier(), (torch.zeros(2, 10, dtype=torch.long), torch.zeros(3, 10, dtype=torch.bool)),
     "different numbers of samples (2, 3)"),
])
def test_inputs_that_cannot_work_are_one_clear_error(model: nn.Module, example: Inputs, message: str) -> None:
    slots = ["0"] if isinstance(model, nn.Sequential) else ["blocks.0"]
    with pytest.raises(HostBuildError, match=message.replace("(", r"\(").replace(")", r"\)")):
        morphogen.host_from_module(model, slots=slots, example_input=example)


def _training_seeds(model: MorphogeneticModel, blueprint: str | tuple[str, ...] = "mlp_small") -> None:
    """A TRAINING seed (perturbed: not the identity) in each slot: of `blueprint`, or of each slot's."""
    blueprints = (blueprint,) * len(model.slot_ids) if isinstance(blueprint, str) else blueprint
    for index, (slot_id, name) in enumerate(zip(model.slot_ids, blueprints, strict=True)):
        slot = model.germinate(slot_id, name)
        perturb_seed(slot, torch.Generator().manual_seed(10 + index))
        drive_to(slot, Stage.TRAINING)


@pytest.mark.parametrize("shadow_rows", [None, 4])
@pytest.mark.parametrize("blueprint", ["mlp_small", "block_copy",  # a copy of a block reads the mask itself
                                       ("mlp_small", "wider")])  # new neurons inside a block that reads it
def test_each_seeds_shadow_reads_the_mask_of_its_own_rows(shadow_rows: int | None,
                                                          blueprint: str | tuple[str, ...]) -> None:
    ids, padding = _batch(6)
    _, host = _host((ids[:2], padding[:2]))
    model = MorphogeneticModel(host.eval(), config=EASY_CONFIG).eval()
    _training_seeds(model, blueprint)
    output, shadow = model.forward_with_shadow((ids, padding), shadow_rows)
    assert shadow is not None and shadow.slot_ids == ("blocks_0", "blocks_1")
    rows = shadow.rows
    assert rows == (shadow_rows or 6)
    for k, slot_id in enumerate(shadow.slot_ids):
        # Reference: the first rows alone, with only this seed blended in at alpha 1.
        alphas = [[1.0 if other == slot_id else 0.0 for other in model.slot_ids]]
        with torch.no_grad():
            expected = model.counterfactual_forward((ids[:rows], padding[:rows]), alphas)[0]
        torch.testing.assert_close(shadow.outputs[k].detach(), expected, rtol=0, atol=1e-5)
    # Counterfactual configurations stacked on the batch read the mask of each configuration's rows.
    table = [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    with torch.no_grad():
        fused = model.counterfactual_forward((ids, padding), table)
        for row, alphas in enumerate(table):
            alone = model.counterfactual_forward((ids, padding), [alphas])[0]
            torch.testing.assert_close(fused[row], alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(output.detach(), fused[0], rtol=0, atol=1e-5)


def test_new_neurons_inside_a_block_that_reads_the_mask_fold_into_the_exported_program(tmp_path: Path) -> None:
    ids, padding = _batch(6)
    _, host = _host((ids[:2], padding[:2]))
    model = MorphogeneticModel(host.eval(), config=EASY_CONFIG).eval()
    with torch.no_grad():
        bare = model((ids, padding))
    slot = model.germinate("blocks_1", "wider")  # the MLP of the second block, whose attention reads the mask
    assert slot.width_site is not None and slot.width_site.inside
    drive_to(slot, Stage.FOSSILIZED)
    with torch.no_grad():
        torch.testing.assert_close(model((ids, padding)), bare, rtol=0, atol=1e-6)  # the identity at birth
    perturb_seed(slot, torch.Generator().manual_seed(3))
    with torch.no_grad():
        grown = model((ids, padding))
    assert not torch.allclose(grown, bare, atol=1e-4)
    program = torch.export.load(morphogen.export_model(model, (ids[:2], padding[:2]), tmp_path / "grown.pt2")).module()
    with torch.no_grad():
        torch.testing.assert_close(program(ids, padding), grown, rtol=0, atol=1e-5)
        assert not torch.allclose(program(ids, torch.zeros_like(padding)), grown, atol=1e-4)  # it reads the mask


def _stacked(net: PaddedClassifier) -> PaddedClassifier:
    """`net` with every block followed by itself: what copies of its blocks after each make of it."""
    deeper = PaddedClassifier()
    deeper.load_state_dict(net.state_dict(), strict=False)
    deeper.blocks = nn.ModuleList(block for block in net.blocks for _ in range(2))
    return deeper.eval()


def test_a_copy_of_a_users_block_stacks_it_reading_the_same_mask(tmp_path: Path) -> None:
    ids, padding = _batch(6)
    net, host = _host((ids[:2], padding[:2]))
    assert [type(host.layer_before(slot_id)).__name__ for slot_id in host.slot_ids] == ["GraphModule"] * 2
    model = MorphogeneticModel(host, config=EASY_CONFIG).eval()
    for slot_id in model.slot_ids:
        assert model.can_graft(slot_id, "block_copy")
        model.install(slot_id, "block_copy")  # in the output at alpha 1
    blocks = net.blocks
    copies = [model.slot(slot_id).seed for slot_id in model.slot_ids]
    for block, copied in zip(blocks, copies, strict=True):
        assert copied is not None and copied is not block
        for (name, value), original in zip(copied.state_dict().items(), block.state_dict().values(), strict=True):
            assert torch.equal(value, original) and value.data_ptr() != original.data_ptr(), name
    assert model.param_count() == sum(p.numel() for p in net.parameters()) + 2 * sum(
        p.numel() for p in blocks[0].parameters())
    with torch.no_grad():
        expected = _stacked(net)(ids, padding)
        torch.testing.assert_close(model((ids, padding)), expected, rtol=0, atol=1e-5)
        # A model file and a fresh host of the same model: the copies are rebuilt from its blocks, then loaded.
        path = tmp_path / "model.pt"
        save_model_file(model, path)
        _, fresh = _host((ids[:2], padding[:2]), seed=5)
        restored = MorphogeneticModel(fresh, config=EASY_CONFIG).eval()
        load_model_state(restored, read_model_file(path), path)
        torch.testing.assert_close(restored((ids, padding)), expected, rtol=0, atol=1e-5)
        program = torch.export.load(morphogen.export_model(model, (ids, padding), tmp_path / "grown.pt2")).module()
        torch.testing.assert_close(program(ids, padding), expected, rtol=0, atol=1e-5)


def test_only_a_block_of_the_main_path_is_copied() -> None:
    ids, padding = _batch(2)
    # A slot after the embedding: it takes the model's inputs, not an activation; after one linear layer: no block.
    host = morphogen.host_from_module(PaddedClassifier(), slots=["embed", "blocks.1"], example_input=(ids, padding))
    assert host.layer_before("embed") is None and host.layer_before("blocks_1") is not None
    linear = morphogen.host_from_module(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), slots=["0"],
                                        example_input=torch.zeros(2, 4))
    assert linear.layer_before("0") is None
    with pytest.raises(ValueError, match="'block_copy' copies the host's layer just before slot embed, and the host "
                                         "has none there"):
        MorphogeneticModel(host).germinate("embed", "block_copy")


class _PadTokenEncoder(nn.Module):
    """One input, token ids; the padding mask every layer of torch's encoder reads is computed from them (id 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.encoder(self.embed(ids), src_key_padding_mask=ids == 0))


def _padded_ids(count: int, seed: int) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 8, (count, 7), generator=generator)
    return ids.masked_fill(torch.arange(7) >= torch.randint(2, 8, (count, 1), generator=generator), 0)


def test_new_neurons_in_the_part_that_takes_the_input_leave_later_layers_reading_this_batchs_mask() -> None:
    """The part that takes the input binds it for the later parts, which compute the padding mask from it; traced
    again for new neurons inside its layer, it still binds each batch's (it once bound the tracer's placeholder: a
    later layer then failed, or read an earlier batch's ids)."""
    ids, other_ids = _padded_ids(6, 1), _padded_ids(4, 2)
    torch.manual_seed(0)
    host = morphogen.host_from_module(_PadTokenEncoder(), slots=["encoder.layers.0", "encoder.layers.1"],
                                      example_input=ids[:2])
    assert host.side_inputs is not None
    model = MorphogeneticModel(host.eval(), config=EASY_CONFIG).eval()
    with torch.no_grad():
        bare, other_bare = model(ids), model(other_ids)
    slot = model.germinate("encoder_layers_0", "wider")  # the MLP of the first layer, in the part that binds ids
    assert slot.width_site is not None and slot.width_site.inside
    drive_to(slot, Stage.FOSSILIZED)
    with torch.no_grad():  # the identity at birth, whichever batch came before
        torch.testing.assert_close(model(ids), bare, rtol=0, atol=1e-6)
        torch.testing.assert_close(model(other_ids), other_bare, rtol=0, atol=1e-6)
        torch.testing.assert_close(model(ids[:3]), bare[:3], rtol=0, atol=1e-6)


class _EncoderClassifier(nn.Module):
    """A text classifier built on torch's own `nn.TransformerEncoder`, its padding read by every layer."""

    def __init__(self, pool_padding: bool = False) -> None:
        super().__init__()
        self.pool_padding = pool_padding
        self.embed = nn.Embedding(8, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16))  # nested tensors when it infers
        self.head = nn.Linear(16, 3)

    def forward(self, ids: Tensor, padding: Tensor) -> Tensor:
        x = self.encoder(self.embed(ids), src_key_padding_mask=padding)
        if self.pool_padding:  # padded positions too: what the encoder's inference fast path sets to zero
            return self.head(x.mean(1))
        keep = (~padding).unsqueeze(-1).to(x.dtype)
        return self.head((x * keep).sum(1) / keep.sum(1))


@pytest.mark.parametrize("pool_padding", [False, True])
def test_the_layers_of_torchs_transformer_encoder_hold_slots_and_copies(pool_padding: bool, tmp_path: Path) -> None:
    """fx keeps torch.nn modules whole and cannot trace `nn.TransformerEncoder.forward`: a slot after one of its
    layers is cut from the layers' calls, as the encoder makes them while it trains."""
    ids, padding = _batch(6)
    torch.manual_seed(0)
    net = _EncoderClassifier(pool_padding)
    host = morphogen.host_from_module(net, slots=["encoder.layers.0", "encoder.layers.1"],
                                      example_input=(ids[:2], padding[:2]))
    assert host.topology == "transformer" and host.slot_ids == ("encoder_layers_0", "encoder_layers_1")
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    torch.testing.assert_close(model((ids, padding)), net(ids, padding), rtol=0, atol=1e-5)  # training mode
    for slot_id in model.slot_ids:
        model.install(slot_id, "block_copy")
    deeper = _EncoderClassifier(pool_padding)
    deeper.load_state_dict(net.state_dict())
    deeper.encoder.layers = nn.ModuleList(layer for layer in net.encoder.layers for _ in range(2))
    torch.testing.assert_close(model((ids, padding)), deeper(ids, padding), rtol=0, atol=1e-5)
    model.eval()
    with torch.no_grad():
        program = torch.export.load(morphogen.export_model(model, (ids, padding), tmp_path / "grown.pt2")).module()
        torch.testing.assert_close(program(ids, padding), model((ids, padding)), rtol=0, atol=1e-5)


def _with_seed_neurons(wide: nn.Module, layer: nn.Module, seed: nn.Module) -> nn.Module:
    """`wide`, a transformer layer like `layer` with a wider `dim_feedforward`, given `layer`'s weights and the
    width seed's new MLP neurons: what `layer` is once the seed is blended in at alpha 1."""
    wide.load_state_dict({name: value for name, value in layer.state_dict().items() if "linear" not in name},
                         strict=False)
    with torch.no_grad():
        wide.linear1.weight.copy_(torch.cat([layer.linear1.weight, seed.producer.weight]))
        wide.linear1.bias.copy_(torch.cat([layer.linear1.bias, seed.producer.bias]))
        wide.linear2.weight.copy_(torch.cat([layer.linear2.weight, seed.consumer.weight], dim=1))
        wide.linear2.bias.copy_(layer.linear2.bias)
    return wide


def test_the_mlp_of_a_layer_of_torchs_transformer_encoder_widens_and_is_the_wider_layer(tmp_path: Path) -> None:
    """fx keeps `nn.TransformerEncoderLayer` whole; its MLP is still found (`core/tracing.PartialTracer` traces the
    layer as its forward computes it outside the inference fast path). The oracle: the same classifier with that
    layer's `dim_feedforward` made wider by hand from the seed's weights."""
    ids, padding = _batch(6)
    torch.manual_seed(0)
    net = _EncoderClassifier()
    host = morphogen.host_from_module(net, slots=["encoder.layers.0", "encoder.layers.1"],
                                      example_input=(ids[:2], padding[:2]))
    model = MorphogeneticModel(host, ["encoder_layers_1"], config=EASY_CONFIG).eval()
    slot = model.germinate("encoder_layers_1", "wider_half")
    layer = net.encoder.layers[1]
    assert slot.width_site is not None and slot.width_site.producer is layer.linear1
    assert slot.width_site.consumer is layer.linear2
    drive_to(slot, Stage.HOLDING)
    with torch.no_grad():
        torch.testing.assert_close(model((ids, padding)), net.eval()(ids, padding), rtol=0, atol=1e-5)
    perturb_seed(slot, torch.Generator().manual_seed(3))
    seed = slot.seed
    assert seed is not None
    wider = _EncoderClassifier()
    wider.load_state_dict(net.state_dict())
    wider.encoder.layers[1] = _with_seed_neurons(nn.TransformerEncoderLayer(16, 2, 32 + 16, dropout=0.0,
                                                                           batch_first=True), layer, seed)
    with torch.no_grad():
        grown = model((ids, padding))
        assert not torch.allclose(grown, net(ids, padding), atol=1e-4)
        torch.testing.assert_close(grown, wider.eval()(ids, padding), rtol=0, atol=1e-5)
        program = torch.export.load(morphogen.export_model(model, (ids, padding), tmp_path / "grown.pt2")).module()
        torch.testing.assert_close(program(ids, padding), grown, rtol=0, atol=1e-5)


class _PaddedDataset(Dataset[tuple[dict[str, Tensor], Tensor]]):
    """Samples as a data pipeline gives them: a dict of inputs by argument name, and a label."""

    def __init__(self, count: int, seed: int) -> None:
        (self.ids, self.padding), self.labels = padded_sequences(count, seed)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[dict[str, Tensor], Tensor]:
        return {"ids": self.ids[index], "padding": self.padding[index]}, self.labels[index]


def _tensor_task() -> morphogen.Task:
    train, validation = padded_sequences(192, 0), padded_sequences(64, 1)
    return morphogen.task_from_data("padded", train, validation, num_classes=3, batch_size=32)


def _loader_task() -> morphogen.Task:
    return morphogen.task_from_data("padded-dicts", DataLoader(_PaddedDataset(192, 0), batch_size=32),
                                    _PaddedDataset(64, 1), num_classes=3, batch_size=32)


@pytest.mark.parametrize("make_task", [_tensor_task, _loader_task])
def test_a_model_of_several_inputs_grows_and_exports_a_program_called_as_the_model(
        make_task: Callable[[], morphogen.Task], tmp_path: Path,
        run_without_morphogen: Callable[..., list[Tensor]]) -> None:
    task = make_task()
    inputs = next(iter(task.validation.iterate_batches(5, shuffle=False)))[0]
    _, host = _host(inputs)
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), config=eager_config(epochs=5,
                            slots=("blocks_0",)), out=io.StringIO())
    assert [story.blueprint for story in result.grown.stories if "training" in story.stages], "no seed trained"
    kept = [slot for slot in result.model.slots() if slot.stage in (Stage.HOLDING, Stage.FOSSILIZED)]
    assert kept, "no seed to fold in"
    path = morphogen.export_model(result.model, inputs, tmp_path / "grown.pt2")
    with torch.no_grad():
        expected = result.model.eval()(inputs)
        program = torch.export.load(path).module()
        torch.testing.assert_close(call(program, inputs), expected, rtol=0, atol=1e-5)  # type: ignore[arg-type]
    for outputs in run_without_morphogen([path], inputs):  # where morphogen cannot be imported
        torch.testing.assert_close(outputs, expected, rtol=0, atol=1e-5)


def test_batches_whose_inputs_disagree_are_one_data_error() -> None:
    (ids, padding), labels = padded_sequences(8, 0)
    bad = [((ids[:4], padding[:3]), labels[:4])]
    task = morphogen.task_from_data("bad", bad, bad, num_classes=3)
    with pytest.raises(DataError, match="train batch 0: its inputs are a tuple of tensors with different numbers"):
        next(iter(task.train.iterate_batches(4)))


def test_data_of_another_kind_than_the_example_input_is_one_data_error_naming_both(tmp_path: Path) -> None:
    """A host built from a dict of inputs meets tensors: the first validation says so, not what torch says."""
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    task = morphogen.task_from_data("tensors", (x[:30], y[:30]), (x[30:], y[30:]), num_classes=3)
    network = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))

    class ByName(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.network = network

        def forward(self, features: Tensor) -> Tensor:
            return self.network(features)

    host = morphogen.host_from_module(ByName(), ["network.1"], example_input={"features": x[:2]})
    with pytest.raises(DataError, match=r"^task 'tensors': its inputs are a tensor, but the host was built from an "
                                        r"example_input that is a dict"):
        morphogen.grow(task, host, epochs=1, run_dir=str(tmp_path / "run"), out=io.StringIO(), baseline=False,
                       from_scratch=False)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("blueprint", ["mlp_small", "block_copy", ("mlp_small", "wider")])
def test_compiled_training_passes_match_eager_ones_without_graph_breaks_or_recompiles(
        blueprint: str | tuple[str, ...]) -> None:
    import torch._dynamo

    from morphogen.core.compilation import CompileSettings

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    ids, padding = _batch(8)
    _, host = _host((ids[:2], padding[:2]))
    model = MorphogeneticModel(host, config=EASY_CONFIG)
    _training_seeds(model, blueprint)
    eager, eager_shadow = model.forward_with_shadow((ids, padding), 6)
    model.compile_forward(CompileSettings(backend="aot_eager"))
    for seed in (2, 3):  # other batches of the same shape reuse the graphs
        other = _batch(8, seed)
        model.forward_with_shadow(other, 6)
    compiled, compiled_shadow = model.forward_with_shadow((ids, padding), 6)
    assert eager_shadow is not None and compiled_shadow is not None
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-5)
    torch.testing.assert_close(compiled_shadow.outputs, eager_shadow.outputs, rtol=0, atol=1e-5)
    counters = torch._dynamo.utils.counters
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 2


class _CausalBlock(nn.Module):
    """Self-attention under a mask the model computes once and hands to every block."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, 2, batch_first=True)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        h = self.norm(x)
        return x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]


class _MasksFromInputs(nn.Module):
    """As Hugging Face-style models do: the forward turns its inputs into masks once (a causal mask from the
    length of `ids`, padding from `attention_mask`, 1 for a real token) and every block reads them."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, width)
        self.first, self.second = _CausalBlock(width), _CausalBlock(width)
        self.head = nn.Linear(width, 8)

    def forward(self, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        length = ids.shape[1]
        causal = ids.new_ones(length, length, dtype=torch.bool).triu(1)  # fx traces a size read from an input
        x = self.second(self.first(self.embed(ids), causal), causal)
        if attention_mask is not None:
            x = x * attention_mask.unsqueeze(-1).to(x.dtype)  # padding positions predict from nothing
        return self.head(x)


@pytest.mark.parametrize("with_mask", [False, True])
def test_values_the_model_computes_from_its_inputs_reach_every_block(with_mask: bool) -> None:
    """A mask computed from the inputs crosses the cuts: later segments compute it again from the inputs."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 8, (6, 7), generator=generator)
    attention_mask = (torch.arange(7) < torch.randint(2, 8, (6, 1), generator=generator)).long()
    inputs: Inputs = (ids, attention_mask) if with_mask else ids
    torch.manual_seed(0)
    net = _MasksFromInputs().eval()
    host = morphogen.host_from_module(net, slots=["first", "second"],
                                      example_input=(ids[:2], attention_mask[:2]) if with_mask else ids[:2])
    assert host.side_inputs is not None and host.topology == "transformer"
    model = MorphogeneticModel(host.eval(), config=EASY_CONFIG).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(inputs), call(net, inputs), rtol=0, atol=1e-6)
    _training_seeds(model)
    _, shadow = model.forward_with_shadow(inputs, 4)
    assert shadow is not None
    with torch.no_grad():  # each seed's shadow equals the model with only that seed in, on the first 4 rows
        first_rows = take_rows(inputs, slice(0, 4))
        for k, slot_id in enumerate(shadow.slot_ids):
            alphas = [[1.0 if other == slot_id else 0.0 for other in model.slot_ids]]
            expected = model.counterfactual_forward(first_rows, alphas)[0]
            torch.testing.assert_close(shadow.outputs[k].detach(), expected, rtol=0, atol=1e-5)


def test_a_value_computed_from_the_main_path_still_may_not_cross_a_cut() -> None:
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.outer = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: Tensor) -> Tensor:
            h = torch.relu(self.outer(x))
            return h * self.inner(h)  # `h` reaches the code after `inner` (a gate, not a residual sum)

    with pytest.raises(HostBuildError, match="sits inside a branch: relu"):
        morphogen.host_from_module(Residual(), slots=["inner"], example_input=torch.randn(2, 4))


class _TokenDropout(nn.Module):
    """Hides a random tenth of the real tokens from every block: random numbers drawn by a function."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 16)
        self.blocks = nn.ModuleList(PaddedClassifier().blocks)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: Tensor, padding: Tensor) -> Tensor:
        hidden = padding | (torch.rand_like(padding, dtype=torch.float) < 0.1)
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, hidden)
        return self.head(x.mean(1))


def test_random_numbers_a_later_part_would_draw_again_are_refused() -> None:
    ids, padding = _batch(2)
    with pytest.raises(HostBuildError, match=r"slot after 'blocks.0': the code after it reads or_, computed from "
                                             "random numbers drawn before it"):
        morphogen.host_from_module(_TokenDropout(), slots=["blocks.0"], example_input=(ids, padding))


def test_a_slot_where_tokens_are_folded_into_the_batch_is_refused() -> None:
    """Shadow rows and counterfactual configurations are whole samples: a slot needs one row per sample."""
    class Folded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.per_token, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x: Tensor) -> Tensor:  # (N, T, 4) -> (N*T, 4) -> (N, T, 2)
            return self.head(self.per_token(x.reshape(-1, 4))).reshape(x.shape[0], x.shape[1], 2)

    with pytest.raises(HostBuildError, match="slot after 'per_token': its output has 6 rows for a batch of 2"):
        morphogen.host_from_module(Folded(), slots=["per_token"], example_input=torch.randn(2, 3, 4))


class _SequenceFirstEncoder(nn.Module):
    """Torch's encoder with `batch_first=False`: its layers take and return (T, N, width)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(8, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 8)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.encoder(self.embed(ids).transpose(0, 1)).transpose(0, 1))


def test_a_slot_after_a_sequence_first_layer_is_refused_saying_to_put_the_batch_first() -> None:
    with pytest.raises(HostBuildError, match=r"has 5 rows for a batch of 2 samples; .*its dimension 1 holds the 2 "
                                             r"samples, .*batch_first=False\): build them with batch_first=True"):
        morphogen.host_from_module(_SequenceFirstEncoder(), slots=["encoder.layers.0"],
                                   example_input=torch.randint(0, 8, (2, 5)))


class _LastState(nn.Module):
    """A batch-first RNN classifier that reads the RNN's final state, [layers, N, D], rather than its output."""

    def __init__(self, rnn: str) -> None:
        super().__init__()
        self.lstm = rnn == "lstm"
        self.embed = nn.Embedding(8, 16)
        self.rnn = nn.LSTM(16, 16, batch_first=True) if self.lstm else nn.GRU(16, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, ids: Tensor) -> Tensor:
        if self.lstm:
            _, (state, _) = self.rnn(self.embed(ids))
        else:
            _, state = self.rnn(self.embed(ids))
        return self.head(state[-1])


@pytest.mark.parametrize(("rnn", "found"), [("gru", r"its output has 1 rows for a batch of 2 samples"),
                                            ("lstm", r"its output is a tuple, not one tensor")])
def test_a_slot_after_an_rnn_whose_final_state_is_read_says_where_a_slot_can_go(rnn: str, found: str) -> None:
    """The state holds the samples in its dimension 1 whatever batch_first: the advice is the RNN's output, not the
    sequence-first layout's batch_first=True, which the RNN already has."""
    with pytest.raises(HostBuildError, match=rf"^slot after 'rnn': {found}; .*an RNN's final state \(h, or an LSTM's "
                                             r"\(h, c\)\) is \[layers, N, D\] whatever batch_first: put the slot after "
                                             r"the RNN where the forward reads its output"):
        morphogen.host_from_module(_LastState(rnn), slots=["rnn"], example_input=torch.randint(0, 8, (2, 5)))


class _LastOutput(nn.Module):
    """A batch-first GRU classifier that reads the GRU's output at the last step."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.rnn, self.head = nn.Embedding(8, 16), nn.GRU(16, 16, batch_first=True), nn.Linear(16, 2)

    def forward(self, ids: Tensor) -> Tensor:
        out, _ = self.rnn(self.embed(ids))
        return self.head(out[:, -1])


def test_a_model_with_an_rnn_exports_without_torchs_warning_about_its_flat_weights(tmp_path: Path) -> None:
    """torch.export warns that an RNN's `_flat_weights` were assigned and should be buffers; they are the RNN's
    parameters, which the program holds: the warning would only alarm."""
    ids = torch.randint(0, 8, (6, 5))
    model = MorphogeneticModel(morphogen.host_from_module(_LastOutput(), slots=["rnn"], example_input=ids[:2]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = torch.export.load(morphogen.export_model(model.eval(), ids[:2], tmp_path / "grown.pt2")).module()
    assert not [str(warning.message) for warning in caught if "_flat_weights" in str(warning.message)]
    assert sum(p.numel() for p in program.parameters()) == sum(p.numel() for p in model.parameters())
    torch.testing.assert_close(program(ids), model(ids), rtol=0, atol=1e-6)


class _Seq2Seq(nn.Module):
    """An encoder-decoder on torch's own layers: every decoder layer reads the encoder's output (`memory`), which
    crosses the slots between the decoder's layers."""

    def __init__(self, vocab: int = 8, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(width, 2, 32, 0.0, batch_first=True,
                                                                        norm_first=True), 2, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(width, 2, 32, 0.0, batch_first=True,
                                                                        norm_first=True), 2)
        self.head = nn.Linear(width, vocab)

    def forward(self, source: Tensor, target: Tensor) -> Tensor:
        memory = self.encoder(self.embed(source))
        causal = nn.Transformer.generate_square_subsequent_mask(target.size(1))
        return self.head(self.decoder(self.embed(target), memory, tgt_mask=causal))


def _reversals(count: int, seed: int) -> tuple[tuple[Tensor, Tensor], Tensor]:
    """((source, decoder input), targets): the target is the source reversed, the decoder reads it shifted right
    behind a start token (0)."""
    source = torch.randint(1, 8, (count, 6), generator=torch.Generator().manual_seed(seed))
    reversed_source = source.flip(1)
    return (source, torch.cat([torch.zeros(count, 1, dtype=torch.long), reversed_source[:, :-1]], 1)), reversed_source


def test_the_layers_of_torchs_transformer_decoder_hold_slots_across_which_the_encoders_output_is_carried(
        tmp_path: Path) -> None:
    train, validation = _reversals(192, 0), _reversals(64, 1)
    example = (train[0][0][:2], train[0][1][:2])
    torch.manual_seed(0)
    net = _Seq2Seq()
    with pytest.raises(HostBuildError, match=r"^slot after 'decoder.layers.0': it sits inside a branch: .* "
                                             r"or pass carry_skips=True"):
        morphogen.host_from_module(net, ["decoder.layers.0", "decoder.layers.1"], example_input=example)
    host = morphogen.host_from_module(net, ["decoder.layers.0", "decoder.layers.1"], example_input=example,
                                      carry_skips=True)
    assert host.topology == "transformer" and host.carried_values is not None
    torch.testing.assert_close(MorphogeneticModel(host)(example), net(*example), rtol=0, atol=1e-5)
    task = morphogen.task_from_data("reversal", train, validation, num_classes=8, batch_size=32)
    result = morphogen.grow(task, host, run_dir=str(tmp_path / "run"), out=io.StringIO(),
                            config=eager_config(epochs=5, slots=("decoder_layers_0",)))
    assert [story.blueprint for story in result.grown.stories if "training" in story.stages], "no seed trained"
    inputs = (validation[0][0][:5], validation[0][1][:5])
    path = morphogen.export_model(result.model, (inputs[0][:2], inputs[1][:2]), tmp_path / "grown.pt2")
    with torch.no_grad():
        program = torch.export.load(path).module()
        torch.testing.assert_close(program(*inputs), result.model.eval()(inputs), rtol=0, atol=1e-5)



def test_the_mlp_of_a_layer_of_torchs_transformer_decoder_widens_and_is_the_wider_layer(tmp_path: Path) -> None:
    """fx keeps `nn.TransformerDecoderLayer` whole, but its forward traces; its MLP is found inside it. The oracle:
    the same encoder-decoder with that layer's `dim_feedforward` made wider by hand from the seed's weights. The
    first decoder layer's slot has no site: its segment takes the model's two inputs."""
    train = _reversals(8, 0)
    example = (train[0][0][:2], train[0][1][:2])
    inputs = (train[0][0], train[0][1])
    torch.manual_seed(0)
    net = _Seq2Seq()
    host = morphogen.host_from_module(net, ["decoder.layers.0", "decoder.layers.1"], example_input=example,
                                      carry_skips=True)
    model = MorphogeneticModel(host, config=EASY_CONFIG).eval()
    assert "several inputs" in model.slot("decoder_layers_0").width_problem
    slot = model.germinate("decoder_layers_1", "wider_half")
    layer = net.decoder.layers[1]
    assert slot.width_site is not None and slot.width_site.producer is layer.linear1
    assert slot.width_site.consumer is layer.linear2
    drive_to(slot, Stage.HOLDING)
    perturb_seed(slot, torch.Generator().manual_seed(3))
    seed = slot.seed
    assert seed is not None
    wider = _Seq2Seq()
    wider.load_state_dict(net.state_dict())
    wider.decoder.layers[1] = _with_seed_neurons(nn.TransformerDecoderLayer(16, 2, 32 + 16, 0.0, batch_first=True,
                                                                           norm_first=True), layer, seed)
    with torch.no_grad():
        grown = model(inputs)
        assert not torch.allclose(grown, net.eval()(*inputs), atol=1e-4)
        torch.testing.assert_close(grown, wider.eval()(*inputs), rtol=0, atol=1e-5)
        program = torch.export.load(morphogen.export_model(model, example, tmp_path / "grown.pt2")).module()
        torch.testing.assert_close(program(*inputs), grown, rtol=0, atol=1e-5)


def test_data_of_several_inputs_with_rows_that_differ_is_one_line_naming_the_split() -> None:
    # (inputs, targets) whose inputs disagree on their samples must not be read as a sequence of two samples.
    ids, padding, targets = torch.zeros(8, 10, dtype=torch.long), torch.zeros(7, 10), torch.zeros(8, dtype=torch.long)
    good = ((ids, padding[:1].expand(8, 10)), targets)
    with pytest.raises(morphogen.DataError, match=r"^train: its inputs are a tuple of tensors with different numbers "
                                                  r"of samples \(7, 8\)$"):
        morphogen.task_from_data("t", ((ids, padding), targets), good)
    with pytest.raises(morphogen.DataError, match=r"^validation: its inputs are a dict of tensors with different"):
        morphogen.task_from_data("t", good, ({"ids": ids, "padding": padding}, targets))


def test_one_sample_given_as_the_example_input_says_the_example_is_a_batch() -> None:
    """A user who passes `x[0]` (one sample's 12 features) rather than `x[:2]` is told the example is a batch."""
    network = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    with pytest.raises(HostBuildError, match=r"its output has 16 rows for a batch of 12 samples; .*example_input is a "
                                             r"batch, its first dimension the samples: was it one sample's 12 values "
                                             r"\(give x\[:2\], not x\[0\]\)\?$"):
        morphogen.host_from_module(network, slots=["1"], example_input=torch.randn(12))
