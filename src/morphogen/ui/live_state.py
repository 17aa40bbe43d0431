"""What the dashboard shows, folded from a run's events one at a time (no widgets here, so it is testable).

`RunView.apply(timed_event)` updates the view and returns the event-log line of that event, if it
deserves one. The view knows the run's shape from its `config.json`: a `train` run has `rounds`,
`n_envs` and `episode.max_epochs`; a `run` has one env and `episode.max_epochs`. Speed and ETA count
env-steps (one env finishing one epoch) between the first and the last event seen.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from morphogen.limits import MAX_ENVS, MAX_EPOCHS, MAX_ROUNDS
from morphogen.telemetry.events import (
    ALL_ENVS,
    ActionTaken,
    AnomalyDetected,
    EpisodeCompleted,
    EpochCompleted,
    Event,
    GovernorRollback,
    ImitationCompleted,
    PPOUpdateCompleted,
    RewardComputed,
    RoundCompleted,
    SlotState,
    StageTransition,
    TelemetryLevelChanged,
)
from morphogen.ui.run_files import (
    IMITATION_ROUND,
    ScoreKind,
    TimedEvent,
    config_value,
    score_name,
    task_label,
)
from morphogen.ui.terminal_text import printable

LOG_LINES = 1000
"""Event-log lines kept in memory (older ones scroll away)."""


def _count(value: object) -> int | None:
    """`value` if it is a count a run could have (config.json is untrusted), else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= max(MAX_EPOCHS, MAX_ENVS, MAX_ROUNDS) else None


def round_tag(round_number: int) -> str:
    """A round as the alerts strip tags it: "r3", or "imit" for the imitation warm start's episodes."""
    return "imit" if round_number == IMITATION_ROUND else f"r{round_number}"


@dataclass
class EnvView:
    """One env as its latest epoch left it."""

    env_id: int
    round: int = 1
    epoch: int = 0
    val_accuracy: float | None = None
    param_count: int | None = None
    slots: tuple[SlotState, ...] = ()
    action: str = ""
    action_succeeded: bool = True
    episodes_completed: int = 0
    last_reward: dict[str, float] = field(default_factory=dict)
    last_return: float | None = None


@dataclass(frozen=True)
class Alert:
    """An anomaly or a rollback, where and when it happened."""

    round: int
    epoch: int
    where: str
    kind: str
    message: str


@dataclass
class RunView:
    """The dashboard's model of a run: header numbers, envs, policy health, rewards, alerts, log."""

    task: str = "?"
    training: bool = False
    #: A `run` the heuristic played (config.json names no policy): it computes the reward but never reads it.
    heuristic: bool = False
    #: A `train` run whose envs each had a no-growth twin (config.json's `paired_baseline`): its rounds' returns
    #: are net of the twins' rewards, the reward components and the episodes' returns are the envs' own.
    paired_baseline: bool = False
    #: What `val_accuracy` and the final scores are (config.json's `task_metric`; accuracy where it says none).
    score: ScoreKind = field(default_factory=ScoreKind)
    rounds_total: int | None = None
    #: Rounds of heuristic episodes a `train` run watches before PPO (config.json's `imitation.rounds`).
    imitation_rounds: int = 0
    #: Until its `ImitationCompleted` (or a round's end) arrives, a run with imitation rounds is watching them.
    imitating: bool = False
    n_envs: int = 1
    episode_length: int | None = None
    envs: dict[int, EnvView] = field(default_factory=dict)
    rounds_completed: int = 0
    first_time: float | None = None
    last_time: float | None = None
    env_steps: int = 0
    ppo: PPOUpdateCompleted | None = None
    round_rewards: dict[str, float] = field(default_factory=dict)
    """Reward components summed over the current round's epochs and envs (the episode's, in a run)."""
    previous_round_rewards: dict[str, float] = field(default_factory=dict)
    """`round_rewards` of the last completed round."""
    alerts: list[Alert] = field(default_factory=list)
    telemetry_level: str | None = None
    log: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    finished: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RunView:
        """An empty view shaped by a run's `config.json` (a `train` run has `rounds`)."""
        training = "rounds" in config
        task = task_label(config)
        imitation_rounds = (_count(config_value(config, "imitation.rounds")) or 0) if training else 0
        return cls(
            task=printable(task) if task is not None else "?",
            training=training,
            heuristic=not training and "episodes" not in config and "policy" in config and config["policy"] is None,
            paired_baseline=training and config.get("paired_baseline") is True,
            rounds_total=_count(config.get("rounds")) if training else None,
            imitation_rounds=imitation_rounds,
            imitating=imitation_rounds > 0,
            n_envs=(_count(config.get("n_envs")) or 1) if training else 1,
            episode_length=_count(config_value(config, "episode.max_epochs")),
            score=ScoreKind(printable(score_name(config.get("task_metric")))),
        )

    # ---------------------------------------------------------------- derived numbers
    @property
    def round(self) -> int:
        """The round in progress (1-based; `IMITATION_ROUND` while the imitation warm start's episodes play); the
        last one once the run finished."""
        if self.imitating:
            return IMITATION_ROUND
        if self.rounds_total is not None and self.rounds_completed >= self.rounds_total:
            return self.rounds_total
        return self.rounds_completed + 1

    @property
    def elapsed(self) -> float | None:
        """Seconds between the first and the last event seen (0 before two); None where the file's times say no
        span a clock could show (they go backwards, or span past the float range: an edited or hostile file)."""
        if self.first_time is None or self.last_time is None:
            return 0.0
        span = self.last_time - self.first_time
        return span if 0 <= span < math.inf else None

    @property
    def env_steps_per_second(self) -> float | None:
        """Env-steps per second between the first and the last event; None until there is a positive speed."""
        elapsed = self.elapsed
        if elapsed is None or elapsed <= 0 or self.env_steps <= 1:
            return None
        speed = self.env_steps / elapsed
        return speed if speed > 0 else None  # a span near the float range's end leaves no speed to divide by

    @property
    def total_env_steps(self) -> int | None:
        """Env-steps of the whole run, when its config says ((imitation + PPO rounds) x envs x epochs, or the
        episode's epochs)."""
        if self.episode_length is None:
            return None
        if self.training:
            if self.rounds_total is None:
                return None
            return (self.rounds_total + self.imitation_rounds) * self.n_envs * self.episode_length
        return self.episode_length

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the speed so far; None while unknown, 0 once finished."""
        if self.finished:
            return 0.0
        speed, total = self.env_steps_per_second, self.total_env_steps
        if speed is None or total is None:
            return None
        seconds = max(total - self.env_steps, 0) / speed
        return seconds if math.isfinite(seconds) else None

    def slot_ids(self) -> list[str]:
        """Every slot id seen, in the order the envs report them."""
        seen: dict[str, None] = {}
        for env in self.envs.values():
            for slot in env.slots:
                seen.setdefault(slot.slot)
        return list(seen)

    # ---------------------------------------------------------------- folding events
    def _env(self, env_id: int) -> EnvView:
        if env_id not in self.envs:
            self.envs[env_id] = EnvView(env_id, round=self.round)
        return self.envs[env_id]

    def _where(self, env_id: int, epoch: int) -> str:
        """Where an event happened, for the log, in words: round, epoch and env (trainer events have no env epoch).
        The log has the width the alerts' strip lacks, so it spells out what the strip tags `r3 e7`."""
        round_name = "imitation" if self.round == IMITATION_ROUND else f"round {self.round}"
        if env_id == ALL_ENVS:
            return f"{round_name} trainer" if self.training else "trainer"
        return f"{round_name} epoch {epoch} env {env_id}" if self.training else f"epoch {epoch} env {env_id}"

    def apply(self, timed: TimedEvent) -> str | None:
        """Fold one event into the view; returns its event-log line (None for events not logged)."""
        event = timed.event
        self.first_time = timed.time if self.first_time is None else self.first_time
        self.last_time = timed.time
        line = self._fold(event, self._where(event.env_id, event.epoch))
        if line is not None:
            self.log.append(line)
        return line

    def _fold(self, event: Event, where: str) -> str | None:
        if isinstance(event, EpochCompleted | RewardComputed | EpisodeCompleted):
            return self._fold_env_event(event, where)
        if isinstance(event, AnomalyDetected | GovernorRollback):
            return self._alert(event, where)
        if isinstance(event, PPOUpdateCompleted):
            self.ppo = event
            return None
        if isinstance(event, ImitationCompleted):
            self.imitating = False
            return (f"{where}: imitation done ({event.episodes} episodes), agreement with the heuristic "
                    f"{100 * event.agreement:.1f}%")
        if isinstance(event, RoundCompleted):
            return self._round_completed(event, where)
        if isinstance(event, TelemetryLevelChanged):
            self.telemetry_level = event.to_level
            return f"{where}: telemetry {event.from_level} -> {event.to_level} ({event.reason})"
        if isinstance(event, ActionTaken) and event.op != "WAIT":
            # A taken action's reason says why after a colon, as the report gives it; without one it only repeats it.
            outcome = (f" refused: {event.reason}" if not event.succeeded
                       else f" ({event.reason})" if ": " in event.reason else "")
            target = " ".join(part for part in (event.slot, event.blueprint) if part)
            return f"{where}: {event.op} {target}{outcome}"
        if isinstance(event, StageTransition):
            return f"{where}: {event.slot} {event.blueprint} {event.from_stage} -> {event.to_stage} ({event.reason})"
        return None

    def _fold_env_event(self, event: EpochCompleted | RewardComputed | EpisodeCompleted, where: str) -> str | None:
        env = self._env(event.env_id)
        if isinstance(event, EpochCompleted):
            env.round, env.epoch, env.val_accuracy = self.round, event.epoch, event.val_accuracy
            env.param_count, env.slots = event.param_count, event.slots
            env.action, env.action_succeeded = event.action, event.action_succeeded
            self.env_steps += 1
            return None
        if isinstance(event, RewardComputed):
            env.last_reward = dict(event.components)
            for name, value in event.components:
                self.round_rewards[name] = self.round_rewards.get(name, 0.0) + value
            return None
        env.episodes_completed += 1
        env.last_return = event.episode_return
        self.finished = self.finished or not self.training
        steered = "" if self.heuristic else f", return {event.episode_return:+.3f}"  # the heuristic reads none
        return (f"{where}: episode done, {self.score.label} {self.score.format(event.final_accuracy)}, "
                f"{event.fossilized} fossilized, {event.pruned} pruned{steered}")

    def _alert(self, event: AnomalyDetected | GovernorRollback, where: str) -> str:
        env = "trainer" if event.env_id == ALL_ENVS else f"env {event.env_id}"
        if isinstance(event, AnomalyDetected):
            alert = Alert(self.round, event.epoch, env, event.anomaly, f"{event.message}; {event.advice}")
        else:
            alert = Alert(self.round, event.epoch, env, "rollback", event.reason)
        self.alerts.append(alert)
        return f"{where}: {alert.kind.upper()}: {alert.message}"

    def _round_completed(self, event: RoundCompleted, where: str) -> str:
        self.imitating = False  # a resumed run's events may start after its imitation: a round ends it too
        self.rounds_completed = event.round
        self.previous_round_rewards, self.round_rewards = self.round_rewards, {}
        if self.rounds_total is not None and event.round >= self.rounds_total:
            self.finished = True
        net = " over the no-growth twins" if self.paired_baseline else ""
        return (f"{where}: round {event.round} done, return{net} {event.mean_return:+.3f}, "
                f"{self.score.label} {self.score.format(event.mean_final_accuracy)}, {event.seconds:.1f} s")
