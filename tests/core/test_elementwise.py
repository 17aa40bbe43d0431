"""Which modules `is_elementwise_module` takes for element-wise activations: those whose traced forward applies only
listed element-wise operations to their one input; nothing with state, a reduction, a reshape or an in-place write."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from morphogen.core.elementwise import is_elementwise_module


class NewGelu(nn.Module):  # GELU's tanh approximation written out (Hugging Face's NewGELUActivation computes it)
    def forward(self, x: Tensor) -> Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class QuickGelu(nn.Module):  # x * sigmoid(1.702 x), CLIP's
    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


class TanhGelu(nn.Module):  # a functional call with a string constant
    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.gelu(x, approximate="tanh")


class ClippedGelu(nn.Module):  # methods and keyword constants
    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.gelu(x).clamp(min=-10.0, max=10.0)


class LearnedSlope(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.slope = nn.Parameter(torch.ones(1))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.slope


class ConstantTensor(nn.Module):  # a tensor attribute (per feature): not element by element
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.arange(4.0)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale


class Centred(nn.Module):  # a mean over the features: each output depends on every input
    def forward(self, x: Tensor) -> Tensor:
        return x - x.mean(dim=-1, keepdim=True)


class Softmax(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.softmax(x, dim=-1)


class Reversed(nn.Module):  # elements moved: not where they were
    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x.flip(-1))


class InPlace(nn.Module):  # writes into its input
    def forward(self, x: Tensor) -> Tensor:
        return x.mul_(2.0)


class Branches(nn.Module):  # Python control flow on values: fx cannot trace it
    def forward(self, x: Tensor) -> Tensor:
        return x if bool(x.sum() > 0) else -x


class TwoInputs(nn.Module):
    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return x * y


class HoldsAnActivation(nn.Module):  # a submodule: torch's own class test, not this one, is for those
    def __init__(self) -> None:
        super().__init__()
        self.act = nn.GELU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(x)


@pytest.mark.parametrize("module", [NewGelu, QuickGelu, TanhGelu, ClippedGelu])
def test_an_activation_written_out_of_elementwise_operations_is_recognised(module: type[nn.Module]) -> None:
    activation = module()
    assert is_elementwise_module(activation)
    x = torch.randn(3, 5, 4)
    torch.testing.assert_close(activation(x)[:, 2:3], activation(x[:, 2:3]))  # each element alone


@pytest.mark.parametrize("module", [LearnedSlope, ConstantTensor, Centred, Softmax, Reversed, InPlace, Branches,
                                    TwoInputs, HoldsAnActivation])
def test_a_module_with_state_or_that_mixes_moves_or_writes_elements_is_not(module: type[nn.Module]) -> None:
    assert not is_elementwise_module(module())
