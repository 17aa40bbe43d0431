"""Factored-action LSTM actor-critic: the learned growth controller, usable on any discrete-action task.

Architecture (docs/architecture.md#controller): a 4-dim embedding of each slot's blueprint id, concatenated to the
observation -> trunk (Linear + LayerNorm + ReLU) -> one-layer LSTM -> LayerNorm(LSTM output + trunk
output) -> one linear head per action factor, and a value head V(s) that does not depend on the op.

Rules:

- Head 0 is the op. ``head_relevance[op, head]`` says whether a head matters for an op. A head that
  does not matter is forced to its canonical value 0 and contributes neither log-prob nor entropy,
  so PPO never credits or blames a factor the environment ignored.
- Masks say what is physically legal. Logits are masked in fp32 with ``MASKED_LOGIT`` (-1e4) rather
  than -inf: softmax gives illegal values probability exactly 0 (they are never sampled), while
  log-probs and entropies stay finite (no ``0 * inf = NaN``).
- The caller guarantees that for every legal op, each head that matters has at least one legal
  value; the op mask is where that is enforced (an op whose heads have no legal value is masked).
  A head that does not matter may have an all-False mask row: it is forced to 0 anyway.
- Recurrent state is a tuple ``(h, c)``, each ``[1, B, hidden]`` as ``nn.LSTM`` expects. Where
  ``episode_starts`` is True the state is zeroed before that observation is processed, in ``act``
  and ``evaluate_sequence`` alike, so re-evaluating a rollout reproduces the log-probs of acting.
- Host syncs: ``act`` and ``predict_value`` make none. ``forward`` over T > 1 steps with episode
  starts makes one (to find the time steps where some episode starts; the LSTM then runs as one
  call over each span between them).
- Compiled (``compile_forward``, ``--compile``): ``forward`` runs under ``torch.compile`` as one graph
  (no graph break; ``nn.LSTM`` is traced with dynamo's ``allow_rnn``), and then runs the LSTM one
  step at a time with resets, making no host sync. It specializes on T and on whether episode
  starts or grad are given. The heads stay eager: sampling draws from a ``torch.Generator``, which
  dynamo cannot put in a graph.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from morphogen.core.compilation import CompileSettings, compiled

__all__ = [
    "MASKED_LOGIT",
    "ActionOutput",
    "EvaluateOutput",
    "FactoredLSTMPolicy",
    "LSTMState",
    "masked_logits",
]

MASKED_LOGIT = -1e4
"""Logit of an illegal action: its probability underflows to exactly 0 in fp32, yet stays finite."""

LSTMState = tuple[Tensor, Tensor]
"""``(h, c)``, each ``[1, B, hidden]``."""

MaskSequence = Sequence[Tensor | None]


class ActionOutput(NamedTuple):
    """What the policy did at one step for a batch of B envs."""

    actions: Tensor
    """[B, H] long; heads that do not matter for the chosen op hold 0."""
    log_prob: Tensor
    """[B] fp32, the sum of ``log_prob_per_head``: log-prob of the joint action."""
    value: Tensor
    """[B] fp32, V(s)."""
    entropy_per_head: Tensor
    """[B, H] fp32, entropy of each head's masked distribution; 0 where the head does not matter."""
    log_prob_per_head: Tensor
    """[B, H] fp32; 0 where the head does not matter. PPO clips the ratio of each head."""
    state: LSTMState
    """The recurrent state after this step."""


class EvaluateOutput(NamedTuple):
    """The current policy's view of a stored sequence of T steps of B envs."""

    log_prob: Tensor
    """[T, B] fp32, sum over the heads that matter."""
    value: Tensor
    """[T, B] fp32."""
    entropy_per_head: Tensor
    """[T, B, H] fp32; 0 where the head does not matter."""
    log_prob_per_head: Tensor
    """[T, B, H] fp32; 0 where the head does not matter."""


class _HeadOutput(NamedTuple):
    actions: Tensor  # [N, H] long
    log_prob_per_head: Tensor  # [N, H]
    entropy_per_head: Tensor  # [N, H]


def masked_logits(logits: Tensor, mask: Tensor | None) -> Tensor:
    """``logits`` in fp32 with entries where ``mask`` is False set to ``MASKED_LOGIT``."""
    logits = logits.float()
    if mask is None:
        return logits
    return logits.masked_fill(~mask, MASKED_LOGIT)


def _log_prob_and_entropy(logits: Tensor, choice: Tensor) -> tuple[Tensor, Tensor]:
    """Log-prob of ``choice [N]`` and entropy, both [N], of the categoricals with ``logits [N, n]``."""
    log_probs = torch.log_softmax(logits, dim=-1)  # [N, n]
    chosen = log_probs.gather(-1, choice.unsqueeze(-1)).squeeze(-1)
    # Masked entries have probability exactly 0 and a finite log-prob, so they add exactly 0.
    entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
    return chosen, entropy


def _choose(logits: Tensor, deterministic: bool, generator: torch.Generator | None) -> Tensor:
    """The most likely value, or one sampled from ``softmax(logits)``, per row of ``logits [N, n]``."""
    if deterministic:
        return logits.argmax(dim=-1)
    probabilities = torch.softmax(logits, dim=-1)
    return torch.multinomial(probabilities, 1, generator=generator).squeeze(-1)


class FactoredLSTMPolicy(nn.Module):
    """LSTM actor-critic over a factored discrete action ``(op, factor_1, ..., factor_{H-1})``.

    ``action_sizes[0]`` is the number of ops. ``head_relevance`` (bool ``[n_ops, n_heads]``,
    column 0 all True) says which heads matter for each op; None means all heads always matter
    (a plain MultiDiscrete). With ``n_slots > 0`` every call takes ``blueprint_ids [..., n_slots]``
    (long, 0 = no blueprint, 1..n_blueprints = a blueprint), embedded and appended to the features.
    """

    head_relevance: Tensor

    def __init__(
        self,
        observation_size: int,
        action_sizes: Sequence[int],
        *,
        hidden_size: int = 512,
        n_slots: int = 0,
        n_blueprints: int = 0,
        blueprint_embedding_size: int = 4,
        head_relevance: Tensor | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        sizes = tuple(int(size) for size in action_sizes)
        _validate_sizes(observation_size, sizes, hidden_size, n_slots, n_blueprints, blueprint_embedding_size)
        self.observation_size = observation_size
        self.action_sizes = sizes
        self.hidden_size = hidden_size
        self.n_slots = n_slots
        factory: dict[str, Any] = {"device": device, "dtype": dtype}

        self.blueprint_embedding: nn.Embedding | None = None
        if n_slots > 0:
            # Row 0 ("no blueprint") is a fixed zero vector.
            self.blueprint_embedding = nn.Embedding(
                n_blueprints + 1, blueprint_embedding_size, padding_idx=0, **factory
            )
        input_size = observation_size + n_slots * blueprint_embedding_size
        self.trunk = nn.Sequential(
            nn.Linear(input_size, hidden_size, **factory),
            nn.LayerNorm(hidden_size, **factory),
            nn.ReLU(),
        )
        self.lstm = nn.LSTM(hidden_size, hidden_size, **factory)
        self.lstm_norm = nn.LayerNorm(hidden_size, **factory)
        self.action_heads = nn.ModuleList(nn.Linear(hidden_size, size, **factory) for size in sizes)
        self.value_head = nn.Linear(hidden_size, 1, **factory)
        self.register_buffer("head_relevance", _relevance_table(head_relevance, sizes, device))
        self._initialize_weights()
        self._compile_settings: CompileSettings | None = None

    @property
    def n_heads(self) -> int:
        """Number of action factors, the op included."""
        return len(self.action_sizes)

    def _initialize_weights(self) -> None:
        """Orthogonal init: gain sqrt(2) in the ReLU trunk, 1 in the LSTM, 0.01 on the policy heads
        (near-uniform initial policy) and 1 on the value head; all biases zero."""
        for module in self.trunk:
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight, gain=math.sqrt(2.0))
                nn.init.zeros_(module.bias)
        for name, parameter in self.lstm.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(parameter, gain=1.0)
            else:
                nn.init.zeros_(parameter)
        for head in self.action_heads:
            assert isinstance(head, nn.Linear)
            nn.init.orthogonal_(head.weight, gain=0.01)
            nn.init.zeros_(head.bias)
        nn.init.orthogonal_(self.value_head.weight, gain=1.0)
        nn.init.zeros_(self.value_head.bias)

    def initial_state(self, batch_size: int) -> LSTMState:
        """A zero recurrent state for ``batch_size`` envs, on the policy's device and dtype."""
        weight = self.value_head.weight
        shape = (1, batch_size, self.hidden_size)
        return (
            torch.zeros(shape, device=weight.device, dtype=weight.dtype),
            torch.zeros(shape, device=weight.device, dtype=weight.dtype),
        )

    def relevant_heads(self, ops: Tensor) -> Tensor:
        """Bool ``[..., H]``: which heads matter for each op in ``ops [...]``."""
        return self.head_relevance[ops]

    def forward(
        self,
        observation: Tensor,
        state: LSTMState,
        episode_starts: Tensor | None = None,
        blueprint_ids: Tensor | None = None,
    ) -> tuple[Tensor, LSTMState]:
        """Encode ``observation [T, B, obs]`` into features ``[T, B, hidden]``; also return the final state.

        ``episode_starts [T, B]`` (bool) zeroes the state of an env before the step where it is True.
        After ``compile_forward`` this runs compiled (``morphogen.core.compilation``).
        """
        if self._compile_settings is None:
            return self._encode(observation, state, episode_starts, blueprint_ids, False)
        function = compiled(FactoredLSTMPolicy._encode, self._compile_settings, observation.device)
        features, next_state = function(self, observation, state, episode_starts, blueprint_ids, True)
        return features, next_state

    def compile_forward(self, settings: CompileSettings | None) -> None:
        """Run ``forward`` compiled with ``settings`` from now on (None: eagerly again); nothing compiles here."""
        self._compile_settings = settings

    def _encode(
        self,
        observation: Tensor,
        state: LSTMState,
        episode_starts: Tensor | None,
        blueprint_ids: Tensor | None,
        step_by_step: bool,
    ) -> tuple[Tensor, LSTMState]:
        """``forward``; ``step_by_step`` runs the LSTM one step at a time instead of once per span between
        episode starts, which needs no host sync to find the spans (what a compiled graph needs)."""
        trunk_output = self.trunk(self._inputs(observation, blueprint_ids))  # [T, B, hidden]
        if episode_starts is None:
            lstm_output, state = self.lstm(trunk_output, state)
        else:
            lstm_output, state = self._run_lstm_with_resets(trunk_output, state, episode_starts, step_by_step)
        features = self.lstm_norm(lstm_output + trunk_output)  # [T, B, hidden]
        return features, state

    def act(
        self,
        observation: Tensor,
        state: LSTMState,
        action_masks: MaskSequence | None = None,
        blueprint_ids: Tensor | None = None,
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        episode_starts: Tensor | None = None,
    ) -> ActionOutput:
        """Choose actions for ``observation [B, obs]``: sampled, or the most likely if ``deterministic``.

        ``action_masks`` holds one entry per head (None = all legal): head 0 ``[B, n_ops]``, other
        heads ``[B, n_i]`` or op-conditioned ``[B, n_ops, n_i]`` (the row of the chosen op is used).
        ``episode_starts [B]`` zeroes the state of envs whose episode starts with this observation.
        """
        with torch.no_grad():
            features, next_state = self.forward(
                observation.unsqueeze(0),
                state,
                None if episode_starts is None else episode_starts.unsqueeze(0),
                None if blueprint_ids is None else blueprint_ids.unsqueeze(0),
            )
            features = features.squeeze(0)  # [B, hidden]
            masks = self._check_masks(action_masks, observation.shape[:1])
            heads = self._run_heads(features, masks, None, deterministic, generator)
            value = self.value_head(features).squeeze(-1).float()  # [B]
        return ActionOutput(
            actions=heads.actions,
            log_prob=heads.log_prob_per_head.sum(dim=-1),
            value=value,
            entropy_per_head=heads.entropy_per_head,
            log_prob_per_head=heads.log_prob_per_head,
            state=next_state,
        )

    def predict_value(
        self,
        observation: Tensor,
        state: LSTMState,
        blueprint_ids: Tensor | None = None,
        *,
        episode_starts: Tensor | None = None,
    ) -> Tensor:
        """V(s) ``[B]`` of ``observation [B, obs]`` seen after ``state``, e.g. to bootstrap a truncation."""
        with torch.no_grad():
            features, _ = self.forward(
                observation.unsqueeze(0),
                state,
                None if episode_starts is None else episode_starts.unsqueeze(0),
                None if blueprint_ids is None else blueprint_ids.unsqueeze(0),
            )
            value: Tensor = self.value_head(features.squeeze(0)).squeeze(-1).float()
        return value

    def evaluate_sequence(
        self,
        observation: Tensor,
        initial_state: LSTMState,
        episode_starts: Tensor,
        actions: Tensor,
        action_masks: MaskSequence | None = None,
        blueprint_ids: Tensor | None = None,
    ) -> EvaluateOutput:
        """Log-probs, values and entropies of stored ``actions [T, B, H]``, with gradients (for PPO).

        The LSTM re-runs over ``observation [T, B, obs]`` from ``initial_state`` (the state before
        step 0), zeroing the state where ``episode_starts [T, B]`` is True. Masks are as in ``act``
        with a leading T dimension; the op of each stored action selects op-conditioned mask rows.
        """
        steps, batch = observation.shape[:2]
        if tuple(actions.shape) != (steps, batch, self.n_heads):
            raise ValueError(
                f"actions must have shape [T, B, n_heads] = [{steps}, {batch}, {self.n_heads}], "
                f"got {tuple(actions.shape)}"
            )
        if tuple(episode_starts.shape) != (steps, batch):
            raise ValueError(
                f"episode_starts must have shape [T, B] = [{steps}, {batch}], got {tuple(episode_starts.shape)}"
            )
        features, _ = self.forward(observation, initial_state, episode_starts, blueprint_ids)
        masks = self._check_masks(action_masks, (steps, batch))
        flat_masks = None
        if masks is not None:
            # [T, B, ...] -> [T*B, ...]
            flat_masks = [None if mask is None else mask.flatten(0, 1) for mask in masks]
        heads = self._run_heads(features.flatten(0, 1), flat_masks, actions.flatten(0, 1), False, None)  # each [T*B, H]
        log_prob_per_head = heads.log_prob_per_head.reshape(steps, batch, -1)  # [T, B, H]
        return EvaluateOutput(
            log_prob=log_prob_per_head.sum(dim=-1),
            value=self.value_head(features).squeeze(-1).float(),
            entropy_per_head=heads.entropy_per_head.reshape(steps, batch, -1),
            log_prob_per_head=log_prob_per_head,
        )

    def _inputs(self, observation: Tensor, blueprint_ids: Tensor | None) -> Tensor:
        """Observation ``[..., obs]`` with the blueprint embeddings appended, in the parameters' dtype."""
        if observation.shape[-1] != self.observation_size:
            raise ValueError(
                f"observation must have observation_size={self.observation_size} features in its last "
                f"dimension, got shape {tuple(observation.shape)}"
            )
        observation = observation.to(self.value_head.weight.dtype)
        if self.blueprint_embedding is None:
            if blueprint_ids is not None:
                raise ValueError("blueprint_ids were given but the policy was built with n_slots=0")
            return observation
        if blueprint_ids is None or tuple(blueprint_ids.shape) != (*observation.shape[:-1], self.n_slots):
            got = None if blueprint_ids is None else tuple(blueprint_ids.shape)
            raise ValueError(
                f"the policy was built with n_slots={self.n_slots}: pass blueprint_ids of shape "
                f"{(*observation.shape[:-1], self.n_slots)} (long, 0 = no blueprint), got {got}"
            )
        embedded = self.blueprint_embedding(blueprint_ids).flatten(-2)  # [..., n_slots * embedding]
        return torch.cat([observation, embedded], dim=-1)

    def _run_lstm_with_resets(
        self, trunk_output: Tensor, state: LSTMState, episode_starts: Tensor, step_by_step: bool = False
    ) -> tuple[Tensor, LSTMState]:
        """Run the LSTM over ``trunk_output [T, B, hidden]``, zeroing the state where an episode starts."""
        steps = trunk_output.shape[0]
        boundaries = [0, steps]
        if step_by_step:
            boundaries = list(range(steps + 1))  # every step a span: no sync, T LSTM calls
        elif steps > 1:
            # Host sync (one per call): the steps where some env starts an episode split the
            # sequence into spans, each run as a single nn.LSTM call.
            later_starts = episode_starts[1:].any(dim=1).nonzero().squeeze(-1) + 1
            boundaries = [0, *later_starts.tolist(), steps]
        hidden, cell = state
        outputs = []
        for begin, end in itertools.pairwise(boundaries):
            reset = episode_starts[begin].view(1, -1, 1)  # [1, B, 1]
            hidden = hidden.masked_fill(reset, 0.0)
            cell = cell.masked_fill(reset, 0.0)
            output, (hidden, cell) = self.lstm(trunk_output[begin:end], (hidden, cell))
            outputs.append(output)
        return torch.cat(outputs), (hidden, cell)

    def _check_masks(self, action_masks: MaskSequence | None, leading: Sequence[int]) -> MaskSequence | None:
        """Raise ValueError unless ``action_masks`` has one well-shaped bool entry (or None) per head."""
        if action_masks is None:
            return None
        if len(action_masks) != self.n_heads:
            raise ValueError(f"action_masks must have one entry per head ({self.n_heads}), got {len(action_masks)}")
        leading = tuple(leading)
        n_ops = self.action_sizes[0]
        for index, (mask, size) in enumerate(zip(action_masks, self.action_sizes, strict=True)):
            if mask is None:
                continue
            accepted = [(*leading, size)] if index == 0 else [(*leading, size), (*leading, n_ops, size)]
            if tuple(mask.shape) not in accepted or mask.dtype != torch.bool:
                raise ValueError(
                    f"action_masks[{index}] must be a bool tensor of shape "
                    f"{' or '.join(map(str, accepted))}, got {mask.dtype} {tuple(mask.shape)}"
                )
        return action_masks

    def _run_heads(
        self,
        features: Tensor,
        masks: MaskSequence | None,
        actions: Tensor | None,
        deterministic: bool,
        generator: torch.Generator | None,
    ) -> _HeadOutput:
        """Choose (``actions`` None) or score (``actions [N, H]``) each head from ``features [N, hidden]``."""
        n_rows = features.shape[0]
        op_logits = masked_logits(self.action_heads[0](features), None if masks is None else masks[0])
        op = _choose(op_logits, deterministic, generator) if actions is None else actions[:, 0]
        relevant = self.head_relevance[op]  # [N, H]
        chosen, log_probs, entropies = [op], [], []
        op_log_prob, op_entropy = _log_prob_and_entropy(op_logits, op)
        log_probs.append(op_log_prob)
        entropies.append(op_entropy)
        for index in range(1, self.n_heads):
            mask = None if masks is None else masks[index]
            if mask is not None and mask.dim() == 3:
                mask = mask[torch.arange(n_rows, device=mask.device), op]  # [N, n_ops, n_i] -> [N, n_i]
            logits = masked_logits(self.action_heads[index](features), mask)
            if actions is None:
                choice = torch.where(relevant[:, index], _choose(logits, deterministic, generator), 0)
            else:
                choice = actions[:, index]
            log_prob, entropy = _log_prob_and_entropy(logits, choice)
            chosen.append(choice)
            log_probs.append(log_prob)
            entropies.append(entropy)
        return _HeadOutput(
            actions=torch.stack(chosen, dim=-1),
            log_prob_per_head=torch.where(relevant, torch.stack(log_probs, dim=-1), 0.0),
            entropy_per_head=torch.where(relevant, torch.stack(entropies, dim=-1), 0.0),
        )


def _validate_sizes(
    observation_size: int,
    action_sizes: tuple[int, ...],
    hidden_size: int,
    n_slots: int,
    n_blueprints: int,
    blueprint_embedding_size: int,
) -> None:
    """Raise ValueError naming the argument if a size is out of range."""
    if observation_size < 1:
        raise ValueError(f"observation_size must be >= 1, got {observation_size}")
    if not action_sizes or any(size < 1 for size in action_sizes):
        raise ValueError(f"action_sizes must be a non-empty sequence of sizes >= 1, got {action_sizes}")
    if hidden_size < 1:
        raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
    if n_slots < 0 or n_blueprints < 0:
        raise ValueError(f"n_slots and n_blueprints must be >= 0, got {n_slots} and {n_blueprints}")
    if (n_slots == 0) != (n_blueprints == 0):
        raise ValueError(
            f"n_slots={n_slots} and n_blueprints={n_blueprints}: blueprint embeddings need both "
            "(slots to embed and blueprints to embed them with); pass both > 0 or both 0"
        )
    if blueprint_embedding_size < 1:
        raise ValueError(f"blueprint_embedding_size must be >= 1, got {blueprint_embedding_size}")


def _relevance_table(
    head_relevance: Tensor | None, action_sizes: tuple[int, ...], device: torch.device | str | None
) -> Tensor:
    """The validated bool ``[n_ops, n_heads]`` table; all True when ``head_relevance`` is None."""
    shape = (action_sizes[0], len(action_sizes))
    if head_relevance is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    if head_relevance.dtype != torch.bool or tuple(head_relevance.shape) != shape:
        raise ValueError(
            f"head_relevance must be a bool tensor of shape [n_ops, n_heads] = {list(shape)}, "
            f"got {head_relevance.dtype} {tuple(head_relevance.shape)}"
        )
    if not bool(head_relevance[:, 0].all()):
        raise ValueError("head_relevance[:, 0] must be all True: the op head matters for every op")
    return head_relevance.clone().to(device)
