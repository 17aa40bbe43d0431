"""morphogen's PPO agent (`train_gym`) side by side with Stable-Baselines3's PPO on a classic-control task.

Both learn `--env` (default Acrobot-v1, which no test of ours uses) for `--steps` environment steps per
seed, one after the other in this process with one torch thread, on the same seeds. SB3 runs with the
settings rl-baselines3-zoo tuned for the env (`ZOO`: its `hyperparams/ppo.yml`, normalized observations
and rewards included); ours with the settings tuned here for it (`OURS`: the zoo's envs, rollout, gamma
and GAE lambda, no entropy bonus; truncated BPTT over 32-step sequences), or the `train_gym` arguments and
`PPOConfig` keys given as `--ours KEY=VALUE`.

Printed per agent: the mean return of the episodes that ended in the last 10% of the steps (where the
agent got to), the mean return of all episodes (how fast it got there: the area under the learning curve
over the episodes), and wall seconds; then ours minus SB3's and the wall-time ratio ours / SB3 (both ran
under the same load). Run `python benchmarks/ppo_vs_sb3.py --help`; needs the dev extras (sb3-contrib
pulls stable-baselines3).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from morphogen.control.gym_training import train_gym
from morphogen.control.ppo import PPOConfig

#: rl-baselines3-zoo's tuned PPO settings (hyperparams/ppo.yml) for the envs this benchmark knows.
ZOO: dict[str, dict[str, Any]] = {
    "Acrobot-v1": {"normalize": True, "n_envs": 16, "n_steps": 256, "gae_lambda": 0.94, "gamma": 0.99,
                   "n_epochs": 4, "ent_coef": 0.0},
}
#: Our agent's settings per env (`train_gym` arguments and `PPOConfig` keys), tuned like the zoo's: the zoo's
#: envs, rollout length, gamma and GAE lambda, no entropy bonus, gradients clipped to 0.5; rollouts cut into
#: 32-step sequences (truncated BPTT), 16 minibatches of them, 10 epochs at Adam 3e-4, no KL early stop.
OURS: dict[str, list[str]] = {
    "Acrobot-v1": ["n_envs=16", "rollout_length=256", "bptt_length=32", "gamma=0.99", "gae_lambda=0.94",
                   "entropy_coef=0.0", "max_grad_norm=0.5", "learning_rate=0.0003", "minibatches=16", "epochs=10",
                   "target_kl=None"],
}
#: The last share of the steps whose episodes make the "final" return.
FINAL_SHARE = 0.1


@dataclass(frozen=True)
class Result:
    """One agent's run: the return of each finished episode, the step it ended at, and the wall time."""

    returns: list[float]
    end_steps: list[int]
    seconds: float

    def final(self, steps: int) -> float:
        """Mean return of the episodes that ended in the last `FINAL_SHARE` of the steps."""
        last = [r for r, step in zip(self.returns, self.end_steps, strict=True) if step > (1 - FINAL_SHARE) * steps]
        return float(np.mean(last)) if last else float("nan")

    @property
    def overall(self) -> float:
        return float(np.mean(self.returns))


def run_sb3(env_id: str, steps: int, seed: int) -> Result:
    """SB3 PPO with the zoo's settings; episode returns from its Monitor wrappers."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    settings = dict(ZOO[env_id])
    normalize, n_envs = settings.pop("normalize"), settings.pop("n_envs")
    returns: list[float] = []
    end_steps: list[int] = []

    class Episodes(BaseCallback):  # type: ignore[misc]
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    returns.append(float(info["episode"]["r"]))
                    end_steps.append(self.num_timesteps)
            return True

    started = time.perf_counter()
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if normalize:
        env = VecNormalize(env)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **settings)
    model.learn(total_timesteps=steps, callback=Episodes())
    return Result(returns, end_steps, time.perf_counter() - started)


def run_ours(env_id: str, steps: int, seed: int, options: dict[str, Any]) -> Result:
    """`train_gym` with `options` (its keyword arguments and a `config`); episode end steps from its episode lengths."""
    started = time.perf_counter()
    result = train_gym(env_id, total_steps=steps, seed=seed, progress=False, **options)
    seconds = time.perf_counter() - started
    returns = result.returns
    end_steps = result.end_steps
    return Result(returns, end_steps, seconds)


def _parse_ours(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` pairs: `n_envs`, `rollout_length`, `hidden_size`, `bptt_length` for `train_gym`, the rest
    `PPOConfig` keys."""
    options: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for pair in pairs:
        key, _, text = pair.partition("=")
        value: Any = None if text == "None" else float(text) if "." in text or "e" in text else int(text)
        (options if key in ("n_envs", "rollout_length", "hidden_size", "bptt_length") else config)[key] = value
    if config:
        options["config"] = PPOConfig(**config)
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Acrobot-v1", choices=list(ZOO))
    parser.add_argument("--steps", type=int, default=150_000)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--ours", nargs="*", default=None, metavar="KEY=VALUE",
                        help="train_gym arguments or PPOConfig keys for our agent (default: OURS for the env)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    options = _parse_ours(OURS[args.env] if args.ours is None else args.ours)
    rows = []
    for seed in seeds:
        sb3 = run_sb3(args.env, args.steps, seed)
        ours = run_ours(args.env, args.steps, seed, options)
        rows.append((seed, ours, sb3))
        print(f"seed {seed}: ours final {ours.final(args.steps):8.2f} all {ours.overall:8.2f} {ours.seconds:6.1f}s"
              f" | SB3 final {sb3.final(args.steps):8.2f} all {sb3.overall:8.2f} {sb3.seconds:6.1f}s", flush=True)

    def summary(values: list[float]) -> str:
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.fmean(values):8.2f} ± {spread:6.2f}"

    print(f"\n{args.env}, {args.steps:,} steps, seeds {args.seeds} (mean ± std over seeds; one torch thread)")
    print(f"{'agent':<8}{'final return':>20}{'all episodes':>20}{'wall s':>18}")
    for name, index in (("ours", 1), ("SB3 zoo", 2)):
        results = [row[index] for row in rows]
        print(f"{name:<8}{summary([r.final(args.steps) for r in results]):>20}"
              f"{summary([r.overall for r in results]):>20}{summary([r.seconds for r in results]):>18}")
    leads = [ours.final(args.steps) - sb3.final(args.steps) for _, ours, sb3 in rows]
    overall = [ours.overall - sb3.overall for _, ours, sb3 in rows]
    ratios = [ours.seconds / sb3.seconds for _, ours, sb3 in rows]
    print(f"ours - SB3: final {summary(leads)}, all episodes {summary(overall)}; "
          f"wall time ours / SB3 {statistics.fmean(ratios):.2f}x")


if __name__ == "__main__":
    main()
