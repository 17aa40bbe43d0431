"""Recurrent actor-critics over factored discrete actions: the learned growth controller and its generic kin.

`RecurrentActorCritic` (docs/architecture.md#controller) holds what every such policy shares: a trunk
from the observation to a feature vector, a one-layer LSTM, ``LayerNorm(LSTM output + trunk output)``,
one categorical head per action factor and a value head V(s) that does not depend on the op. Subclasses
say how an observation enters the trunk and how each head's logits are computed:

- `FactoredLSTMPolicy`: a flat observation vector and one linear head per factor (any Gymnasium
  MultiDiscrete task; `train_gym`).
- `GrowthPolicy` (`control/growth_policy.py`): morphogen's controller, whose inputs and outputs do not
  depend on the task, the host or its number of slots.

Rules:

- Head 0 is the op. ``head_relevance[op, head]`` says whether a head matters for an op. A head that
  does not matter is forced to its canonical value 0 and contributes neither log-prob nor entropy,
  so PPO never credits or blames a factor the environment ignored.
- Heads are chosen in order, and a head's logits may depend on the choices of the heads before it
  (the growth policy scores blueprints for the slot just chosen).
- Masks say what is physically legal. Logits are masked in fp32 with ``MASKED_LOGIT`` (-1e4) rather
  than -inf: softmax gives illegal values probability exactly 0 (they are never sampled), while
  log-probs and entropies stay finite (no ``0 * inf = NaN``).
- The caller guarantees that for every legal op, each head that matters has at least one legal
  value; the op mask is where that is enforced (an op whose heads have no legal value is masked).
  A head that does not matter may have an all-False mask row: it is forced to 0 anyway.
- A policy built with ``recurrent=False`` has no LSTM (a two-layer tanh trunk makes the features) and
  passes the state through unchanged, so rollouts and updates treat both kinds alike.
- Recurrent state is a tuple ``(h, c)``, each ``[1, B, hidden]`` as ``nn.LSTM`` expects. Where
  ``episode_starts`` is True the state is zeroed before that observation is processed, in ``act``
  and ``evaluate_sequence`` alike, so re-evaluating a rollout reproduces the log-probs of acting.
- Observations are a tensor ``[..., features]`` or a NamedTuple of tensors sharing their leading
  dimensions (``Observation``); ``map_observation`` applies a function to every tensor of one.
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

import abc
import itertools
import math
from collections.abc import Callable, Sequence
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
    "Observation",
    "RecurrentActorCritic",
    "map_observation",
    "masked_logits",
]

MASKED_LOGIT = -1e4
"""Logit of an illegal action: its probability underflows to exactly 0 in fp32, yet stays finite."""

LSTMState = tuple[Tensor, Tensor]
"""``(h, c)``, each ``[1, B, hidden]``."""

Observation = Any
"""A tensor ``[..., features]``, or a NamedTuple of tensors with the same leading dimensions."""

MaskSequence = Sequence[Tensor | None]


def map_observation(observation: Observation, function: Callable[[Tensor], Tensor]) -> Observation:
    """`function` applied to the tensor, or to every tensor of a NamedTuple observation (same type back)."""
    if isinstance(observation, Tensor):
        return function(observation)
    return type(observation)(*(function(tensor) for tensor in observation))


def leading_tensor(observation: Observation) -> Tensor:
    """The tensor whose leading dimensions are the observation's (the first of a NamedTuple)."""
    return observation if isinstance(observation, Tensor) else observation[0]


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


class RecurrentActorCritic(nn.Module, abc.ABC):
    """Trunk -> LSTM -> factored heads and a value head; subclasses define the trunk's input and the logits.

    ``n_heads`` heads, head 0 the op with ``n_ops`` values. ``head_relevance`` (bool ``[n_ops, n_heads]``,
    column 0 all True) says which heads matter for each op; None means all heads always matter.
    """

    head_relevance: Tensor

    def __init__(self, trunk_input_size: int, n_ops: int, n_heads: int, *, hidden_size: int,
                 head_relevance: Tensor | None, device: torch.device | str | None,
                 dtype: torch.dtype | None, recurrent: bool = True) -> None:
        super().__init__()
        if trunk_input_size < 1 or n_ops < 1 or n_heads < 1 or hidden_size < 1:
            raise ValueError(f"sizes must be >= 1: trunk input {trunk_input_size}, ops {n_ops}, heads {n_heads}, "
                             f"hidden_size {hidden_size}")
        self.hidden_size = hidden_size
        self.n_heads = n_heads
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.lstm: nn.LSTM | None = None
        self.lstm_norm: nn.Module = nn.Identity()
        if recurrent:
            self.trunk = nn.Sequential(nn.Linear(trunk_input_size, hidden_size, **factory),
                                       nn.LayerNorm(hidden_size, **factory), nn.ReLU())
            self.lstm = nn.LSTM(hidden_size, hidden_size, **factory)
            self.lstm_norm = nn.LayerNorm(hidden_size, **factory)
        else:
            # Two tanh layers, as the classic-control baselines use: on Acrobot the recurrent trunk above often
            # never found the goal (benchmarks/ppo_vs_sb3.py), where this one did on every seed.
            self.trunk = nn.Sequential(nn.Linear(trunk_input_size, hidden_size, **factory), nn.Tanh(),
                                       nn.Linear(hidden_size, hidden_size, **factory), nn.Tanh())
        self.value_head = nn.Linear(hidden_size, 1, **factory)
        self.register_buffer("head_relevance", _relevance_table(head_relevance, n_ops, n_heads, device))
        self._compile_settings: CompileSettings | None = None

    # ---------------------------------------------------------------- what subclasses define
    @abc.abstractmethod
    def _trunk_input(self, observation: Observation) -> Tensor:
        """The trunk's input ``[..., trunk_input_size]`` for an observation with leading dimensions ``[...]``."""

    def _head_context(self, features: Tensor, observation: Observation) -> Any:
        """What the heads read, computed once per call from ``features [N, hidden]`` and the observation
        (leading ``[N]``); by default the features alone."""
        return features

    @abc.abstractmethod
    def _logits(self, head: int, context: Any, chosen: Sequence[Tensor]) -> Tensor:
        """Unmasked logits ``[N, n]`` of `head` from the `_head_context` and the values ``chosen`` for the heads
        before it (each ``[N]`` long)."""

    @abc.abstractmethod
    def _check_masks(self, action_masks: MaskSequence | None, observation: Observation) -> MaskSequence | None:
        """Raise ValueError unless ``action_masks`` has one well-shaped bool entry (or None) per head."""

    # ---------------------------------------------------------------- shared machinery
    def _initialize_recurrent_weights(self) -> None:
        """Orthogonal init: gain sqrt(2) in the trunk, 1 in the LSTM and on the value head; biases zero."""
        for module in self.trunk:
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight, gain=math.sqrt(2.0))
                nn.init.zeros_(module.bias)
        for name, parameter in () if self.lstm is None else self.lstm.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(parameter, gain=1.0)
            else:
                nn.init.zeros_(parameter)
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

    def forward(self, observation: Observation, state: LSTMState,
                episode_starts: Tensor | None = None) -> tuple[Tensor, LSTMState]:
        """Encode ``observation`` (leading ``[T, B]``) into features ``[T, B, hidden]``; also return the final state.

        ``episode_starts [T, B]`` (bool) zeroes the state of an env before the step where it is True.
        After ``compile_forward`` this runs compiled (``morphogen.core.compilation``).
        """
        if self._compile_settings is None:
            return self._encode(observation, state, episode_starts, False)
        function = compiled(RecurrentActorCritic._encode, self._compile_settings, self.value_head.weight.device)
        features, next_state = function(self, observation, state, episode_starts, True)
        return features, next_state

    def compile_forward(self, settings: CompileSettings | None) -> None:
        """Run ``forward`` compiled with ``settings`` from now on (None: eagerly again); nothing compiles here."""
        self._compile_settings = settings

    def _encode(self, observation: Observation, state: LSTMState, episode_starts: Tensor | None,
                step_by_step: bool) -> tuple[Tensor, LSTMState]:
        """``forward``; ``step_by_step`` runs the LSTM one step at a time instead of once per span between
        episode starts, which needs no host sync to find the spans (what a compiled graph needs)."""
        trunk_output = self.trunk(self._trunk_input(observation))  # [T, B, hidden]
        if self.lstm is None:  # feed-forward: the features are the trunk's, the state passes through unchanged
            return trunk_output, state
        shapes = (state[0].shape, state[1].shape)
        if episode_starts is None:
            lstm_output, state = self.lstm(trunk_output, state)
        else:
            lstm_output, state = self._run_lstm_with_resets(trunk_output, state, episode_starts, step_by_step)
        # Compiled on CUDA (torch 2.11 on an H100), the traced nn.LSTM returned its state as [1, 1, B, hidden]
        # instead of [1, B, hidden], which the next step's LSTM call refuses; a view back costs nothing.
        state = (state[0].reshape(shapes[0]), state[1].reshape(shapes[1]))
        features = self.lstm_norm(lstm_output + trunk_output)  # [T, B, hidden]
        return features, state

    def act(self, observation: Observation, state: LSTMState, action_masks: MaskSequence | None = None, *,
            deterministic: bool = False, generator: torch.Generator | None = None,
            episode_starts: Tensor | None = None) -> ActionOutput:
        """Choose actions for ``observation`` (leading ``[B]``): sampled, or the most likely if ``deterministic``.

        ``action_masks`` holds one entry per head (None = all legal): head 0 ``[B, n_ops]``, other
        heads ``[B, n_i]`` or op-conditioned ``[B, n_ops, n_i]`` (the row of the chosen op is used).
        ``episode_starts [B]`` zeroes the state of envs whose episode starts with this observation.
        """
        with torch.no_grad():
            features, next_state = self.forward(
                map_observation(observation, lambda tensor: tensor.unsqueeze(0)), state,
                None if episode_starts is None else episode_starts.unsqueeze(0))
            features = features.squeeze(0)  # [B, hidden]
            masks = self._check_masks(action_masks, observation)
            heads = self._run_heads(features, observation, masks, None, deterministic, generator)
            value = self.value_head(features).squeeze(-1).float()  # [B]
        return ActionOutput(
            actions=heads.actions,
            log_prob=heads.log_prob_per_head.sum(dim=-1),
            value=value,
            entropy_per_head=heads.entropy_per_head,
            log_prob_per_head=heads.log_prob_per_head,
            state=next_state,
        )

    def predict_value(self, observation: Observation, state: LSTMState, *,
                      episode_starts: Tensor | None = None) -> Tensor:
        """V(s) ``[B]`` of ``observation`` (leading ``[B]``) seen after ``state``, e.g. to bootstrap a truncation."""
        with torch.no_grad():
            features, _ = self.forward(
                map_observation(observation, lambda tensor: tensor.unsqueeze(0)), state,
                None if episode_starts is None else episode_starts.unsqueeze(0))
            value: Tensor = self.value_head(features.squeeze(0)).squeeze(-1).float()
        return value

    def evaluate_sequence(self, observation: Observation, initial_state: LSTMState, episode_starts: Tensor,
                          actions: Tensor, action_masks: MaskSequence | None = None) -> EvaluateOutput:
        """Log-probs, values and entropies of stored ``actions [T, B, H]``, with gradients (for PPO).

        The LSTM re-runs over ``observation`` (leading ``[T, B]``) from ``initial_state`` (the state before
        step 0), zeroing the state where ``episode_starts [T, B]`` is True. Masks are as in ``act``
        with a leading T dimension; the op of each stored action selects op-conditioned mask rows.
        """
        steps, batch = leading_tensor(observation).shape[:2]
        if tuple(actions.shape) != (steps, batch, self.n_heads):
            raise ValueError(
                f"actions must have shape [T, B, n_heads] = [{steps}, {batch}, {self.n_heads}], "
                f"got {tuple(actions.shape)}"
            )
        if tuple(episode_starts.shape) != (steps, batch):
            raise ValueError(
                f"episode_starts must have shape [T, B] = [{steps}, {batch}], got {tuple(episode_starts.shape)}"
            )
        features, _ = self.forward(observation, initial_state, episode_starts)
        masks = self._check_masks(action_masks, observation)
        flat_masks = None
        if masks is not None:
            flat_masks = [None if mask is None else mask.flatten(0, 1) for mask in masks]  # [T, B, ...] -> [T*B, ...]
        flat_observation = map_observation(observation, lambda tensor: tensor.flatten(0, 1))
        heads = self._run_heads(features.flatten(0, 1), flat_observation, flat_masks, actions.flatten(0, 1), False,
                                None)  # each [T*B, H]
        log_prob_per_head = heads.log_prob_per_head.reshape(steps, batch, -1)  # [T, B, H]
        return EvaluateOutput(
            log_prob=log_prob_per_head.sum(dim=-1),
            value=self.value_head(features).squeeze(-1).float(),
            entropy_per_head=heads.entropy_per_head.reshape(steps, batch, -1),
            log_prob_per_head=log_prob_per_head,
        )

    def _run_lstm_with_resets(self, trunk_output: Tensor, state: LSTMState, episode_starts: Tensor,
                              step_by_step: bool = False) -> tuple[Tensor, LSTMState]:
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
        assert self.lstm is not None, "a recurrent policy"
        for begin, end in itertools.pairwise(boundaries):
            reset = episode_starts[begin].view(1, -1, 1)  # [1, B, 1]
            hidden = hidden.masked_fill(reset, 0.0)
            cell = cell.masked_fill(reset, 0.0)
            output, (hidden, cell) = self.lstm(trunk_output[begin:end], (hidden, cell))
            outputs.append(output)
        return torch.cat(outputs), (hidden, cell)

    def _run_heads(self, features: Tensor, observation: Observation, masks: MaskSequence | None,
                   actions: Tensor | None, deterministic: bool, generator: torch.Generator | None) -> _HeadOutput:
        """Choose (``actions`` None) or score (``actions [N, H]``) each head in order from ``features [N, hidden]``."""
        n_rows = features.shape[0]
        rows = torch.arange(n_rows, device=features.device)
        context = self._head_context(features, observation)
        op_logits = masked_logits(self._logits(0, context, ()), None if masks is None else masks[0])
        op = _choose(op_logits, deterministic, generator) if actions is None else actions[:, 0]
        relevant = self.head_relevance[op]  # [N, H]
        chosen, log_probs, entropies = [op], [], []
        op_log_prob, op_entropy = _log_prob_and_entropy(op_logits, op)
        log_probs.append(op_log_prob)
        entropies.append(op_entropy)
        for index in range(1, self.n_heads):
            mask = None if masks is None else masks[index]
            if mask is not None and mask.dim() == 3:
                mask = mask[rows, op]  # [N, n_ops, n_i] -> [N, n_i]
            logits = masked_logits(self._logits(index, context, chosen), mask)
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


def check_mask_shapes(action_masks: MaskSequence, leading: Sequence[int], n_ops: int,
                      sizes: Sequence[int]) -> None:
    """Raise ValueError unless every mask is bool ``[*leading, n_i]`` (op: only that) or ``[*leading, n_ops, n_i]``."""
    if len(action_masks) != len(sizes):
        raise ValueError(f"action_masks must have one entry per head ({len(sizes)}), got {len(action_masks)}")
    leading = tuple(leading)
    for index, (mask, size) in enumerate(zip(action_masks, sizes, strict=True)):
        if mask is None:
            continue
        accepted = [(*leading, size)] if index == 0 else [(*leading, size), (*leading, n_ops, size)]
        if tuple(mask.shape) not in accepted or mask.dtype != torch.bool:
            raise ValueError(
                f"action_masks[{index}] must be a bool tensor of shape "
                f"{' or '.join(map(str, accepted))}, got {mask.dtype} {tuple(mask.shape)}"
            )


class FactoredLSTMPolicy(RecurrentActorCritic):
    """LSTM actor-critic over a flat observation and a factored discrete action ``(op, factor_1, ...)``.

    ``action_sizes[0]`` is the number of ops; each head is one linear layer of the features. Used by
    `train_gym` for any Gymnasium task with a Box observation and a (Multi)Discrete action. With
    ``recurrent=False`` it has no LSTM: two tanh layers make the features and the state passes through
    unchanged (for tasks whose observation says all there is to know, such as classic control).
    """

    def __init__(
        self,
        observation_size: int,
        action_sizes: Sequence[int],
        *,
        hidden_size: int = 512,
        head_relevance: Tensor | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        recurrent: bool = True,
    ) -> None:
        sizes = tuple(int(size) for size in action_sizes)
        if observation_size < 1:
            raise ValueError(f"observation_size must be >= 1, got {observation_size}")
        if not sizes or any(size < 1 for size in sizes):
            raise ValueError(f"action_sizes must be a non-empty sequence of sizes >= 1, got {sizes}")
        if hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
        super().__init__(observation_size, sizes[0], len(sizes), hidden_size=hidden_size,
                         head_relevance=head_relevance, device=device, dtype=dtype, recurrent=recurrent)
        self.observation_size = observation_size
        self.action_sizes = sizes
        self.action_heads = nn.ModuleList(nn.Linear(hidden_size, size, device=device, dtype=dtype) for size in sizes)
        self._initialize_recurrent_weights()
        for head in self.action_heads:  # near-uniform initial policy
            assert isinstance(head, nn.Linear)
            nn.init.orthogonal_(head.weight, gain=0.01)
            nn.init.zeros_(head.bias)

    def _trunk_input(self, observation: Tensor) -> Tensor:
        if observation.shape[-1] != self.observation_size:
            raise ValueError(
                f"observation must have observation_size={self.observation_size} features in its last "
                f"dimension, got shape {tuple(observation.shape)}"
            )
        return observation.to(self.value_head.weight.dtype)

    def _logits(self, head: int, context: Tensor, chosen: Sequence[Tensor]) -> Tensor:
        logits: Tensor = self.action_heads[head](context)
        return logits

    def _check_masks(self, action_masks: MaskSequence | None, observation: Observation) -> MaskSequence | None:
        if action_masks is not None:
            check_mask_shapes(action_masks, leading_tensor(observation).shape[:-1], self.action_sizes[0],
                              self.action_sizes)
        return action_masks


def _relevance_table(head_relevance: Tensor | None, n_ops: int, n_heads: int,
                     device: torch.device | str | None) -> Tensor:
    """The validated bool ``[n_ops, n_heads]`` table; all True when ``head_relevance`` is None."""
    shape = (n_ops, n_heads)
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
