"""The `morphogen` command. Errors a user can cause print one line and exit with code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from morphogen.config import ConfigError, build_config, read_config_file
from morphogen.core.blueprints import UnknownBlueprintError
from morphogen.core.hosts import UnknownSlotError
from morphogen.data import DataError
from morphogen.runner import RunConfig, run_command

USER_ERRORS = (ConfigError, DataError, UnknownBlueprintError, UnknownSlotError)
EXIT_USER_ERROR = 2


class UsageError(ValueError):
    """Bad command-line usage that argparse itself cannot see."""


def _add_run_parser(subparsers: Any) -> None:
    run = subparsers.add_parser("run", help="grow a network for one episode and compare with no growth",
                                description="One morphogenetic episode with the heuristic controller, "
                                            "printed next to the same host trained without growth.")
    run.add_argument("--config", help="TOML/JSON/YAML file with RunConfig keys (flags override it)")
    run.add_argument("--task", help="digits (default), cifar10 or text")
    run.add_argument("--epochs", type=int, help="epochs in the episode (default 30)")
    run.add_argument("--seed", type=int, help="seed of host init and data order (default 0)")
    run.add_argument("--device", help="cpu (default), cuda, cuda:N, mps or auto")
    run.add_argument("--slots", help="comma-separated slot ids, e.g. r0c0,r0c1 (default: all)")
    run.add_argument("--pool-slots", action="store_true", default=None, help="also place slots after pools")
    run.add_argument("--data-dir", help="CIFAR-10 directory (cifar-10-batches-py layout)")
    run.add_argument("--text-file", help="text file for the text task")
    run.add_argument("--max-train-samples", type=int, help="cap the training split")
    run.add_argument("--run-dir", help="exact run directory (default runs/<time>-<task>)")
    run.add_argument("--telemetry", choices=["off", "minimal", "normal", "debug"], help="telemetry level")
    run.add_argument("--no-baseline", action="store_true", help="skip the no-growth comparison")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="morphogen", description="Neural networks that grow while they train.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(subparsers)
    return parser


def _flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for name in ("task", "seed", "device", "data_dir", "text_file", "max_train_samples", "run_dir", "telemetry",
                 "pool_slots"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    if args.slots is not None:
        slots = [s.strip() for s in args.slots.split(",") if s.strip()]
        if not slots:
            raise UsageError("--slots needs at least one slot id, e.g. --slots r0c1")
        overrides["slots"] = slots
    if args.no_baseline:
        overrides["baseline"] = False
    return overrides


def run_config_from_args(args: argparse.Namespace) -> RunConfig:
    """Defaults, then the config file, then command-line flags."""
    values: dict[str, Any] = read_config_file(args.config) if args.config else {}
    values.update(_flag_overrides(args))
    if args.epochs is not None:
        episode = dict(values.get("episode") or {})
        episode["max_epochs"] = args.epochs
        values["episode"] = episode
    return build_config(RunConfig, values)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            run_command(run_config_from_args(args))
        return 0
    except (*USER_ERRORS, UsageError) as error:
        print(f"morphogen {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"morphogen {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
