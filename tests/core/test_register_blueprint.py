"""`register_blueprint`: a user's own seed recipe, checked once at registration, then grown like any other."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from morphogen import MorphogeneticModel, Stage, blueprint_names, host_from_module, register_blueprint
from morphogen.core import blueprints


@pytest.fixture(autouse=True)
def clean_registry() -> None:
    """Each test registers into a copy: user blueprints must not leak into other tests."""
    saved = {topology: dict(recipes) for topology, recipes in blueprints._REGISTRY.items()}
    yield
    blueprints._REGISTRY.clear()
    blueprints._REGISTRY.update(saved)


class GatedLinear(nn.Module):
    """h + gate * linear(h), the gate starting at zero."""

    def __init__(self, width: int, *, device: object = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width, device=device, dtype=dtype)
        self.gate = nn.Parameter(torch.zeros(width, device=device, dtype=dtype))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.gate * self.linear(h)


def test_a_registered_blueprint_grows_in_a_slot_of_a_users_model() -> None:
    register_blueprint("mlp", "gated_linear", GatedLinear, "linear layer behind a zero gate")
    assert blueprint_names("mlp")[-1] == "gated_linear"
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(4, 6)
    grown = MorphogeneticModel(host_from_module(model, ["1"], example_input=x))
    slot = grown.germinate("1", "gated_linear")
    assert slot.stage is Stage.GERMINATED and slot.seed_parameter_count() == 8 * 8 + 8 + 8
    assert torch.equal(grown(x), model(x))


@pytest.mark.parametrize(("builder", "message"), [
    (lambda width, device=None, dtype=None: nn.Linear(width, width), "is not the identity at birth"),
    (lambda width, device=None, dtype=None: nn.Linear(width, width + 1), "must keep the activation's shape"),
    (lambda width, device=None, dtype=None: nn.Identity(), "has no trainable parameters"),
    (lambda width, device=None, dtype=None: nn.Sequential(nn.BatchNorm1d(width), nn.Linear(width, width)),
     "holds a BatchNorm"),
])
def test_a_recipe_that_breaks_the_seed_contract_is_refused(builder: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        register_blueprint("mlp", "broken", builder)  # type: ignore[arg-type]
    assert "broken" not in blueprint_names("mlp")


def test_names_and_topologies_are_checked() -> None:
    with pytest.raises(ValueError, match="already exists"):
        register_blueprint("cnn", "conv_light", GatedLinear)
    with pytest.raises(ValueError, match="unknown topology 'graph'"):
        register_blueprint("graph", "gated", GatedLinear)
    with pytest.raises(ValueError, match="must be an identifier"):
        register_blueprint("mlp", "two words", GatedLinear)
