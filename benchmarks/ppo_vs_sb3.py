"""morphogen's PPO agent (`train_gym`) side by side with Stable-Baselines3's PPO on a classic-control task.

Both learn `--env` (default Acrobot-v1, which no test of ours uses) for `--steps` environment steps per
seed, one after the other in this process with one torch thread, on the same seeds. SB3 runs with the
settings rl-baselines3-zoo tuned for the env (`ZOO`: its `hyperparams/ppo.yml`, normalized observations
and rewards included); ours twice (`OURS`: the zoo's envs, rollout, gamma and GAE lambda, no entropy
bonus): with a feed-forward policy as the zoo's (`recurrent=False`, its epochs and minibatch size: the same
network, so the difference is the PPO implementation), and with the LSTM policy morphogen's controller
uses (truncated BPTT over 32-step sequences). `--ours KEY=VALUE ...` runs one agent of ours with those
`train_gym` arguments and `PPOConfig` keys instead.

Printed per agent: the mean return of the episodes that ended in the last 10% of the steps (where the
agent got to), the mean return of all episodes (how fast it got there: the area under the learning curve
over the episodes), and wall seconds; then each of ours minus SB3's and the wall-time ratio ours / SB3
(all ran one after the other under the same load). Run `python benchmarks/ppo_vs_sb3.py --help`; needs the
dev extras (sb3-contrib pulls stable-baselines3).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from arguments import BenchmarkParser, count, run_script
from morphogen.control.gym_training import train_gym
from morphogen.control.ppo import PPOConfig
from morphogen.paired_statistics import format_mean_std

#: rl-baselines3-zoo's tuned PPO settings (hyperparams/ppo.yml) for the envs this benchmark knows.
ZOO: dict[str, dict[str, Any]] = {
    "Acrobot-v1": {"normalize": True, "n_envs": 16, "n_steps": 256, "gae_lambda": 0.94, "gamma": 0.99,
                   "n_epochs": 4, "ent_coef": 0.0},
}
#: Our agents' settings per env (`train_gym` arguments and `PPOConfig` keys), tuned like the zoo's: the zoo's
#: envs, rollout length, gamma and GAE lambda, no entropy bonus, gradients clipped to 0.5, Adam 3e-4, no KL early
#: stop. The feed-forward policy (two tanh layers of 64, as the zoo's) takes the zoo's 4 epochs of 64-sample
#: minibatches (steps drawn one by one: 1-step sequences); the LSTM policy cuts rollouts into 32-step sequences
#: (truncated BPTT), 16 minibatches, 10 epochs.
OURS: dict[str, dict[str, list[str]]] = {
    "Acrobot-v1": {
        "ours, feed-forward": ["recurrent=0", "n_envs=16", "rollout_length=256", "bptt_length=1", "gamma=0.99",
                               "gae_lambda=0.94",
                               "entropy_coef=0.0", "max_grad_norm=0.5", "learning_rate=0.0003", "minibatches=64",
                               "epochs=4", "target_kl=None"],
        "ours, LSTM": ["n_envs=16", "rollout_length=256", "bptt_length=32", "gamma=0.99", "gae_lambda=0.94",
                       "entropy_coef=0.0", "max_grad_norm=0.5", "learning_rate=0.0003", "minibatches=16", "epochs=10",
                       "target_kl=None"],
    },
}
#: `--ours` keys that are `train_gym` arguments; the others are `PPOConfig` keys.
TRAIN_GYM_ARGUMENTS = ("n_envs", "rollout_length", "hidden_size", "bptt_length", "recurrent")
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
    """`KEY=VALUE` pairs: `n_envs`, `rollout_length`, `hidden_size`, `bptt_length`, `recurrent` (0 or 1) for
    `train_gym`, the rest `PPOConfig` keys. A pair that is neither, or not a number, is a `ValueError` naming it."""
    options: dict[str, Any] = {}
    config: dict[str, Any] = {}
    keys = (*TRAIN_GYM_ARGUMENTS, *(field.name for field in dataclasses.fields(PPOConfig)))
    for pair in pairs:
        key, _, text = pair.partition("=")
        if key not in keys:
            raise ValueError(f"{pair!r}: {key!r} is not a key; valid: {', '.join(keys)}")
        try:
            value: Any = None if text == "None" else float(text) if "." in text or "e" in text else int(text)
        except ValueError:
            raise ValueError(f"{pair!r}: {text!r} is not a number (nor None)") from None
        if key == "recurrent":
            value = bool(value)
        (options if key in TRAIN_GYM_ARGUMENTS else config)[key] = value
    if config:
        options["config"] = PPOConfig(**config)
    return options


def main() -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Acrobot-v1", choices=list(ZOO))
    parser.add_argument("--steps", type=count, default=150_000)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--ours", nargs="*", default=None, metavar="KEY=VALUE",
                        help="train_gym arguments or PPOConfig keys for one agent of ours (default: OURS's agents)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: {args.seeds!r} is not comma-separated whole numbers")
    agents = OURS[args.env] if args.ours is None else {"ours": args.ours}
    try:
        options = {name: _parse_ours(pairs) for name, pairs in agents.items()}
    except ValueError as error:
        parser.error(f"--ours: {error}")
    runs: dict[str, list[Result]] = {name: [] for name in (*options, "SB3 zoo")}
    for seed in seeds:
        runs["SB3 zoo"].append(run_sb3(args.env, args.steps, seed))
        for name, settings in options.items():
            runs[name].append(run_ours(args.env, args.steps, seed, settings))
        print(f"seed {seed}: " + " | ".join(f"{name} final {results[-1].final(args.steps):8.2f} all "
                                           f"{results[-1].overall:8.2f} {results[-1].seconds:6.1f}s"
                                           for name, results in runs.items()), flush=True)

    def summary(values: list[float]) -> str:
        return format_mean_std(values, "8.2f", "6.2f")

    print(f"\n{args.env}, {args.steps:,} steps, seeds {args.seeds} (mean ± std over seeds; one torch thread)")
    print(f"{'agent':<20}{'final return':>20}{'all episodes':>20}{'wall s':>18}")
    for name, results in runs.items():
        print(f"{name:<20}{summary([r.final(args.steps) for r in results]):>20}"
              f"{summary([r.overall for r in results]):>20}{summary([r.seconds for r in results]):>18}")
    sb3 = runs["SB3 zoo"]
    for name in options:
        ours = runs[name]
        leads = [a.final(args.steps) - b.final(args.steps) for a, b in zip(ours, sb3, strict=True)]
        overall = [a.overall - b.overall for a, b in zip(ours, sb3, strict=True)]
        ratios = [a.seconds / b.seconds for a, b in zip(ours, sb3, strict=True)]
        print(f"{name} - SB3: final {summary(leads)}, all episodes {summary(overall)}; "
              f"wall time {name} / SB3 {statistics.fmean(ratios):.2f}x")


if __name__ == "__main__":
    run_script(main)
