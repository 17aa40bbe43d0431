"""What growing costs: a morphogenetic episode against plain training, and the fused counterfactual pass.

(a) Episode overhead. Wall time of a whole heuristic episode on digits (default episode config, `--epochs`
    epochs) divided by the time of plainly training its *final* architecture for the same epochs on the same
    batches: the same host with the seeds that ended blended in (fossilized, holding or blending) built
    fossilized at alpha 1 from the start, one SGD optimizer over everything (host settings of
    `OptimizerConfig`, no clipping), and one validation pass per epoch without counterfactuals.
(b) Counterfactual pass. `counterfactual_forward` over K alpha configurations (K = 2, 4, 8) divided by one
    plain `model(x)`, with a seed blended in at the middle slot r0c1, next to two naive ways of getting the
    same K outputs: `naive-cat` runs K concatenated copies of the input through the whole network in one
    batch with per-sample alphas; `naive-loop` runs K separate forwards with the slot's alpha forced.

Figures are medians over `--repeats` (b) or `--episode-repeats` (a) rounds; each round times every variant
back to back and contributes its own ratio. Run `python benchmarks/overhead.py --help`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from arguments import BenchmarkParser, count, run_script, whole_numbers
from morphogen.control.heuristic import HeuristicController
from morphogen.core.blend import BlendKind
from morphogen.core.flops import FlopCounter
from morphogen.core.hosts import build_host
from morphogen.core.lifecycle import BLENDED_STAGES, GateConfig, GateMode
from morphogen.core.model import MorphogeneticModel
from morphogen.core.slot import SlotConfig
from morphogen.data import Task, load_task
from morphogen.devices import resolve_device
from morphogen.env.episode import EpisodeConfig, MorphogenesisEpisode
from morphogen.env.optimizer import OptimizerConfig
from morphogen.env.play import run_episode

#: Gates that let `fossilized_model` walk a seed straight to FOSSILIZED with a 0-epoch blend.
_INSTANT_LIFECYCLE = SlotConfig(gates=GateConfig(mode=GateMode.PERMISSIVE, min_training_epochs=0), blend_epochs=0)


@dataclass(frozen=True)
class FinalSeed:
    """A seed that ended an episode blended into the host."""

    slot: str
    blueprint: str
    blend: BlendKind
    stage: str


@dataclass(frozen=True)
class EpisodeOverhead:
    epochs: int
    episode_seconds: float
    plain_seconds: float
    ratio: float
    episode_phase_seconds: dict[str, float]
    #: Seconds the episode spent in its FLOP counter's calls (counting on model copies; the median episode's).
    accounting_seconds: float
    final_seeds: list[FinalSeed]
    episode_accuracy: float
    plain_accuracy: float


@dataclass(frozen=True)
class CounterfactualCost:
    configs: int
    fused_ratio: float
    naive_cat_ratio: float
    naive_loop_ratio: float


def synchronize(device: torch.device) -> None:
    """Wait for `device` to finish its queued work (CUDA and MPS run asynchronously; CPU needs nothing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def median_seconds(function: Callable[[], object], repeats: int, warmup: int = 1,
                   device: torch.device | None = None) -> float:
    """Median wall time of `function()` over `repeats` calls, after `warmup` untimed calls; with a `device`,
    each time includes the device finishing the call's work."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        if device is not None:
            synchronize(device)
        started = time.perf_counter()
        function()
        if device is not None:
            synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


# ---------------------------------------------------------------- (a) episode against plain training


def final_seeds(model: MorphogeneticModel) -> list[FinalSeed]:
    return [FinalSeed(slot.slot_id, slot.blueprint, slot.blend_kind, slot.stage.value)
            for slot in model.slots() if slot.stage in BLENDED_STAGES and slot.blueprint is not None]


def fossilized_model(task: Task, seed: int, slot_ids: Sequence[str] | None,
                     seeds: Sequence[FinalSeed]) -> MorphogeneticModel:
    """The episode's host (same initialisation) with `seeds` installed as fixed layers from the start."""
    torch.manual_seed(seed)
    host = build_host(task.topology, device=task.train.device, **task.host_kwargs)
    model = MorphogeneticModel(host, slot_ids, _INSTANT_LIFECYCLE)
    for final in seeds:
        model.install(final.slot, final.blueprint, blend=final.blend)
    return model


def train_plainly(model: MorphogeneticModel, task: Task, epochs: int, batch_size: int, seed: int,
                  validation_batch_size: int) -> float:
    """Plain SGD training with one validation pass per epoch; returns the last validation accuracy."""
    settings = OptimizerConfig()
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.host_lr, momentum=settings.host_momentum,
                                weight_decay=settings.host_weight_decay, foreach=True)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    accuracy = 0.0
    for _ in range(epochs):
        model.train()
        for inputs, targets in task.train.iterate_batches(batch_size, generator=generator, augment=task.augment):
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
        model.eval()
        correct = torch.zeros((), dtype=torch.int64, device=task.validation.device)
        with torch.inference_mode():
            for inputs, targets in task.validation.iterate_batches(validation_batch_size, shuffle=False):
                correct += (model(inputs).argmax(dim=-1) == targets).sum()
        accuracy = 100.0 * correct.item() / len(task.validation)  # one sync per epoch, like the episode's
    return accuracy


def time_flop_counting(counter: FlopCounter) -> list[float]:
    """Time every call of this counter's methods (the instance's own, the class is left alone): the one-element
    list it returns holds the seconds so far."""
    spent = [0.0]
    for name in ("training_step", "validation_batch", "probe", "seed_cost"):
        method = getattr(counter, name)

        def timed(*args: object, _method: Callable[..., object] = method, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started

        setattr(counter, name, timed)
    return spent


def measure_episode_overhead(task: Task, epochs: int, seed: int, repeats: int) -> EpisodeOverhead:
    config = EpisodeConfig(max_epochs=epochs)
    episode_times, plain_times, phases, accounting = [], [], [], []
    for _ in range(repeats):
        episode = MorphogenesisEpisode(task, config, seed=seed)
        accounting.append(time_flop_counting(episode.flop_counter))
        episode.reset()
        controller = HeuristicController(episode.action_space, task.topology)
        outcome = run_episode(episode, controller)
        assert episode.model is not None
        episode_times.append(outcome.seconds)
        phases.append(outcome.phase_seconds)
        seeds = final_seeds(episode.model)
        model = fossilized_model(task, seed, episode.model.slot_ids, seeds)
        started = time.perf_counter()
        plain_accuracy = train_plainly(model, task, epochs, episode.batch_size, seed, config.validation_batch_size)
        plain_times.append(time.perf_counter() - started)
    middle = episode_times.index(sorted(episode_times)[len(episode_times) // 2])
    return EpisodeOverhead(
        epochs=epochs, episode_seconds=statistics.median(episode_times), plain_seconds=statistics.median(plain_times),
        ratio=statistics.median(e / p for e, p in zip(episode_times, plain_times, strict=True)),
        episode_phase_seconds=phases[middle], accounting_seconds=accounting[middle][0], final_seeds=seeds,
        episode_accuracy=outcome.final_accuracy, plain_accuracy=plain_accuracy)


# ---------------------------------------------------------------- (b) counterfactual pass


def blended_model(task: Task, slot_id: str, blueprint: str, seed: int) -> MorphogeneticModel:
    """The digits host with slots everywhere and one trained-looking seed blended in at `slot_id`."""
    model = fossilized_model(task, seed, None, [FinalSeed(slot_id, blueprint, BlendKind.ADD, "fossilized")])
    with torch.no_grad():
        for parameter in model.slot(slot_id).seed_parameters():
            parameter.normal_(0.0, 0.1)  # a fresh seed is the identity; give it real work to do
    return model.eval()


def naive_cat_forward(model: MorphogeneticModel, x: Tensor, alphas: list[list[float]]) -> Tensor:
    """K copies of `x` concatenated and run through every segment, each slot with per-sample alphas."""
    k, batch = len(alphas), x.shape[0]
    h = torch.cat([x] * k)  # (K*B, C, H, W)
    points = list(model.host.injection_points)
    for index, point in enumerate(points):
        h = model.host.run_segment(index, h)
        if point in model.slot_ids:
            j = model.slot_ids.index(point)
            per_sample = torch.tensor([row[j] for row in alphas], dtype=h.dtype,
                                      device=h.device).repeat_interleave(batch)  # (K*B,)
            h = model.slot(point)(h, per_sample)
    h = model.host.run_segment(len(points), h)
    return h.view(k, batch, *h.shape[1:])  # (K, B, classes)


def naive_loop_forward(model: MorphogeneticModel, x: Tensor, slot_id: str, column: list[float]) -> Tensor:
    """One plain forward per configuration with the slot's alpha forced."""
    slot = model.slot(slot_id)
    kept = slot.alpha_value.clone()
    outputs = []
    for alpha in column:
        slot.alpha_value.fill_(alpha)
        outputs.append(model(x))
    slot.alpha_value.copy_(kept)
    return torch.stack(outputs)  # (K, B, classes)


def measure_counterfactual_cost(task: Task, batch: int, configs: Sequence[int], slot_id: str, blueprint: str,
                                seed: int, repeats: int) -> list[CounterfactualCost]:
    """Ratios to one plain forward; every round times all variants back to back, and each figure is the
    median over rounds of that round's ratio, so a machine whose load drifts skews numerator and
    denominator alike."""
    model = blended_model(task, slot_id, blueprint, seed)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, *task.validation.inputs.shape[1:], generator=generator).to(task.validation.device)
    j = model.slot_ids.index(slot_id)
    variants: dict[int, dict[str, Callable[[], Tensor]]] = {}
    for k in configs:
        column = [1.0 - i / (k - 1) for i in range(k)]  # main (alpha 1) ... the seed switched off
        alphas = [[column[i] if c == j else 0.0 for c in range(len(model.slot_ids))] for i in range(k)]
        variants[k] = {
            "fused": lambda alphas=alphas: model.counterfactual_forward(x, alphas),
            "cat": lambda alphas=alphas: naive_cat_forward(model, x, alphas),
            "loop": lambda column=column: naive_loop_forward(model, x, slot_id, column),
        }
    ratios: dict[int, dict[str, list[float]]] = {k: {name: [] for name in variants[k]} for k in configs}
    with torch.inference_mode():
        for k in configs:  # the three ways must agree before their times mean anything
            fused = variants[k]["fused"]()
            torch.testing.assert_close(fused, variants[k]["cat"](), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(fused, variants[k]["loop"](), rtol=1e-4, atol=1e-4)
        for _ in range(repeats):
            plain = median_seconds(lambda: model(x), repeats=1, device=x.device)
            for k in configs:
                for name, function in variants[k].items():
                    ratios[k][name].append(median_seconds(function, repeats=1, warmup=0, device=x.device) / plain)
    return [CounterfactualCost(k, statistics.median(ratios[k]["fused"]), statistics.median(ratios[k]["cat"]),
                               statistics.median(ratios[k]["loop"])) for k in configs]


# ---------------------------------------------------------------- report


def format_table(overhead: EpisodeOverhead, costs: list[CounterfactualCost], args: argparse.Namespace) -> str:
    seeds = ", ".join(f"{s.blueprint}@{s.slot} ({s.stage})" for s in overhead.final_seeds) or "none (bare host)"
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in overhead.episode_phase_seconds.items())
    lines = [
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), device {args.device}",
        "",
        f"(a) episode on digits, heuristic, {overhead.epochs} epochs, median of {args.episode_repeats}",
        f"    final architecture: host + {seeds}",
        f"    {'morphogenetic episode':<34}{overhead.episode_seconds:8.2f} s   "
        f"(val acc {overhead.episode_accuracy:.2f}%)",
        f"    {'plain training, final architecture':<34}{overhead.plain_seconds:8.2f} s   "
        f"(val acc {overhead.plain_accuracy:.2f}%)",
        f"    {'overhead ratio (median of ratios)':<34}{overhead.ratio:8.2f} x",
        f"    episode phases: {phases}",
        f"    of which FLOP accounting: {overhead.accounting_seconds:.2f} s "
        f"({100 * overhead.accounting_seconds / overhead.episode_seconds:.0f}% of the episode)",
        "",
        f"(b) K configurations / one plain forward, batch {args.batch}, seed {args.blueprint}@{args.slot}, "
        f"median of {args.repeats}",
        f"    {'K':>3}{'fused':>10}{'naive-cat':>12}{'naive-loop':>12}{'fused saves':>14}",
    ]
    for cost in costs:
        saving = 1.0 - cost.fused_ratio / cost.naive_cat_ratio
        lines.append(f"    {cost.configs:>3}{cost.fused_ratio:>10.2f}{cost.naive_cat_ratio:>12.2f}"
                     f"{cost.naive_loop_ratio:>12.2f}{saving:>13.0%}")
    lines.append("    (naive-cat: K copies concatenated, one pass, per-sample alphas; "
                 "naive-loop: K separate forwards; fused saves: vs naive-cat)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = BenchmarkParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=count, default=20, help="episode length for (a) (default 20)")
    parser.add_argument("--episode-repeats", type=count, default=3, help="episodes timed for (a) (default 3)")
    parser.add_argument("--batch", type=count, default=2048, help="synthetic 8x8 batch for (b) (default 2048)")
    parser.add_argument("--configs", type=whole_numbers(), default="2,4,8", help="K values for (b) (default 2,4,8)")
    parser.add_argument("--slot", default="r0c1", help="slot of the blended seed in (b) (default r0c1)")
    parser.add_argument("--blueprint", default="conv_light", help="blueprint of that seed (default conv_light)")
    parser.add_argument("--repeats", type=count, default=15, help="timed calls per figure in (b) (default 15)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    parser.add_argument("--threads", type=count, help="torch.set_num_threads (default: torch's choice)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON on stdout (table on stderr)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        args.device = resolve_device(args.device)
    except ValueError as error:
        print(f"overhead: error: {error}", file=sys.stderr)
        return 2
    task = load_task("digits", device=args.device, seed=args.seed)
    overhead = measure_episode_overhead(task, args.epochs, args.seed, args.episode_repeats)
    configs = args.configs
    if any(k < 2 for k in configs):
        raise SystemExit(f"--configs: every K must be >= 2 (main plus at least one ablation), got {configs}")
    costs = measure_counterfactual_cost(task, args.batch, configs, args.slot, args.blueprint, args.seed, args.repeats)
    table = format_table(overhead, costs, args)
    if args.json:
        print(table, file=sys.stderr)
        report = {"threads": torch.get_num_threads(), "episode": asdict(overhead),
                  "counterfactual": [asdict(cost) for cost in costs], "batch": args.batch, "slot": args.slot}
        print(json.dumps(report, indent=2, default=str))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
