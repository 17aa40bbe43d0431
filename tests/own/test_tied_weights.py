"""A language model whose head shares the embedding's weight (nanoGPT's tying) grows and exports with the weight
still one tensor: in the host, in the grown model and in the file (README, "export_model")."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

import morphogen
from morphogen import MorphogeneticModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import GPTBlock


class TiedGPT(nn.Module):
    """Token ids [N, T] -> logits [N, T, V], the head's weight the embedding's."""

    def __init__(self, vocab: int = 11, width: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(12, width)
        self.h = nn.ModuleList(GPTBlock(width) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: Tensor) -> Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.size(1), device=ids.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _weights_named(module: nn.Module, *names: str) -> list[Tensor]:
    parameters = dict(module.named_parameters(remove_duplicate=False))
    return [next(value for key, value in parameters.items() if key.endswith(name)) for name in names]


def test_tied_weights_stay_one_tensor_through_growth_and_export(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net, ids = TiedGPT(), torch.randint(0, 11, (4, 12))
    model = MorphogeneticModel(morphogen.host_from_module(net, slots=["h.0", "h.1"], example_input=ids[:2])).eval()
    with torch.no_grad():
        before = model(ids)
        model.graft("h_0", "block")
        assert torch.equal(model(ids), before)  # zero output projections: the tied model's function at birth
    model.graft("h_1", "block_copy")
    embedding, head = _weights_named(model, "wte.weight", "lm_head.weight")
    assert embedding is head
    counted_twice = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert model.param_count() == counted_twice - embedding.numel()  # the shared weight counted once
    path = morphogen.export_model(model, ids[:2], tmp_path / "tied.pt2")
    program = torch.export.load(path).module()
    with torch.no_grad():
        assert torch.allclose(program(ids), model(ids), atol=1e-5)
    embedding, head = _weights_named(program, "wte.weight", "lm_head.weight")
    assert embedding.data_ptr() == head.data_ptr()  # one tensor in the file, two parameters once loaded (torch's)


def test_tied_weights_are_one_initializer_of_the_onnx_model(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    net, ids = TiedGPT(), torch.randint(0, 11, (4, 12))
    model = MorphogeneticModel(morphogen.host_from_module(net, slots=["h.0"], example_input=ids[:2])).eval()
    model.graft("h_0", "block")
    path = morphogen.export_model(model, ids[:2], tmp_path / "tied.onnx", format="onnx")
    names = [initializer.name for initializer in onnx.load(io.BytesIO(path.read_bytes())).graph.initializer]
    assert sum(name.endswith(("wte.weight", "lm_head.weight")) for name in names) == 1
