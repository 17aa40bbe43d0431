"""The `morphogen` command. Errors a user can cause print one line and exit with code 2.

Imports are light here and each command imports what it uses when it runs: `morphogen --help`,
`--version` and `list tasks` load neither torch nor the data, UI or plotting libraries
(`benchmarks/startup.py` measures it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from morphogen import __version__
from morphogen.commands.listing import LISTINGS
from morphogen.config import ConfigError, build_config, merge_tables, read_config_file, read_config_source
from morphogen.core.compilation import COMPILE_BACKENDS, COMPILE_MODES
from morphogen.data.catalog import TASK_NAMES
from morphogen.exit_status import (
    EXIT_BROKEN_PIPE,
    EXIT_DIVERGED,
    EXIT_INTERRUPTED,
    EXIT_PEER_LOST,
    EXIT_TERMINATED,
    EXIT_USER_ERROR,
)
from morphogen.limits import MAX_SEED, MAX_TIMEOUT_SECONDS, short_repr
from morphogen.run_directory import (
    CONFIG_FILENAME,
    EVENTS_FILENAME,
    LockPurpose,
    hold_run_directory,
    outermost_lock,
    read_json_object,
)
from morphogen.ui.terminal_text import printable
from morphogen.user_paths import user_path

if TYPE_CHECKING:
    from morphogen.commands.evaluate import EvalConfig
    from morphogen.commands.run import RunConfig
    from morphogen.control.distributed import DistributedContext
    from morphogen.control.trainer import TrainConfig
    from morphogen.data.tasks import Task
    from morphogen.session import CompileOptions

USER_ERRORS = (
    ("morphogen.config", "ConfigError"), ("morphogen.data.errors", "DataError"),
    ("morphogen.core.blueprints", "UnknownBlueprintError"), ("morphogen.core.hosts", "UnknownSlotError"),
    ("morphogen.control.checkpoint", "CheckpointError"), ("morphogen.ui.run_files", "RunDirectoryError"),
    ("morphogen.ui.runs", "RunsQueryError"), ("morphogen.run_directory", "RunDirectoryLockError"),
    ("morphogen.run_directory", "RunDirectoryRefused"), ("morphogen.run_directory", "DiskFullError"),
    ("morphogen.run_directory", "PlantedLinkError"), ("morphogen.control.distributed", "DistributedSetupError"),
    ("morphogen.core.plain", "ExportError"), ("morphogen.model_file", "ModelFileError"),
)
"""(module, class) of every error a user can cause: one line and `EXIT_USER_ERROR`. Named, not imported, so
that the command imports only what it runs; an error's class is loaded whenever the error can occur."""
DIVERGED = ("morphogen.env.governor", "DivergenceError")
PEER_LOST = ("morphogen.control.distributed", "PeerLostError")
#: Commands whose run directory `--resume` continues when they are stopped.
RESUMABLE_COMMANDS = ("run", "train", "eval")
#: Longest error line printed; longer messages are cut (a user error never needs more).
MAX_ERROR_LINE = 1_000


class UsageError(ValueError):
    """Bad command-line usage that argparse itself cannot see."""


def _add_threads_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int,
                        help="CPU threads for torch (default: $OMP_NUM_THREADS, else half the cores, at most 4)")


def _add_compile_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile", action="store_true", default=None,
                        help="run the host's training forward and the policy under torch.compile (README: --compile)")
    parser.add_argument("--compile-mode", choices=list(COMPILE_MODES),
                        help="torch.compile mode (default auto: reduce-overhead on CUDA, default elsewhere)")
    parser.add_argument("--compile-backend", choices=list(COMPILE_BACKENDS),
                        help="torch.compile backend (default inductor; aot_eager/eager to debug compile problems)")


def _add_telemetry_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--telemetry", choices=["off", "minimal", "normal", "debug"],
                        help="telemetry level (default normal; rises to debug for a few epochs after an anomaly)")
    parser.add_argument("--tensorboard", action="store_true", default=None,
                        help="also write scalars to RUN_DIR/tb (needs the tensorboard extra)")
    parser.add_argument("--profile", action="store_true", default=None,
                        help="record a torch.profiler trace into RUN_DIR/profile")


def _add_run_parser(subparsers: Any) -> None:
    run = subparsers.add_parser("run", help="grow a network for one episode and compare with no growth",
                                description="One morphogenetic episode with the heuristic controller, "
                                            "printed next to the same host trained without growth.")
    run.add_argument("--config", type=user_path, help="TOML/JSON/YAML file with RunConfig keys, or a preset's name "
                     "(morphogen list presets); flags override it")
    run.add_argument("--task", help="digits (default), cifar10, text, mnist1d, or your own as package.module:function "
                                    "(a function returning morphogen.task_from_data(...))")
    run.add_argument("--epochs", "--episode-length", type=int, dest="epochs",
                     help="epochs in the episode (default 30)")
    run.add_argument("--seed", type=int, help="seed of host init and data order (default 0)")
    run.add_argument("--seeds", type=int, help="run N seeds (from --seed on), each into RUN_DIR/seed_<s>, and print "
                     "means over them and differences paired by seed")
    run.add_argument("--compare", action="append", metavar="NAME=SPEC",
                     help="also train another host without growth and show it beside the grown one (repeatable): "
                          "host sizes for a built-in task (3x6=n_blocks=3,base_channels=6) or a function building "
                          "one for a task of your own (wide=my_task:wide_host)")
    run.add_argument("--jobs", type=int, help="with --seeds: worker processes playing the seeds side by side, each "
                                              "with --threads threads (default 1; the figures are the same)")
    run.add_argument("--device", help="cpu (default), cuda, cuda:N, mps or auto")
    run.add_argument("--slots", help="comma-separated slot ids, e.g. r0c0,r0c1 (default: all)")
    run.add_argument("--pool-slots", action="store_true", default=None, help="also place slots after pools")
    run.add_argument("--data-dir", type=user_path, help="CIFAR-10 directory (cifar-10-batches-py layout)")
    run.add_argument("--text-file", type=user_path, help="text file for the text task")
    run.add_argument("--max-train-samples", type=int, help="cap the training split")
    run.add_argument("--run-dir", type=user_path, help="exact run directory (default runs/<time>-<task>)")
    _add_telemetry_flags(run)
    run.add_argument("--no-baseline", action="store_true", help="skip the no-growth comparison")
    run.add_argument("--no-from-scratch", action="store_true",
                     help="skip training the grown model's final architecture from scratch")
    run.add_argument("--policy", type=user_path, help="act with a learned policy: a run directory of `morphogen "
                                                      "train`, or default (the policy shipped with morphogen)")
    run.add_argument("--resume", type=user_path, metavar="RUN_DIR",
                     help="continue a stopped run from the epoch it last finished, with its saved config (only "
                          "--device, --policy and --threads may be given with it), or a stopped run over seeds "
                          "(--jobs too)")
    _add_compile_flags(run)
    _add_threads_flag(run)


def _add_train_parser(subparsers: Any) -> None:
    train = subparsers.add_parser("train", help="train a growth policy with PPO over parallel episodes",
                                  description="PPO over rounds of parallel episodes; a checkpoint every round.")
    train.add_argument("--config", type=user_path, help="TOML/JSON/YAML file with TrainConfig keys (flags override it)")
    train.add_argument("--task", help="digits (default), cifar10, text, mnist1d, or your own as "
                                      "package.module:function (a function returning morphogen.task_from_data(...))")
    train.add_argument("--tasks", help="train one policy over several tasks, each with its default host, e.g. "
                                       "digits,mnist1d ([[mix]] tables in --config set hosts and lengths too)")
    train.add_argument("--paired-baseline", action="store_true", default=None,
                       help="train a no-growth twin beside every env and reward what growth adds over it")
    train.add_argument("--envs", type=int, dest="n_envs", help="episodes side by side per round (default 4)")
    train.add_argument("--rounds", type=int, help="PPO rounds (default 20)")
    train.add_argument("--episode-length", "--epochs", type=int, dest="episode_length",
                       help="epochs per episode (default 25)")
    train.add_argument("--seed", type=int, help="base seed (default 0)")
    train.add_argument("--device", help="cpu (default), cuda, cuda:N, mps or auto")
    train.add_argument("--devices", help="comma-separated devices to spread the envs over in this process, e.g. "
                                         "cuda:0,cuda:1 (env i on the (i mod count)-th; the policy on the first)")
    train.add_argument("--slots", help="comma-separated slot ids (default: all)")
    train.add_argument("--data-dir", type=user_path, help="CIFAR-10 directory")
    train.add_argument("--text-file", type=user_path, help="text file for the text task")
    train.add_argument("--max-train-samples", type=int, help="cap the training split")
    train.add_argument("--hidden-size", type=int, help="policy width (default 512)")
    train.add_argument("--feed-forward", dest="recurrent", action="store_false", default=None,
                       help="a policy without an LSTM: two tanh layers over each epoch's observation")
    train.add_argument("--imitate-rounds", type=int, metavar="N",
                       help="first watch the heuristic for N rounds and imitate it, then PPO (default 0)")
    train.add_argument("--batch-envs", action="store_true", help="train envs of identical architecture in one "
                       "vmapped call per batch (episode.batch_identical; faster with many envs)")
    train.add_argument("--run-dir", type=user_path, help="exact run directory (default runs/<time>-<task>)")
    _add_telemetry_flags(train)
    train.add_argument("--resume", type=user_path, metavar="RUN_DIR", help="continue a stopped run from its checkpoint")
    train.add_argument("--distributed", action="store_true",
                       help="one rank of `torchrun --nproc-per-node N -m morphogen train --distributed`: "
                            "each rank runs envs/N envs, gradients are all-reduced (docs/scaling.md)")
    train.add_argument("--dist-backend", choices=["gloo", "nccl"],
                       help="with --distributed: collective backend (default nccl on CUDA, gloo otherwise)")
    train.add_argument("--dist-timeout", type=float, metavar="SECONDS",
                       help="with --distributed: give up on a silent rank after this long (default 600)")
    _add_compile_flags(train)
    _add_threads_flag(train)


def _add_eval_parser(subparsers: Any) -> None:
    evaluate = subparsers.add_parser("eval", help="compare a learned policy, the heuristic and no growth",
                                     description="Learned policy, heuristic and no growth on the same fresh seeds.")
    evaluate.add_argument("--config", type=user_path,
                          help="TOML/JSON/YAML file with EvalConfig keys (flags override it)")
    evaluate.add_argument("--policy", type=user_path, help="run directory of `morphogen train`, or default (the policy "
                                                           "shipped with morphogen); required, here or in --config")
    evaluate.add_argument("--task", help="task to play, as for run: a built-in one or your own as "
                                         "package.module:function (default: the first task the policy trained on)")
    evaluate.add_argument("--episode-length", "--epochs", type=int, dest="episode_length",
                          help="epochs per episode (default: the policy's training episode length)")
    evaluate.add_argument("--slots", help="comma-separated slot ids (default: all)")
    evaluate.add_argument("--data-dir", type=user_path, help="CIFAR-10 directory (cifar-10-batches-py layout)")
    evaluate.add_argument("--text-file", type=user_path, help="text file for the text task")
    evaluate.add_argument("--max-train-samples", type=int, help="cap the training split")
    evaluate.add_argument("--episodes", type=int, help="episodes per controller (default 5)")
    evaluate.add_argument("--seed", type=int, help="base of the evaluation seeds (default 0)")
    evaluate.add_argument("--jobs", type=int, help="worker processes playing episodes side by side, each with "
                                                   "--threads threads (default 1; the results are the same)")
    evaluate.add_argument("--device", help="cpu (default), cuda, cuda:N, mps or auto")
    evaluate.add_argument("--run-dir", type=user_path,
                          help="record config, events and eval.json here (default: record nothing)")
    evaluate.add_argument("--telemetry", choices=["off", "minimal", "normal", "debug"],
                          help="telemetry level of the recorded episodes (default normal; needs --run-dir)")
    evaluate.add_argument("--resume", type=user_path, metavar="RUN_DIR",
                          help="continue an evaluation stopped before its table (one recorded with --run-dir) after "
                               "the episode it last finished, with its saved config (only --device, --jobs and "
                               "--threads may be given with it)")
    _add_compile_flags(evaluate)
    _add_threads_flag(evaluate)


def _add_dashboard_parser(subparsers: Any) -> None:
    dashboard = subparsers.add_parser("dashboard", help="live terminal view of a run (or a replay of a finished one)",
                                      description="Follows RUN_DIR/events.jsonl while the run goes on. Keys: q quit, "
                                                  "p pause, d env detail, ? help.")
    dashboard.add_argument("run_dir", type=user_path, metavar="RUN_DIR", help="a run directory (runs/<time>-<task>)")
    dashboard.add_argument("--replay", action="store_true",
                           help="start empty and replay the recorded events (for a finished run)")


def _add_runs_parser(subparsers: Any) -> None:
    runs = subparsers.add_parser("runs", help="table of runs with their key results (DuckDB over the events)",
                                 description="Queries DIR/*/events.jsonl, config.json and summary.json in place with "
                                             "DuckDB. Views: events, epochs, episodes, rounds, configs, runs (see "
                                             "morphogen.ui.runs).")
    runs.add_argument("root", type=user_path, metavar="DIR", nargs="?", default="runs",
                      help="parent of run directories (default runs)")
    runs.add_argument("--where", metavar="SQL", help="condition on the runs view, e.g. \"task = 'digits'\"")
    runs.add_argument("--compare", type=user_path, nargs=2, metavar="RUN", help="two runs' curves side by side: any "
                      "two run directories, or runs as the table of DIR names them (seed_0, cos30/seed_0)")


def _add_list_parser(subparsers: Any) -> None:
    listing = subparsers.add_parser("list", help="list tasks, blueprints (with parameter counts), slots or presets",
                                    description="What can be named on the command line. Blueprints and slots "
                                                "depend on the task's host.")
    listing.add_argument("what", choices=LISTINGS, help="what to list")
    listing.add_argument("--task", default="digits", help="task whose host is listed (default digits)")
    listing.add_argument("--pool-slots", action="store_true", help="also list the slots after pools")


def _add_report_parser(subparsers: Any) -> None:
    report = subparsers.add_parser("report", help="print the story of a run from its run directory",
                                   description="Epochs, seeds, rewards, rounds, anomalies and phase times of a "
                                               "run, read from what its telemetry wrote.")
    report.add_argument("run_dir", type=user_path, metavar="RUN_DIR", help="a run directory (runs/<time>-<task>)")
    report.add_argument("--html", action="store_true",
                        help="write one self-contained report.html with the figures (no network needed)")
    report.add_argument("--output", type=user_path, help="where --html writes (default RUN_DIR/report.html)")


def _add_export_parser(subparsers: Any) -> None:
    export = subparsers.add_parser("export", help="write a run's grown model as a file that needs only torch or ONNX",
                                   description="The grown architecture with its kept seeds folded in, as a "
                                               "torch.export program (load: torch.export.load(PATH).module()) or an "
                                               "ONNX model; nothing of morphogen is needed to run it.")
    export.add_argument("run_dir", type=user_path, metavar="RUN_DIR", help="a run directory of `morphogen run`")
    export.add_argument("--format", choices=["torch-export", "onnx"], default="torch-export",
                        help="torch-export (default; a .pt2 file) or onnx (needs the onnx extra)")
    export.add_argument("--output", type=user_path,
                        help="where to write (default RUN_DIR/model.pt2 or RUN_DIR/model.onnx)")
    export.add_argument("--leave-out-blending", action="store_true",
                        help="leave seeds still BLENDING out (by default they go in at the alpha they reached)")
    export.add_argument("--dynamic-dims", metavar="DIMS",
                        help="comma-separated dimensions after the batch's that stay dynamic too, up to their size in "
                             "the run's first validation inputs (1: a language model's sequence length)")
    export.add_argument("--from-scratch", action="store_true",
                        help="export the grown model's final architecture as the run trained it from scratch "
                             "(default output RUN_DIR/model_from_scratch.pt2)")
    export.add_argument("--raw-inputs", action="store_true",
                        help="fold the task's input standardization in (digits, cifar10): the program then takes "
                             "raw pixel values")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="morphogen", description="Neural networks that grow while they train.")
    parser.add_argument("--version", action="version", version=f"morphogen {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add in (_add_run_parser, _add_train_parser, _add_eval_parser, _add_report_parser, _add_dashboard_parser,
                _add_runs_parser, _add_list_parser, _add_export_parser):
        add(subparsers)
    return parser


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse `argv`; an unknown flag is reported with the subcommand's usage, not the top-level one."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        subparsers = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        subparsers.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config values the command line sets (flags left out set nothing)."""
    overrides: dict[str, Any] = {}
    for name in ("task", "seed", "device", "data_dir", "text_file", "max_train_samples", "run_dir", "policy",
                 "pool_slots", "n_envs", "rounds", "hidden_size", "compile", "compile_mode", "compile_backend",
                 "paired_baseline", "recurrent"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    telemetry = {key: value for key, value in (("level", getattr(args, "telemetry", None)),
                                                ("tensorboard", getattr(args, "tensorboard", None)),
                                                ("profile", getattr(args, "profile", None))) if value is not None}
    if telemetry:
        overrides["telemetry"] = telemetry
    if getattr(args, "imitate_rounds", None) is not None:
        overrides["imitation"] = {"rounds": args.imitate_rounds}
    if getattr(args, "no_baseline", False):
        overrides["baseline"] = False
    if getattr(args, "no_from_scratch", False):
        overrides["from_scratch"] = False
    if getattr(args, "compare", None):
        hosts = [_compared_host(text) for text in args.compare]
        overrides["compare_with"] = dict(hosts)
        if len(overrides["compare_with"]) < len(hosts):
            raise UsageError("--compare: each host needs a name of its own")
    return {**overrides, **_list_overrides(args)}


def _compared_host(text: str) -> tuple[str, dict[str, int] | str]:
    """One `--compare NAME=SPEC`: the name, and host sizes (`key=value,...`) or an import path (`module:function`)."""
    name, _, spec = text.partition("=")
    example = "--compare 3x6=n_blocks=3,base_channels=6 or --compare wide=my_task:wide_host"
    if not name or not spec:
        raise UsageError(f"--compare: expected NAME=SPEC, got {short_repr(text)} ({example})")
    if ":" in spec:
        return name, spec
    sizes = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        if not key or not value.strip().lstrip("-").isdigit():
            raise UsageError(f"--compare {short_repr(name)}: expected host sizes key=integer separated by commas, "
                             f"got {short_repr(spec)} ({example})")
        sizes[key.strip()] = int(value)
    return name, sizes


def _list_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """`--slots`, `--tasks` and `--devices`, comma-separated lists on the command line."""
    overrides: dict[str, Any] = {}
    for name, example in (("slots", "r0c1"), ("tasks", "digits,mnist1d")):
        if getattr(args, name, None) is not None:
            overrides[name] = _comma_list(getattr(args, name), name, example)
    if getattr(args, "devices", None) is not None:
        if getattr(args, "device", None) is not None:
            raise UsageError("--device and --devices both say where to run; give one (the policy lives on the "
                             "first of --devices)")
        devices = [name.strip() for name in args.devices.split(",")]
        if not all(devices):
            raise UsageError(f"--devices needs comma-separated device names without empty ones, got {args.devices!r}")
        overrides["devices"] = devices
    return overrides


def _dimensions(text: str | None) -> tuple[int, ...]:
    """`--dynamic-dims 1,2` as dimensions; other text is a `UsageError`."""
    if text is None:
        return ()
    names = _comma_list(text, "dynamic-dims", "1")
    if not all(name.isdigit() and int(name) >= 1 for name in names):
        raise UsageError(f"--dynamic-dims takes dimensions after the batch's, integers >= 1 such as 1 or 1,2; got "
                         f"{text!r}")
    return tuple(int(name) for name in names)


def _comma_list(text: str, flag: str, example: str) -> list[str]:
    """The non-empty comma-separated names of `--flag text`; none at all is a `UsageError`."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise UsageError(f"--{flag} needs at least one name, e.g. --{flag} {example}")
    return names


def _apply_overrides(values: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Flags over file values; a table of flags (telemetry) is merged into the file's table, not replacing it. A host
    `--compare` names replaces the file's host of that name whole: `--compare a=n_blocks=3` is that host, not one
    with the file's other sizes for `a` too (the file's other hosts stay)."""
    merged = merge_tables(values, overrides)
    compared = overrides.get("compare_with")
    if compared and isinstance(merged.get("compare_with"), dict):
        merged["compare_with"] = {**merged["compare_with"], **compared}
    values.update(merged)


def _with_episode_length(values: dict[str, Any], length: int | None, flag: str) -> dict[str, Any]:
    if length is not None:
        if length < 1:
            raise UsageError(f"{flag} must be >= 1, got {length}")
        episode = values.get("episode") or {}
        if not isinstance(episode, dict):
            raise ConfigError(f"episode: expected a table of settings, got {short_repr(episode)}")
        episode = dict(episode)
        episode["max_epochs"] = length
        values["episode"] = episode
    return values


def _with_task_optimizer(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with `episode.optimizer` resolved: the config's `[episode.optimizer]` table (if any) laid
    over its task's default optimizer.

    Without this, `host_lr = 1e-3` alone on `text` would build `OptimizerConfig`'s SGD defaults around it
    instead of the task's AdamW. Resolved here, the run's config.json records every optimizer setting, and
    a resumed run keeps them even if the task's default changes later. An `episode` or `optimizer` that is
    not a table, or an unknown task, is left for `build_config` and `load_task` to report.
    """
    from morphogen.session import SessionOptions

    episode = values.get("episode", {})
    if isinstance(episode, dict):
        resolved = _resolved_optimizer(episode.get("optimizer", {}), values.get("task", SessionOptions.task),
                                       "episode.optimizer")
        if resolved is not None:
            values["episode"] = {**episode, "optimizer": resolved}
    return values


def _resolved_optimizer(table: Any, task: Any, path: str) -> dict[str, Any] | None:
    """Optimizer `table` laid over built-in `task`'s default optimizer, as plain values; None (left for
    `build_config` to check) where `table` is not a table or `task` is not a built-in one."""
    from morphogen.env.optimizer import resolved_optimizer_table

    return resolved_optimizer_table(table, task, path) if task in TASK_NAMES else None


def _over_users_default(table: Any, task: str | None) -> dict[str, Any] | None:
    """An optimizer `table` that names no optimizer, for a task of the user's own: the command lays it over the
    default of the user's model (AdamW for a transformer) once the task is built; else None."""
    if task is None or task in TASK_NAMES or not isinstance(table, dict) or "name" in table:
        return None
    return table


def read_config_values(source: str | None) -> dict[str, Any]:
    """The values of the config file or preset `source` names (none: no values)."""
    return {} if source is None else read_config_source(source)


def train_config_from_args(args: argparse.Namespace) -> TrainConfig:
    from morphogen.control.trainer import TrainConfig

    values = read_config_values(args.config)
    in_file = dict(values)
    _apply_overrides(values, _flag_overrides(args))
    if args.n_envs is not None and args.n_envs < 1:
        raise UsageError(f"--envs must be >= 1, got {args.n_envs}")
    if args.batch_envs and isinstance(values.get("episode") or {}, dict):  # another type fails in build_config
        values["episode"] = {**(values.get("episode") or {}), "batch_identical": True}
    values = _with_episode_length(values, args.episode_length, "--episode-length")
    _refuse_flags_beside_the_mix(args, values)
    _refuse_file_settings_beside_the_mix(args, in_file, values)
    if not values.get("tasks") and not values.get("mix"):  # a mix trains each task with its own default optimizer
        values = _with_task_optimizer(values)
    config = build_config(TrainConfig, values)
    _check_compile_flags(args, config)
    return config


def _refuse_flags_beside_the_mix(args: argparse.Namespace, values: dict[str, Any]) -> None:
    """`UsageError` for `--task` beside `tasks` or `[[mix]]`, and `--episode-length` beside entries that all set
    their own, which would ignore them. The trainer refuses such values unless they are its defaults (digits, 25
    epochs); only here is a default known to be given on purpose."""
    from morphogen.control.trainer import length_beside_the_mix, task_beside_the_mix

    tasks, mix = values.get("tasks"), values.get("mix")
    if args.task is not None and bool(tasks) != bool(mix):  # both at once: the trainer says to give one
        raise UsageError(task_beside_the_mix(args.task, in_mix=bool(mix)))
    if args.episode_length is None or tasks or not isinstance(mix, list) or not mix:
        return
    lengths = [entry.get("episode_length") if isinstance(entry, dict) else None for entry in mix]
    if None not in lengths and args.episode_length not in lengths:
        raise UsageError(length_beside_the_mix(args.episode_length))


def _refuse_file_settings_beside_the_mix(args: argparse.Namespace, in_file: dict[str, Any],
                                        values: dict[str, Any]) -> None:
    """`ConfigError` for a `task`, `[host]` table or `episode.max_epochs` that the `--config` file sets beside a
    training mix (its `[[mix]]`, or `tasks`) that would ignore it, default value or not: the trainer lets the defaults
    pass, not knowing whether they were written. A run's config.json records every setting, so `--config
    RUN/config.json` is left to the trainer's check (`_is_run_record`)."""
    from morphogen.control.trainer import host_beside_the_mix, task_beside_the_mix

    tasks, mix = values.get("tasks"), values.get("mix")
    if args.config is None or bool(tasks) == bool(mix) or _is_run_record(args.config):
        return  # no mix, both at once (which the trainer refuses), or a run's record
    if args.task is None and isinstance(in_file.get("task"), str):
        raise ConfigError(task_beside_the_mix(in_file["task"], in_mix=bool(mix)))
    if isinstance(in_file.get("host"), dict) and in_file["host"]:
        raise ConfigError(host_beside_the_mix(in_mix=bool(mix)))
    if args.episode_length is None:
        _refuse_file_length_beside_the_mix(in_file.get("episode"), mix)


def _refuse_file_length_beside_the_mix(episode: object, mix: object) -> None:
    """`ConfigError` for the file's `episode.max_epochs` where every `[[mix]]` entry sets another episode length."""
    from morphogen.control.trainer import length_beside_the_mix

    if not isinstance(episode, dict) or not isinstance(mix, list):
        return
    length = episode.get("max_epochs")
    lengths = [entry.get("episode_length") if isinstance(entry, dict) else None for entry in mix]
    if length is not None and None not in lengths and length not in lengths:
        raise ConfigError(length_beside_the_mix(length))


def _is_run_record(source: str) -> bool:
    """Whether the config file `source` is the config.json that a run recorded (beside its events), not one written
    by hand."""
    path = Path(source)
    return path.name == CONFIG_FILENAME and os.path.lexists(path.parent / EVENTS_FILENAME)


def _train(args: argparse.Namespace) -> None:
    from morphogen.commands.train import train_command

    _check_distributed_flags(args)
    if args.resume is not None:
        _resume(args)
        return
    config = train_config_from_args(args)
    with _distributed(args, config.policy_device) as context:
        train_command(config, context=context)


def _check_compile_flags(args: argparse.Namespace, config: CompileOptions) -> None:
    """`UsageError` where `--compile-mode` or `--compile-backend` is given and nothing compiles: they say how
    `--compile` compiles, and alone would be recorded in config.json and change nothing."""
    given = [flag for flag, name in (("--compile-mode", "compile_mode"), ("--compile-backend", "compile_backend"))
             if getattr(args, name, None) is not None]
    if given and not config.compile:
        raise UsageError(f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to a compiled run; add "
                         "--compile (or compile = true in the config)")


def _check_distributed_flags(args: argparse.Namespace) -> None:
    if not args.distributed and (args.dist_backend is not None or args.dist_timeout is not None):
        raise UsageError("--dist-backend and --dist-timeout apply to --distributed runs; add --distributed")
    if args.dist_timeout is not None and not 0 < args.dist_timeout <= MAX_TIMEOUT_SECONDS:  # NaN fails too
        raise UsageError(f"--dist-timeout must be > 0 and <= {MAX_TIMEOUT_SECONDS:,} seconds, got {args.dist_timeout}")


def _resume(args: argparse.Namespace) -> None:
    """`train --resume RUN_DIR`: continue a run with its saved config and the few flags that may change."""
    from morphogen.commands.train import config_for_resume, train_command

    overrides = _flag_overrides(args)
    if args.config or args.episode_length is not None or args.slots is not None or args.batch_envs:
        raise UsageError("--resume continues a run with its saved config; only --rounds, --device, --devices, "
                         "--telemetry and the --compile flags may be given with it")
    policy_device = overrides["devices"][0] if "devices" in overrides else overrides.get("device")
    with _distributed(args, policy_device or saved_policy_device(args.resume)) as context:
        # Lock before reading the checkpoint: a writer that finishes a round in between would be overwritten.
        # Of a distributed run's ranks, rank 0 alone writes, so it alone locks.
        main_rank = context is None or context.is_main
        lock = hold_run_directory(args.resume, LockPurpose.RESUME) if main_rank and Path(args.resume).is_dir() \
            else contextlib.nullcontext()
        with lock:
            config, state = config_for_resume(args.resume, overrides)
            _check_compile_flags(args, config)
            train_command(config, resume_state=state, resume=True, context=context)


def saved_policy_device(run_dir: str) -> str:
    """The device a run's policy was saved on (its config.json), which a resumed `--distributed` run keeps
    unless `--device`/`--devices` say otherwise, so that it picks the same backend (NCCL for CUDA)."""
    values = read_json_object(Path(run_dir) / CONFIG_FILENAME) or {}  # damaged: the resume reports it in one line
    devices = values.get("devices")
    if isinstance(devices, list) and devices and isinstance(devices[0], str):
        return devices[0]
    device = values.get("device")
    return device if isinstance(device, str) else "cpu"


@contextlib.contextmanager
def _distributed(args: argparse.Namespace, device: str) -> Iterator[DistributedContext | None]:
    """With --distributed, join torchrun's process group for the block (and leave it after a clean end)."""
    if not args.distributed:
        yield None
        return
    from morphogen.control.distributed import DEFAULT_TIMEOUT_S, init_distributed, shutdown

    timeout = DEFAULT_TIMEOUT_S if args.dist_timeout is None else args.dist_timeout
    context = init_distributed(device, backend=args.dist_backend, timeout_s=timeout)
    yield context
    shutdown()  # not after an error: a lost rank could make the teardown wait for it


def _run(args: argparse.Namespace) -> None:
    from morphogen.commands.run import run_command
    from morphogen.run_directory import is_seeds_directory

    if args.resume is not None and is_seeds_directory(args.resume):
        _resume_seeds(args)
        return
    # A policy (`--policy`, or `policy` in the config) acts on the task, host, slots and episode `run` chose,
    # whatever it was trained on.
    config, task = _resumed_run_config(args) if args.resume is not None else _run_config_and_task(args)
    resume = args.resume is not None
    if args.seeds is None:
        if args.jobs is not None:
            raise UsageError("--jobs plays the seeds of --seeds side by side; give --seeds N with it")
        run_command(config, task=task, resume=resume)
        return
    import torch

    from morphogen.over_seeds import RunSeed, play_over_seeds

    if args.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {args.seeds}")
    if config.seed > MAX_SEED - (args.seeds - 1):
        raise UsageError(f"--seeds {args.seeds} from seed {config.seed:,} goes past the largest seed, {MAX_SEED:,}")
    jobs = 1 if args.jobs is None else args.jobs
    play = RunSeed(with_policy_identity(config), task)
    play_over_seeds(play if jobs == 1 else play.for_workers(), range(config.seed, config.seed + args.seeds),
                    config.run_dir, config.runs_root, config.task_name or config.task, config.from_scratch, None,
                    jobs=jobs, threads=torch.get_num_threads(), plan=play.plan())


def _resume_seeds(args: argparse.Namespace) -> None:
    """`run --resume RUN_DIR` of a run over several seeds: its plan's config and seeds, on `--device` if given."""
    import torch

    from morphogen.commands.run import RunConfig
    from morphogen.commands.run_policy import check_same_policy
    from morphogen.over_seeds import RunSeed, play_over_seeds, read_seeds_plan, resumable_seeds_dir
    from morphogen.session import PYTHON_TASK

    _refuse_flags_beside_resume(args, ("device", "policy", "threads", "jobs"), "a run")
    path = resumable_seeds_dir(args.resume)
    plan = read_seeds_plan(path)
    values = plan.get("config")
    if not isinstance(values, dict) or values.get("task") == PYTHON_TASK:
        raise UsageError(f"the run over seeds in {path} grew a task built in Python; resume it from Python with "
                         "morphogen.grow_over_seeds(..., run_dir=..., resume=True)")
    if args.device is not None:
        values["device"] = args.device
    config = build_config(RunConfig, values)
    if args.policy is not None:
        given = with_policy_identity(dataclasses.replace(config, policy=args.policy))
        check_same_policy(f"the run over seeds in {path}", config.policy, config.policy_checksum, given.policy,
                          given.policy_checksum)
        config = given
    play = RunSeed.from_plan(plan, config)
    config, jobs = play.config, 1 if args.jobs is None else args.jobs
    play_over_seeds(play, plan["seeds"], str(path), config.runs_root, config.task_name or config.task,
                    plan["from_scratch"], None, jobs=jobs, threads=torch.get_num_threads(), resume=True)


def _resumed_run_config(args: argparse.Namespace) -> tuple[RunConfig, None]:
    """`run --resume RUN_DIR`: the run's saved config.json, on the device `--device` names if given."""
    from morphogen.commands.run import RunConfig, resumable_run_dir
    from morphogen.session import PYTHON_TASK

    _refuse_flags_beside_resume(args, ("device", "policy", "threads"), "a run")
    values = read_config_file(resumable_run_dir(args.resume) / CONFIG_FILENAME)
    if values.get("task") == PYTHON_TASK:
        raise UsageError(f"the run in {args.resume} grew a task built in Python; resume it from Python with "
                         "morphogen.grow(task, host, run_dir=..., resume=True)")
    values["run_dir"] = args.resume
    for name in ("device", "policy"):  # without --policy, the policy that played (config.json records it)
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    return build_config(RunConfig, values), None


def with_policy_identity(config: RunConfig) -> RunConfig:
    """`config` with its policy (if any) as a run records it: the path absolute, and the checksum of its weights."""
    if config.policy is None:
        return config
    from morphogen.commands.run_policy import policy_identity, recorded_policy_path

    return dataclasses.replace(config, policy=recorded_policy_path(config.policy),
                               policy_checksum=policy_identity(config.policy))


def _refuse_flags_beside_resume(args: argparse.Namespace, allowed: tuple[str, ...], what: str) -> None:
    """`UsageError` naming the flags given with `--resume` other than the `allowed` ones."""
    given = sorted(f"--{name.replace('_', '-')}" for name, value in vars(args).items()
                   if name not in ("command", "resume", *allowed) and value not in (None, False))
    if given:
        flags = [f"--{name}" for name in allowed]
        raise UsageError(f"--resume continues {what} with its saved config; only {', '.join(flags[:-1])} and "
                         f"{flags[-1]} may be given with it, not {', '.join(given)}")


def run_config_from_args(args: argparse.Namespace) -> RunConfig:
    """Defaults, then the config file, then command-line flags."""
    return _run_config_and_task(args, load=False)[0]


def _run_config_and_task(args: argparse.Namespace, *, load: bool = True) -> tuple[RunConfig, Task | None]:
    """The run's config and, where resolving its optimizer needed it, its task (already loaded).

    A task of the user's own (`--task module:function`) trains with its host's topology's default optimizer
    (AdamW for a transformer), which is known only once the user's function has built the task. So an
    `[episode.optimizer]` table that does not name an optimizer is laid over that default after loading the task
    here, once; `run` then plays that task. `load=False` leaves such a table over SGD's defaults.
    """
    from morphogen.commands.run import RunConfig

    values = read_config_values(args.config)
    _apply_overrides(values, _flag_overrides(args))
    values = _with_episode_length(values, args.epochs, "--epochs")
    config = build_config(RunConfig, _with_task_optimizer(values))
    _check_compile_flags(args, config)
    episode = values.get("episode")
    table = _over_users_default(episode.get("optimizer") if isinstance(episode, dict) else None, config.task)
    if not load or table is None:
        return config, None
    from morphogen.devices import resolve_device
    from morphogen.env.optimizer import task_optimizer_config
    from morphogen.session import load_session_task

    task = load_session_task(config.with_resolved_host(), resolve_device(config.device))
    optimizer = task_optimizer_config(task.name, table, "episode.optimizer", topology=task.topology)
    return dataclasses.replace(config, episode=dataclasses.replace(config.episode, optimizer=optimizer)), task


def eval_config_from_args(args: argparse.Namespace) -> EvalConfig:
    """Defaults, then the config file, then command-line flags."""
    from morphogen.commands.evaluate import EvalConfig

    values = read_config_values(args.config)
    for name in ("policy", "episodes", "seed", "jobs", "device", "run_dir", "compile", "compile_mode",
                 "compile_backend", "task", "episode_length", "data_dir", "text_file", "max_train_samples"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    if args.slots is not None:
        values["slots"] = _comma_list(args.slots, "slots", "r0c1")
    if args.telemetry is not None:
        if values.get("run_dir") is None:  # a [telemetry] table of a file without run_dir is left unused
            raise UsageError("--telemetry sets the level of recorded events; give --run-dir DIR to record them")
        values["telemetry"] = {**(values.get("telemetry") or {}), "level": args.telemetry}
    resolved = _resolved_optimizer(values.get("optimizer"), values.get("task"), "optimizer")
    if resolved is not None:
        values["optimizer"] = resolved
    config = build_config(EvalConfig, values)
    _check_compile_flags(args, config)
    return config


def _eval(args: argparse.Namespace) -> None:
    from morphogen.commands.evaluate import evaluate_command

    if args.resume is not None:
        evaluate_command(_resumed_eval_config(args), resume=True)
        return
    config = eval_config_from_args(args)
    table = None if config.optimizer is None else read_config_values(args.config).get("optimizer")
    evaluate_command(config, optimizer_table=_over_users_default(table, config.task))


def _resumed_eval_config(args: argparse.Namespace) -> EvalConfig:
    """`eval --resume RUN_DIR`: the evaluation's saved config.json, on the device `--device` names if given."""
    from morphogen.commands.evaluate import EvalConfig, resumable_eval_dir

    _refuse_flags_beside_resume(args, ("device", "jobs", "threads"), "an evaluation")
    values = read_config_file(resumable_eval_dir(args.resume) / CONFIG_FILENAME)
    values["run_dir"] = args.resume
    for name in ("device", "jobs"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    return build_config(EvalConfig, values)


def _report(args: argparse.Namespace) -> None:
    if args.output is not None and not args.html:
        raise UsageError("--output is where --html writes; add --html")
    if not args.html:
        from morphogen.ui.report import render_report

        print(render_report(args.run_dir))
        return
    from morphogen.ui.html_report import write_html_report

    print(f"wrote {write_html_report(args.run_dir, args.output)}")


def _list(args: argparse.Namespace) -> None:
    from morphogen.commands.listing import list_command

    list_command(args.what, task_name=args.task, pool_slots=args.pool_slots)


def _export(args: argparse.Namespace) -> None:
    from morphogen.commands.export import export_command

    export_command(args.run_dir, args.format, args.output, args.leave_out_blending, from_scratch=args.from_scratch,
                   dynamic_dims=_dimensions(args.dynamic_dims), raw_inputs=args.raw_inputs)


def _dashboard(args: argparse.Namespace) -> None:
    from morphogen.ui.dashboard import dashboard_command

    dashboard_command(args.run_dir, replay=args.replay)


def _runs(args: argparse.Namespace) -> None:
    from morphogen.ui.runs import runs_command

    runs_command(args.root, where=args.where, compare=args.compare)


COMMANDS: dict[str, Callable[[argparse.Namespace], None]] = {
    "run": _run, "train": _train, "eval": _eval, "report": _report, "dashboard": _dashboard, "runs": _runs,
    "list": _list, "export": _export,
}


def _loaded(*classes: tuple[str, str]) -> tuple[type[BaseException], ...]:
    """The classes named (module, class) whose module is imported: an instance of one exists only then."""
    return tuple(getattr(sys.modules[module], name) for module, name in classes if module in sys.modules)


def _one_line(error: BaseException) -> str:
    """The error's message as one line of at most `MAX_ERROR_LINE` characters."""
    text = printable(" ".join(str(error).split("\n")))  # a run's strings may hold escape sequences
    if len(text) > MAX_ERROR_LINE:
        text = f"{text[:MAX_ERROR_LINE]}... ({len(text):,} characters in all)"
    return text


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: the command stops as Ctrl-C stops it (its lock released, its workers stopped, its files
    whole), so that `--resume` goes on with it, instead of dying where it stood."""


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM, should the clean-up hang, ends it at once
    raise Terminated


@contextlib.contextmanager
def _sigterm_stops_as_ctrl_c() -> Iterator[None]:
    """Handle SIGTERM as Ctrl-C for the block, then restore the handler found (only the main thread can set one),
    unless the command installed its own: a `--distributed` rank's stays until the process exits (exit status 4)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) in (_terminate, signal.SIG_DFL):  # ours, or ours once it fired
            signal.signal(signal.SIGTERM, previous)


def _stopped(args: argparse.Namespace, lock_before: tuple[int, Path | None], error: KeyboardInterrupt) -> int:
    """Say in one line that the command was stopped, and how to go on with it; return the exit status."""
    how = "stopped by SIGTERM" if isinstance(error, Terminated) else "interrupted"
    count, directory = outermost_lock()
    if args.command in RESUMABLE_COMMANDS and count != lock_before[0] and directory is not None:
        how += f"; `morphogen {args.command} --resume {printable(str(directory))}` goes on from its last save"
    print(f"morphogen {args.command}: {how}", file=sys.stderr)
    return EXIT_TERMINATED if isinstance(error, Terminated) else EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(build_parser(), argv)
    lock_before = outermost_lock()
    with _sigterm_stops_as_ctrl_c():
        return _run_command(args, lock_before)


def _run_command(args: argparse.Namespace, lock_before: tuple[int, Path | None]) -> int:
    """Run the command of `args`; turn what stopped it into one line and an exit status (a bug keeps its traceback)."""
    try:
        if hasattr(args, "threads"):
            from morphogen.commands.threads import set_threads

            try:
                set_threads(args.threads)
            except ValueError as error:  # out of bounds: the message names --threads and the bound
                raise UsageError(str(error)) from None
        COMMANDS[args.command](args)
        sys.stdout.flush()  # here, where a reader that went away (`| head`) can be caught
        return 0
    except SystemExit as error:  # rich's console exits so on a closed pipe, having sent stdout to devnull
        if isinstance(error.__context__, BrokenPipeError):
            return EXIT_BROKEN_PIPE
        raise
    except BrokenPipeError:
        # The reader has what it wanted; stdout goes nowhere from now on, so exiting flushes nothing into the pipe.
        with contextlib.suppress(AttributeError, OSError, ValueError):  # a stdout without a descriptor: nothing to do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as error:
        if isinstance(error, (*_loaded(*USER_ERRORS), UsageError)):
            print(f"morphogen {args.command}: error: {_one_line(error)}", file=sys.stderr)
            return EXIT_USER_ERROR
        if isinstance(error, _loaded(DIVERGED)):
            print(f"morphogen {args.command}: diverged: {_one_line(error)}", file=sys.stderr)
            return EXIT_DIVERGED
        if isinstance(error, _loaded(PEER_LOST)):
            print(f"morphogen {args.command}: error: {_one_line(error)}", file=sys.stderr)
            return EXIT_PEER_LOST
        raise
    except KeyboardInterrupt as error:
        return _stopped(args, lock_before, error)


if __name__ == "__main__":
    sys.exit(main())
