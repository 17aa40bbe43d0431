"""How much room does the heuristic leave? Scripted growth plans against it, paired by seed, on one setting.

A learned controller can beat the heuristic only where some other sequence of decisions ends better. This plays,
on the same fresh seeds, the heuristic and a set of alternatives (`PLANS`): the heuristic with other thresholds,
and fixed schedules (germinate this blueprint in this slot at this epoch) whose seeds the heuristic then cares
for as it does its own (advance, blend, judge, prune). Episodes are played as `benchmarks/transfer.py` plays
them: the shipped policy's training episode settings (strict gates, 30 epochs), so the heuristic's figures are
those of its table. Per plan it prints the final accuracy and parameters added (mean ± std), training FLOPs,
and the difference from the heuristic paired by seed (mean ± standard error, seeds ahead and behind); then the
mean over seeds of the best plan's lead on each seed, an upper bound of what choosing among these plans seed by
seed could gain (biased upwards: the maximum of noisy outcomes).

    python benchmarks/growth_plans.py --setting mnist1d --seeds 16 --jobs 2
    python benchmarks/growth_plans.py --setting digits --plans heuristic,lean --seeds 8
    python benchmarks/growth_plans.py --setting mnist1d-2x4 --plans "heuristic,judged by accuracy" --seeds 30
    python benchmarks/growth_plans.py --setting digits --plans heuristic,lean --seeds 2 --epochs 3  # a quick check

Besides the named plans, `--plans` takes single germinations written `BLUEPRINT SLOT @EPOCH`, and `--sweep 4,8`
plays every one of them the setting's action space allows (each blueprint in each slot at each of those epochs):
choose among them on a few seeds, then confirm the best on fresh ones, since the best of many plans on few seeds
is the maximum of noisy outcomes:

    python benchmarks/growth_plans.py --setting digits --sweep 4,8 --seeds 3 --seed 5000 --top 5
    python benchmarks/growth_plans.py --setting digits --plans "conv_wide r0c0 @4" --seeds 20 --seed 3000
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arguments import BenchmarkParser, count, output_file, run_script, whole_numbers
from morphogen.commands.evaluate import EVALUATION_STREAM, EvalConfig, evaluation_setting, read_policy_run
from morphogen.control.heuristic import HeuristicConfig, HeuristicController
from morphogen.core.lifecycle import Criterion
from morphogen.data.tasks import Task
from morphogen.env.actions import Action, Op
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.play import run_episode
from morphogen.env.seeding import derive_seed
from morphogen.env.snapshot import EpisodeSnapshot
from morphogen.paired_statistics import format_mean_error, format_mean_std
from morphogen.session import load_session_task
from transfer import SETTINGS as TRANSFER_SETTINGS
from transfer import Setting, with_gates

#: The settings of benchmarks/transfer.py that need no data directory (all but `digits32`), and mnist1d from 2x4.
SETTINGS = {name: setting for name, setting in TRANSFER_SETTINGS.items() if setting.task != "cifar10"}
SETTINGS["mnist1d-2x4"] = Setting("mnist1d", {"base_channels": 4}, held_out=True)


@dataclass(frozen=True)
class Plan:
    """The heuristic with `heuristic` thresholds; with a `schedule` of (epoch, slot, blueprint) it germinates
    those seeds (each at the first epoch from then on that the masks allow it) and none of its own."""

    description: str
    heuristic: dict[str, Any] = field(default_factory=dict)
    schedule: tuple[tuple[int, str, str], ...] = ()
    gates: dict[str, Any] = field(default_factory=dict)
    """`GateConfig` fields changed from the setting's gates."""


PLANS = {
    "heuristic": Plan("the heuristic (first seed by a third of the episode, chosen by growth signal per FLOP)"),
    "first by 0.15": Plan("the heuristic, first seed by 0.15 of the episode", {"first_growth_by": 0.15}),
    "first by 0.5": Plan("the heuristic, first seed by half the episode", {"first_growth_by": 0.5}),
    "lean": Plan("the heuristic widening by half (the grow_lean preset)", {"widening": "wider_half"}),
    "judged by accuracy": Plan("the heuristic with the gates judging accuracy points, not validation loss",
                               gates={"criterion": Criterion.SCORE}),
    "judged by relative loss": Plan("the heuristic with the gates judging the share of the validation loss a seed "
                                    "removes (a task with its own loss)", gates={"criterion": Criterion.RELATIVE_LOSS}),
    "wider r0c0 @5": Plan("wider in r0c0 at epoch 5", schedule=((5, "r0c0", "wider"),)),
    "wider r0c1 @5": Plan("wider in r0c1 at epoch 5", schedule=((5, "r0c1", "wider"),)),
    "conv_heavy r0c0 @10": Plan("conv_heavy in r0c0 at epoch 10", schedule=((10, "r0c0", "conv_heavy"),)),
    "wider r0c0 @3 + r0c1 @12": Plan("wider in r0c0 at epoch 3, in r0c1 at 12",
                                    schedule=((3, "r0c0", "wider"), (12, "r0c1", "wider"))),
    "wider r0c0 @5 + conv_light r0c1 @14": Plan("wider in r0c0 at epoch 5, conv_light in r0c1 at 14",
                                               schedule=((5, "r0c0", "wider"), (14, "r0c1", "conv_light"))),
}


#: A single germination named in `--plans`: blueprint, slot, epoch.
_SINGLE = re.compile(r"^(\S+) (\S+) @(\d+)$")


def plan_named(name: str) -> Plan:
    """A plan of `PLANS`, or the single germination `BLUEPRINT SLOT @EPOCH`; KeyError for any other name."""
    single = _SINGLE.match(name)
    if name in PLANS or single is None:
        return PLANS[name]
    blueprint, slot, epoch = single.groups()
    return Plan(f"{blueprint} in {slot} at epoch {epoch}", schedule=((int(epoch), slot, blueprint),))


def sweep(setting: str, epochs: Sequence[int]) -> list[str]:
    """Every single germination of `setting`'s action space at each of `epochs`, as `--plans` names it."""
    task, episode_config = _setting(setting)
    episode = MorphogenesisEpisode(task, episode_config, seed=0)
    episode.reset()  # builds the model, whose slots the action space lists
    space = episode.action_space
    return [f"{blueprint} {slot} @{epoch}" for blueprint in space.blueprints for slot in space.slot_ids
            for epoch in epochs]


class ScriptedGrowth:
    """Germinates a fixed schedule; the heuristic cares for the seeds (and would germinate nothing else)."""

    reads_blueprints = False

    def __init__(self, heuristic: HeuristicController, schedule: Sequence[tuple[int, str, str]]) -> None:
        self.heuristic = heuristic
        self.schedule = sorted(schedule)
        self.pending: list[tuple[int, str, str]] = []

    def reset(self) -> None:
        self.heuristic.reset()
        self.pending = list(self.schedule)

    def act(self, snapshot: EpisodeSnapshot, masks: Sequence[np.ndarray]) -> Action:
        action = self.heuristic.act(snapshot, masks)
        if action.op in (Op.GERMINATE, Op.GROW):
            action = Action()
        if action.op is Op.WAIT and self.pending and self.pending[0][0] <= snapshot.epoch:
            _, slot, blueprint = self.pending[0]
            space = self.heuristic.space
            if masks[1][Op.GERMINATE][space.slot_ids.index(slot)] and \
                    masks[2][Op.GERMINATE][space.blueprints.index(blueprint)]:
                self.pending.pop(0)
                return Action(Op.GERMINATE, slot, blueprint)
        return action


@functools.cache
def _setting(name: str) -> tuple[Task, EpisodeConfig]:
    """The task and episode settings `benchmarks/transfer.py` plays `name` with, built once per worker."""
    setting = SETTINGS[name]
    trained, _ = read_policy_run("default", "cpu")
    session, episode_config = evaluation_setting(EvalConfig(policy="default", task=setting.task, host=setting.host),
                                                 trained)
    return load_session_task(session.with_resolved_host(), "cpu"), episode_config


def play(setting: str, plan_name: str, seed_index: int, seed_base: int, threads: int, epochs: int) -> dict[str, Any]:
    """One episode of `epochs` epochs of `plan_name` on `setting`; its final accuracy, parameters added and training
    FLOPs."""
    torch.set_num_threads(threads)
    task, episode_config = _setting(setting)
    episode_config = dataclasses.replace(episode_config, max_epochs=epochs)
    plan = plan_named(plan_name)
    if plan.gates:
        episode_config = with_gates(episode_config, dataclasses.replace(episode_config.slots.gates, **plan.gates))
    seed = derive_seed(seed_base, EVALUATION_STREAM, seed_index)
    episode = MorphogenesisEpisode(task, episode_config, seed=seed)
    episode.reset()
    heuristic = HeuristicController(episode.action_space, task.topology, HeuristicConfig(**plan.heuristic))
    controller = ScriptedGrowth(heuristic, plan.schedule) if plan.schedule else heuristic
    started = time.perf_counter()
    outcome = run_episode(episode, controller)
    kept = [f"{s.blueprint}@{s.slot}" for s in outcome.stories if s.outcome == "fossilized"]
    return {"key": result_key(setting, plan_name, seed_base, seed_index, epochs), "plan": plan_name, "seed": seed_index,
            "epochs": epochs,
            "accuracy": outcome.final_accuracy, "parameters": outcome.parameters - outcome.host_parameters,
            "flops": outcome.flops.total, "kept": kept, "seconds": time.perf_counter() - started}


def result_key(setting: str, plan_name: str, seed_base: int, seed_index: int, epochs: int) -> str:
    """What a results line is found by when a run is resumed: an episode of other length is another result."""
    return f"{setting}/{plan_name}/{seed_base}/{seed_index}/{epochs} epochs"


def report(records: list[dict[str, Any]], plans: Sequence[str], top: int | None = None) -> str:
    """The table: per plan, figures and the paired difference from the heuristic (with `top`, only the heuristic
    and the `top` plans of highest mean accuracy, best first); then the per-seed best."""
    by_plan = {name: {r["seed"]: r for r in records if r["plan"] == name} for name in plans}
    reference = by_plan["heuristic"]
    lines = ["| plan | accuracy | parameters added | GFLOP | - heuristic (ahead / behind) |", "|---|---|---|---|---|"]
    shown = list(plans)
    if top is not None:
        ranked = sorted((name for name in plans if name != "heuristic"),
                        key=lambda name: -statistics.fmean(r["accuracy"] for r in by_plan[name].values()))
        shown = ["heuristic", *ranked[:top]]
    for name in shown:
        runs = by_plan[name]
        accuracy = [r["accuracy"] for r in runs.values()]
        diffs = [runs[s]["accuracy"] - reference[s]["accuracy"] for s in runs if s in reference]
        paired = "-" if name == "heuristic" else (f"{format_mean_error(diffs)} "
                                                  f"({sum(d > 0 for d in diffs)} / {sum(d < 0 for d in diffs)})")
        lines.append(f"| {name} | {format_mean_std(accuracy)}% | "
                     f"{statistics.fmean(r['parameters'] for r in runs.values()):,.0f} | "
                     f"{statistics.fmean(r['flops'] for r in runs.values()) / 1e9:.1f} | {paired} |")
    seeds = [s for s in reference if all(s in by_plan[name] for name in plans)]
    best = [max(by_plan[name][s]["accuracy"] for name in plans) - reference[s]["accuracy"] for s in seeds]
    if best:
        lines.append(f"\nbest of the {len(plans)} plans on each of {len(seeds)} seeds, over the heuristic: "
                     f"{statistics.fmean(best):+.2f} points (an upper bound: the maximum of noisy outcomes)")
    return "\n".join(lines)


def main() -> None:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", default="mnist1d", choices=sorted(SETTINGS))
    parser.add_argument("--plans", default=",".join(PLANS),
                        help=f"comma-separated, of: {', '.join(PLANS)}; or 'BLUEPRINT SLOT @EPOCH'")
    parser.add_argument("--sweep", type=whole_numbers(0), default="",
                        help="comma-separated epochs: every single germination at each")
    parser.add_argument("--top", type=count, default=None, help="show only the best this many plans")
    parser.add_argument("--seeds", type=count, default=16)
    parser.add_argument("--epochs", type=count, default=None,
                        help="epochs per episode (default: the shipped policy's episodes, 30); a plan's germination "
                             "at a later epoch never happens")
    parser.add_argument("--seed", type=int, default=7000, help="base of the seeds (not the transfer table's 3000)")
    parser.add_argument("--jobs", type=count, default=2, help="worker processes")
    parser.add_argument("--threads", type=count, default=1, help="torch threads per worker")
    parser.add_argument("--results", type=output_file, default="runs/growth_plans.jsonl",
                        help="JSON lines of every episode (resumed: start a new file when the code's defaults change)")
    args = parser.parse_args()
    plans = sweep(args.setting, args.sweep) if args.sweep else args.plans.split(",")
    unknown = [name for name in plans if name not in PLANS and not _SINGLE.match(name)]
    if unknown:
        parser.error(f"unknown plan(s) {', '.join(map(repr, unknown))}; valid: {', '.join(PLANS)}")
    if "heuristic" not in plans:
        plans.insert(0, "heuristic")
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a killed run
            done[record["key"]] = record
    epochs = args.epochs or _setting(args.setting)[1].max_epochs
    jobs = [(args.setting, name, index, args.seed, args.threads, epochs) for index in range(args.seeds)
            for name in plans]
    missing = [job for job in jobs if result_key(job[0], job[1], job[3], job[2], epochs) not in done]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool, path.open("a") as out:
        for record in pool.map(play, *zip(*missing, strict=True)) if missing else ():
            done[record["key"]] = record
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(f"  {record['plan']} seed {record['seed']}: {record['accuracy']:.2f}% {record['kept']}", flush=True)
    records = [done[result_key(s, n, b, i, epochs)] for s, n, i, b, _, _ in jobs]
    print(f"\n{args.setting}, {args.seeds} seeds (base {args.seed}), {epochs} epochs; accuracy mean ± std; differences "
          "paired by seed, mean ± standard error")
    print(report(records, plans, args.top))


if __name__ == "__main__":
    run_script(main)
