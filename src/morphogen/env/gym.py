"""One morphogenetic episode as a Gymnasium environment, so any RL library can drive morphogen.

`MorphogenesisEnv` wraps a `MorphogenesisEpisode`: one `step` is one host epoch (act, train,
validate with counterfactuals, reward). Rules of the wrapper:

- Observation: a float32 vector, the three parts of `encode_observation` flattened one after the
  other: the global features, each slot's features, and each slot's blueprint features.
  `split_observation` undoes the concatenation and `observation_names()` names every position. The
  Box bounds are each feature's own (`observation.feature_bounds`): flags, one-hots and fractions in
  [0, 1], clipped loss ratios and magnitudes within their clips; scores, contributions and gains
  (unbounded for a task with its own metric) and parameter and epoch counts (above) are infinite.
- Action: `MultiDiscrete(ActionSpace.sizes)`, one index per head in `HEADS` order. Actions the
  masks forbid are not errors: the episode refuses them and reports why (`info["reason"]`,
  `info["action_succeeded"]`), and the reward charges the failed attempt.
- Masks: `info["action_mask"]` is the MultiDiscrete convention, one int8 array per head, where a
  choice is allowed when some currently legal op allows it (`flat_action_masks`). Heads depend on
  the op, so a sample from these masks can still pair, say, PRUNE with a slot only GERMINATE may
  use. `info["action_mask_by_op"]` has the exact op-conditioned masks of `ActionSpace.masks` (bool
  op mask [n_ops], then [n_ops, n_choices] per other head) for libraries that sample the op first.
  `train_gym` samples from `info["action_mask"]`.
- Episode end: an episode stops when its epoch budget runs out, which is a time limit, so `step`
  reports it as `truncated=True` (bootstrap from the last observation); `terminated` is always False.
- Seeding: `reset(seed=s)` runs the episode with seed `s` (host initialization and data order, as
  `MorphogenesisEpisode(seed=s)`); `reset()` draws the episode seed from `self.np_random`. The
  episode seeds every germination from (episode seed, epoch, slot), so the same seed and actions
  replay exactly and the caller's global torch RNG is never touched.
- Synchronization: exactly the episode's (three host syncs per step); the encoding is NumPy on
  numbers the episode already materialized.
- Maskable PPO: `action_masks()` returns the flat masks concatenated into one bool vector (sum of
  the head sizes), the layout sb3-contrib's `MaskablePPO` asks an env for, so it needs no
  `ActionMasker` wrapper.
- Advice: with `advisor=` (e.g. `morphogen.control.advice.HeuristicAdvisor()`), every observation carries
  what that advisor proposes for the step (the `advice` features); without one they are 0.
- Rendering: `render_mode="ansi"` makes `render()` return the epoch, accuracy, parameters and one
  line per slot (blueprint, stage, alpha) as text.
- Registration: `import morphogen` registers `ENV_ID`, so `gymnasium.make("morphogen/Morphogenesis-v0")`
  works without the module prefix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from morphogen.core.hosts import check_host_size
from morphogen.data import TASK_TOPOLOGIES, Task, host_size, load_task
from morphogen.env.actions import HEADS, ActionSpace
from morphogen.env.counterfactual import CounterfactualSchedule
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode, with_topology
from morphogen.env.observation import (
    BLUEPRINT_FEATURES,
    BLUEPRINT_SIZE,
    GLOBAL_FEATURES,
    GLOBAL_SIZE,
    SLOT_FEATURES,
    SLOT_SIZE,
    Advisor,
    EncodedObservation,
    encode_observation,
    feature_bounds,
)
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.telemetry.sinks import Telemetry

__all__ = ["ENV_ID", "MorphogenesisEnv", "flat_action_masks", "render_text"]

#: Registered Gymnasium id; `gymnasium.make("morphogen.env.gym:morphogen/Morphogenesis-v0", ...)`
#: imports this module and registers it in one go.
ENV_ID = "morphogen/Morphogenesis-v0"
#: Episode seeds feed `torch.manual_seed`, which takes unsigned 64-bit integers.
_SEED_LIMIT = 2**64


def flat_action_masks(op_conditioned: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Op-conditioned masks -> one int8 mask per head: a choice is allowed if any allowed op allows it.

    `op_conditioned` is `ActionSpace.masks` output: op mask [n_ops], then [n_ops, n_choices] per head.
    """
    op_mask = np.asarray(op_conditioned[0], dtype=bool)
    flat = [op_mask.astype(np.int8)]
    for head_mask in op_conditioned[1:]:
        allowed = np.asarray(head_mask, dtype=bool)[op_mask]  # (n_allowed_ops, n_choices)
        flat.append(allowed.any(axis=0).astype(np.int8))
    return tuple(flat)


class MorphogenesisEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """A Gymnasium env whose episodes grow a host on `task`: one step = act + one epoch of training.

    `task` is a task name (loaded here with `device`, `max_train_samples`, `data_dir`, `text_file`
    and `host`, the host size arguments to change from the task's defaults, as in a `[host]` config
    table) or an already loaded `Task`, which skips reloading the data (the loading arguments must then
    be left unset). The training subset chosen by `max_train_samples` is fixed for the env's lifetime;
    the seed of each reset picks the host initialization and data order. `telemetry` receives every
    episode's events and stays owned by the caller (`close` does not close it).

    Left out, `episode_config` measures every counterfactual every epoch, so that each observation carries the
    seeds' contributions; an `EpisodeConfig` of your own (say `EpisodeConfig(max_epochs=10)`) keeps its own
    `counterfactuals`, "for_decisions" by default, under which a seed's contribution features read unmeasured on
    most epochs: pass `counterfactuals=CounterfactualSchedule.EVERY_EPOCH` with it for what `train` observes.
    """

    # render_fps: Gymnasium's checker asks every renderable env for one; text has no clock, so one frame a step.
    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}  # noqa: RUF012 - gymnasium.Env declares it an instance variable

    def __init__(
        self,
        task: str | Task = "digits",
        *,
        episode_config: EpisodeConfig | None = None,
        slots: Sequence[str] | None = None,
        device: str | torch.device = "cpu",
        max_train_samples: int | None = None,
        data_dir: str | Path | None = None,
        text_file: str | Path | None = None,
        host: Mapping[str, int] | None = None,
        telemetry: Telemetry | None = None,
        env_id: int = 0,
        render_mode: str | None = None,
        advisor: Advisor | None = None,
    ) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"MorphogenesisEnv renders only as text (render_mode={render_mode!r}); pass "
                             "render_mode='ansi' or None, and read the episode's telemetry for more")
        self.task = _resolve_task(task, device, max_train_samples, data_dir, text_file, host)
        # An agent observes every measurement every epoch, whatever its decisions read.
        self.episode_config = episode_config or EpisodeConfig(counterfactuals=CounterfactualSchedule.EVERY_EPOCH)
        self.slots = None if slots is None else tuple(slots)
        self.telemetry = telemetry
        self.env_id = env_id
        self.render_mode = render_mode
        #: Proposes the advice each observation carries (None: no advice, its features 0).
        self.advisor = advisor
        # A throwaway model tells which slots the request resolves to (and rejects unknown ones now).
        slot_ids = self._new_episode(seed=0).build_model().slot_ids
        #: The morphogen `ActionSpace` that turns MultiDiscrete indices into `Action`s.
        self.action_codec = ActionSpace(slot_ids, self.task.topology)
        low, high = np.asarray([feature_bounds(name) for name in self._feature_of_each_position()],
                               dtype=np.float32).T
        self.observation_space = spaces.Box(low, high, dtype=np.float32)
        self.action_space = spaces.MultiDiscrete(np.asarray(self.action_codec.sizes, dtype=np.int64))
        #: The episode of the last `reset()`; None before the first.
        self.episode: MorphogenesisEpisode | None = None

    # ---------------------------------------------------------------- layout
    @property
    def slot_ids(self) -> tuple[str, ...]:
        """Slots in observation and slot-head order."""
        return self.action_codec.slot_ids

    def observation_names(self) -> list[str]:
        """The name of every observation position: global features, ``slot/<id>/<feature>``, then
        ``blueprint/<slot id>/<blueprint>/<feature>``."""
        return [*GLOBAL_FEATURES,
                *(f"slot/{slot_id}/{name}" for slot_id in self.slot_ids for name in SLOT_FEATURES),
                *(f"blueprint/{slot_id}/{blueprint}/{name}" for slot_id in self.slot_ids
                  for blueprint in self.action_codec.blueprints for name in BLUEPRINT_FEATURES)]

    def _feature_of_each_position(self) -> list[str]:
        """The `observation.py` feature name behind every observation position (`observation_names` less the
        slot and blueprint prefixes)."""
        n_slots, n_blueprints = len(self.slot_ids), len(self.action_codec.blueprints)
        return [*GLOBAL_FEATURES, *SLOT_FEATURES * n_slots, *BLUEPRINT_FEATURES * (n_slots * n_blueprints)]

    def split_observation(self, observation: np.ndarray) -> EncodedObservation:
        """Observation(s) [..., size] -> globals [..., G], slots [..., S, F] and blueprints [..., S, K, B] (float32)."""
        observation = np.asarray(observation, dtype=np.float32)
        n_slots, n_blueprints = len(self.slot_ids), len(self.action_codec.blueprints)
        slot_end = GLOBAL_SIZE + n_slots * SLOT_SIZE
        expected = slot_end + n_slots * n_blueprints * BLUEPRINT_SIZE
        if observation.ndim == 0 or observation.shape[-1] != expected:
            raise ValueError(f"observation has shape {observation.shape}; expected (..., {expected}): "
                             "pass observations of this env (or a batch stacked on leading dimensions)")
        leading = observation.shape[:-1]
        return EncodedObservation(
            globals=observation[..., :GLOBAL_SIZE],
            slots=observation[..., GLOBAL_SIZE:slot_end].reshape(*leading, n_slots, SLOT_SIZE),
            blueprints=observation[..., slot_end:].reshape(*leading, n_slots, n_blueprints, BLUEPRINT_SIZE),
        )

    # ---------------------------------------------------------------- the Gymnasium API
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new episode: seed `seed`, or one drawn from `np_random` when None."""
        if options:
            raise ValueError(f"MorphogenesisEnv.reset takes no options, got {sorted(options)}; configure "
                             "the episode through the constructor (episode_config, slots)")
        if seed is not None and not 0 <= seed < _SEED_LIMIT:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        super().reset(seed=seed)
        episode_seed = seed if seed is not None else int(self.np_random.integers(_SEED_LIMIT, dtype=np.uint64))
        self.episode = self._new_episode(episode_seed)
        snapshot = self.episode.reset()
        if self.advisor is not None:
            self.advisor.reset()
        return self._observe(snapshot), self._state_info(snapshot)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Run one epoch with `action` (one index per head); truncated=True when the episode's epochs run out."""
        episode = self.episode
        if episode is None:
            raise RuntimeError("call reset() before step()")
        decoded = self.action_codec.decode(self._checked_indices(action))
        if self.advisor is not None:
            self.advisor.taken(decoded)
        result = episode.step(decoded)
        info = {
            **self._state_info(result.snapshot),
            "action": decoded.describe(),
            "action_succeeded": result.action_succeeded,
            "reason": result.reason,
            "reward_components": dict(result.reward.components),
        }
        return self._observe(result.snapshot), float(result.reward.total), False, result.done, info

    def action_masks(self) -> np.ndarray:
        """The flat masks of `info["action_mask"]` concatenated: bool [sum of head sizes] (for MaskablePPO)."""
        if self.episode is None:
            raise RuntimeError("call reset() before action_masks()")
        flat = flat_action_masks(tuple(self.episode.masks()))
        return np.concatenate(flat).astype(bool)

    def render(self) -> str | None:
        """With `render_mode="ansi"`: the episode's state as text (see `render_text`); else None."""
        if self.render_mode != "ansi":
            return None
        if self.episode is None:
            raise RuntimeError("call reset() before render()")
        return render_text(self.episode.snapshot)

    def close(self) -> None:
        """Drop the current episode's model; the telemetry hub belongs to the caller and stays open."""
        self.episode = None

    # ---------------------------------------------------------------- internals
    def _new_episode(self, seed: int) -> MorphogenesisEpisode:
        episode = MorphogenesisEpisode(self.task, self.episode_config, seed=seed, slots=self.slots,
                                       telemetry=self.telemetry, env_id=self.env_id)
        episode.growth_candidates = episode.every_blueprint  # the observation carries every blueprint's signal
        return episode

    def _checked_indices(self, action: np.ndarray) -> list[int]:
        indices = np.asarray(action)
        sizes = np.asarray(self.action_codec.sizes)
        if indices.shape != sizes.shape or not np.issubdtype(indices.dtype, np.integer):
            raise ValueError(f"action must be {len(sizes)} integers, one per head {HEADS}; got {action!r}")
        if np.any(indices < 0) or np.any(indices >= sizes):
            raise ValueError(f"action {indices.tolist()} is outside the head sizes {sizes.tolist()}; "
                             "each index must be in 0..size-1")
        return [int(index) for index in indices]

    def _observe(self, snapshot: EpisodeSnapshot) -> np.ndarray:
        assert self.episode is not None
        advice = None if self.advisor is None else \
            self.advisor.advise(snapshot, self.episode.masks(), self.action_codec)
        parts = encode_observation(snapshot, advice)
        return np.concatenate([part.reshape(-1) for part in parts]).astype(np.float32)

    def _state_info(self, snapshot: EpisodeSnapshot) -> dict[str, Any]:
        assert self.episode is not None
        by_op = tuple(self.episode.masks())
        return {
            "action_mask": flat_action_masks(by_op),
            "action_mask_by_op": by_op,
            "epoch": snapshot.epoch,
            "val_accuracy": snapshot.val_accuracy,
            "parameters": snapshot.active_parameters,
            "rolled_back": snapshot.rolled_back,
        }


def render_text(snapshot: EpisodeSnapshot) -> str:
    """Epoch, accuracy and size, then one line per slot: id, blueprint (or "-"), stage and alpha."""
    lines = [f"epoch {snapshot.epoch}/{snapshot.max_epochs}  val acc {snapshot.val_accuracy:.2f}%  "
             f"params {snapshot.active_parameters:,}"]
    for slot in snapshot.slots:
        blueprint = "-" if slot.blueprint is None else slot.blueprint
        lines.append(f"  {slot.slot_id:<6}{blueprint:<12}{slot.stage.value:<11}alpha {slot.alpha:.2f}")
    return "\n".join(lines) + "\n"


def _resolve_task(task: str | Task, device: str | torch.device, max_train_samples: int | None,
                  data_dir: str | Path | None, text_file: str | Path | None,
                  host: Mapping[str, int] | None) -> Task:
    """Load a named task, or check that a loaded one is compatible with the other arguments."""
    if isinstance(task, str):
        if host:
            # Judge the size with the host's own constructor (HostSizeError) before any data is loaded.
            size = host_size(task, host)  # an unknown task or key, a non-integer: DataError
            check_host_size(TASK_TOPOLOGIES[task], size)
        return load_task(task, device=device, data_dir=data_dir, text_file=text_file,
                         max_train_samples=max_train_samples, host=host)
    if not isinstance(task, Task):
        raise TypeError(f"task must be a task name or a morphogen.data.Task, got {type(task).__name__}")
    loading = {"max_train_samples": max_train_samples, "data_dir": data_dir, "text_file": text_file, "host": host}
    passed = sorted(name for name, value in loading.items() if value is not None)
    if passed:
        raise ValueError(f"{', '.join(passed)} configure loading, but task is already loaded; pass them to "
                         "load_task, or pass the task's name instead of the Task")
    requested, actual = torch.device(device), task.train.device
    if requested.type != actual.type or (requested.index is not None and requested.index != actual.index):
        raise ValueError(f"device={str(requested)!r} but the task's data is on {actual}; pass device={str(actual)!r} "
                         "or load the task on the device you want")
    return with_topology(task)


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="morphogen.env.gym:MorphogenesisEnv")
