"""The growth policy: one set of weights for any task, host, number of slots, blueprint registry and episode length.

Its inputs are `GrowthInputs` (the encoded observation of `env/observation.py`, padded to the widest env
of a batch), its actions the heads of `env/actions.py`:

- Every slot is encoded by one shared MLP from its features; the trunk reads the episode's features
  and the mean and the maximum of the slot encodings over the env's slots, so any number of slots
  works and their order does not matter. Trunk -> LSTM -> features, as in `RecurrentActorCritic`.
- The op head reads the features. The slot head scores each slot with shared weights from the
  features and that slot's encoding: permuting the slots permutes its logits the same way.
- The blueprint head scores each blueprint of the chosen slot from the features, the slot's encoding
  and the blueprint's own encoding (its kind and the parameters it adds there, relative to the host),
  so a blueprint it never saw is scored by what it is, not by an index.
- The other heads (blend kind, blend epochs, alpha target, speed and curve) choose among fixed values
  from the features and the chosen slot's encoding.
- Padding: slots and blueprints an env does not have are False in `slot_valid` / `blueprint_valid`
  and never chosen (their logits are `MASKED_LOGIT`), whatever the masks say.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from morphogen.control.policy import (
    MASKED_LOGIT,
    MaskSequence,
    RecurrentActorCritic,
    check_mask_shapes,
)
from morphogen.env.actions import FIXED_CHOICES, HEAD_RELEVANCE, HEADS
from morphogen.env.observation import ADVICE_OP_COLUMNS, BLUEPRINT_SIZE, GLOBAL_SIZE, SLOT_SIZE

__all__ = ["BLUEPRINT_HEAD", "SLOT_HEAD", "GrowthInputs", "GrowthPolicy"]

SLOT_HEAD, BLUEPRINT_HEAD = HEADS.index("slot"), HEADS.index("blueprint")


class GrowthInputs(NamedTuple):
    """Observations as the growth policy reads them; every tensor has the same leading dimensions ``[...]``."""

    globals: Tensor
    """[..., GLOBAL_SIZE] float"""
    slots: Tensor
    """[..., S, SLOT_SIZE] float, S the most slots of any env in the batch"""
    slot_valid: Tensor
    """[..., S] bool: False where an env has fewer slots (padding)"""
    blueprints: Tensor
    """[..., S, K, BLUEPRINT_SIZE] float, K the most blueprints of any env in the batch"""
    blueprint_valid: Tensor
    """[..., K] bool: False where an env's topology has fewer blueprints (padding)"""


class _Context(NamedTuple):
    features: Tensor  # [N, hidden]
    slots: Tensor  # [N, S, embedding]
    inputs: GrowthInputs  # leading [N]


def _mlp(sizes: Sequence[int], factory: dict[str, Any]) -> nn.Sequential:
    """Linear layers of `sizes` with LayerNorm and ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for index, (inputs, outputs) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(inputs, outputs, **factory))
        if index < len(sizes) - 2:
            layers += [nn.LayerNorm(outputs, **factory), nn.ReLU()]
    return nn.Sequential(*layers)


#: The advice weight of a new policy: the advised op's logit starts this far above the others (probability about
#: 0.95 against seven near-uniform ops), so an untrained policy follows the advice.
ADVICE_PRIOR = 5.0


class GrowthPolicy(RecurrentActorCritic):
    """The transferable growth controller (see the module docstring); `hidden_size` is the LSTM's width.
    `recurrent=False` has no LSTM: two tanh layers make the features from this epoch's observation alone."""

    def __init__(self, *, hidden_size: int = 128, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, recurrent: bool = True) -> None:
        embedding = max(hidden_size // 2, 8)
        relevance = torch.as_tensor(HEAD_RELEVANCE)
        n_ops = relevance.shape[0]
        super().__init__(GLOBAL_SIZE + 2 * embedding, n_ops, len(HEADS), hidden_size=hidden_size,
                         head_relevance=relevance, device=device, dtype=dtype, recurrent=recurrent)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embedding_size = embedding
        #: Number of values of each head with a fixed choice list (None for the slot and blueprint heads).
        self.fixed_sizes: tuple[int | None, ...] = tuple(
            len(FIXED_CHOICES[head]) if head in FIXED_CHOICES else None for head in HEADS)
        self.slot_encoder = _mlp((SLOT_SIZE, embedding, embedding), factory)
        self.blueprint_encoder = _mlp((BLUEPRINT_SIZE, embedding, embedding), factory)
        self.op_head = nn.Linear(hidden_size, n_ops, **factory)
        #: Added to the advised op's logit (`env/observation.py`'s advice): one weight for every op, so following
        #: the advice carries over to an op never advised in training (GROW on a transformer). It starts at
        #: `ADVICE_PRIOR`, a policy that follows the advice; started at 0, imitation left it at 0.08 (the op head
        #: learned to follow the ops it saw advised, and ignored GROW on the `text` task).
        self.advice_weight = nn.Parameter(torch.full((), ADVICE_PRIOR, **factory))
        self.slot_scorer = _mlp((hidden_size + embedding, embedding, 1), factory)
        self.blueprint_scorer = _mlp((hidden_size + 2 * embedding, embedding, 1), factory)
        self.choice_heads = nn.ModuleDict({
            HEADS[index]: nn.Linear(hidden_size + embedding, size, **factory)
            for index, size in enumerate(self.fixed_sizes) if index > 0 and size is not None})
        self._initialize_recurrent_weights()
        for final in (self.op_head, self.slot_scorer[-1], self.blueprint_scorer[-1], *self.choice_heads.values()):
            assert isinstance(final, nn.Linear)
            nn.init.orthogonal_(final.weight, gain=0.01)  # a near-uniform initial policy
            nn.init.zeros_(final.bias)
        for encoder in (self.slot_encoder, self.blueprint_encoder, self.slot_scorer, self.blueprint_scorer):
            for layer in list(encoder)[:-1]:
                if isinstance(layer, nn.Linear):
                    nn.init.orthogonal_(layer.weight, gain=math.sqrt(2.0))
                    nn.init.zeros_(layer.bias)

    def _trunk_input(self, observation: GrowthInputs) -> Tensor:
        if observation.globals.shape[-1] != GLOBAL_SIZE or observation.slots.shape[-1] != SLOT_SIZE:
            raise ValueError(f"growth inputs must have {GLOBAL_SIZE} global and {SLOT_SIZE} slot features, got "
                             f"{tuple(observation.globals.shape)} and {tuple(observation.slots.shape)}")
        dtype = self.value_head.weight.dtype
        encoded = self.slot_encoder(observation.slots.to(dtype))  # [..., S, E]
        valid = observation.slot_valid.unsqueeze(-1)  # [..., S, 1]
        count = valid.sum(-2).clamp(min=1)
        mean = (encoded * valid).sum(-2) / count
        maximum = encoded.masked_fill(~valid, -torch.inf).amax(-2)
        maximum = torch.where(torch.isfinite(maximum), maximum, torch.zeros_like(maximum))
        return torch.cat([observation.globals.to(dtype), mean, maximum], dim=-1)

    def _head_context(self, features: Tensor, observation: GrowthInputs) -> _Context:
        return _Context(features, self.slot_encoder(observation.slots.to(features.dtype)), observation)

    def _logits(self, head: int, context: _Context, chosen: Sequence[Tensor]) -> Tensor:
        features, slots, inputs = context
        if head == 0:
            advised = inputs.globals[..., ADVICE_OP_COLUMNS].to(features.dtype)  # [N, n_ops], raw 0/1 flags
            logits: Tensor = self.op_head(features) + self.advice_weight * advised
            return logits
        n_slots = slots.shape[1]
        if head == SLOT_HEAD:
            paired = torch.cat([features.unsqueeze(1).expand(-1, n_slots, -1), slots], dim=-1)  # [N, S, H + E]
            slot_scores: Tensor = self.slot_scorer(paired).squeeze(-1)
            return slot_scores.masked_fill(~inputs.slot_valid, MASKED_LOGIT)
        rows = torch.arange(features.shape[0], device=features.device)
        slot = slots[rows, chosen[SLOT_HEAD]]  # [N, E], the chosen slot's encoding
        if head == BLUEPRINT_HEAD:
            blueprints = inputs.blueprints[rows, chosen[SLOT_HEAD]]  # [N, K, BLUEPRINT_SIZE], in the chosen slot
            described = self.blueprint_encoder(blueprints.to(features.dtype))  # [N, K, E]
            n_blueprints = described.shape[1]
            paired = torch.cat([features, slot], dim=-1).unsqueeze(1).expand(-1, n_blueprints, -1)
            scores: Tensor = self.blueprint_scorer(torch.cat([paired, described], dim=-1)).squeeze(-1)  # [N, K]
            return scores.masked_fill(~inputs.blueprint_valid, MASKED_LOGIT)
        choice_logits: Tensor = self.choice_heads[HEADS[head]](torch.cat([features, slot], dim=-1))
        return choice_logits

    def _check_masks(self, action_masks: MaskSequence | None, observation: GrowthInputs) -> MaskSequence | None:
        if action_masks is not None:
            leading = observation.globals.shape[:-1]
            sizes = [observation.slots.shape[-2] if index == SLOT_HEAD else
                     observation.blueprint_valid.shape[-1] if index == BLUEPRINT_HEAD else size
                     for index, size in enumerate(self.fixed_sizes)]
            check_mask_shapes(action_masks, leading, int(self.head_relevance.shape[0]), sizes)  # type: ignore[arg-type]
        return action_masks
