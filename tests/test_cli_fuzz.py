"""Fuzzing `morphogen run` and `morphogen train` with config files and flags, valid and hostile.

Every generated setting carries whether it is acceptable, so the oracle is independent of the code
under test: an input with any bad setting must exit 2 with exactly one stderr line (no traceback, no
echo of a megabyte), and an input whose settings are all good must run its 1-epoch episode and exit 0.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from morphogen.cli import EXIT_USER_ERROR, MAX_ERROR_LINE, main

Setting = tuple[Any, bool]  # (value, acceptable?)

HUGE = [2**64, 2**70, 10**12, 10**15]
floats_bad = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, "fast", True, [0.1], 1e400])


def choice(good: list[Any], bad: list[Any]) -> st.SearchStrategy[Setting]:
    return st.one_of(st.sampled_from(good).map(lambda v: (v, True)), st.sampled_from(bad).map(lambda v: (v, False)))


class Deep:
    """A list nested `levels` deep, written into the file as text (too deep for json/yaml dumpers and reprs)."""

    def __init__(self, levels: int) -> None:
        self.levels = levels

    def __repr__(self) -> str:
        return f"Deep({self.levels})"


def deep(levels: int) -> Deep:
    return Deep(levels)


SETTINGS: dict[tuple[str, ...], st.SearchStrategy[Setting]] = {
    ("seed",): choice([0, 7, 10**12], [-1, 2**63, 2**70, "zero", 1.5]),
    ("task",): choice(["digits"], ["x" * 100_000, "", "cifar100", 3, deep(50)]),
    ("episode", "max_epochs"): choice([1], [0, -3, *HUGE, "one", 1.0]),
    ("episode", "batch_size"): choice([16, 64], [0, *HUGE, "big", math.inf]),
    ("episode", "optimizer", "host_lr"): st.one_of(st.sampled_from([0.01, 0.05]).map(lambda v: (v, True)),
                                                  floats_bad.map(lambda v: (v, False))),
    ("episode", "optimizer", "host_weight_decay"): choice([0.0, 5e-4], [-1.0, math.nan, math.inf]),
    ("episode", "governor", "sigma"): choice([6.0], [math.nan, -math.inf, 0.0]),
    ("telemetry", "level"): choice(["minimal", "normal"], ["loud", 3, None]),
    ("telemetry", "ratio_explosion"): choice([10.0], [math.inf, math.nan, 0.5]),
    ("host", "base_channels"): choice([8, 16], [0, 10**6, "wide", 2.5]),
    ("host", "n_blocks"): choice([2, 3], [0, 40, 2**70]),
    ("bogus_key",): st.sampled_from([(1, False)]),
    ("episode",): st.sampled_from([(5, False), ("table", False), (deep(2000), False)]),
}

FLAGS: dict[str, st.SearchStrategy[Setting]] = {
    "--epochs": choice(["1"], ["0", "-1", str(10**12), str(2**70)]),
    "--seed": choice(["3"], ["-5", str(2**64), "18446744073709551616"]),
    "--device": choice(["cpu", "auto"], ["meta", "tpu", "cuda:99x", "x" * 5000]),
    # Valid slot lists exist on every host drawn above (n_blocks 2 or 3: digits' default host has r0c0, r0c1).
    "--slots": choice(["r0c1", "r0c0,r0c1"], [",", "r9c9", "r0c1,r0c1", "y" * 3000]),
}
#: The file setting each flag replaces (flags win over the file): with the flag given, only its value counts.
FLAG_OVERRIDES: dict[str, tuple[str, ...]] = {"--seed": ("seed",), "--epochs": ("episode", "max_epochs")}


@st.composite
def run_inputs(draw: st.DrawFn) -> tuple[dict[str, Any], list[str], str, bool]:
    """(config mapping, extra flags, file format, all acceptable?)."""
    config: dict[str, Any] = {}
    acceptable_keys: dict[tuple[str, ...], bool] = {}
    keys = draw(st.lists(st.sampled_from(list(SETTINGS)), unique=True, max_size=4))
    if any(k[0] == "episode" and len(k) > 1 for k in keys):
        keys = [k for k in keys if k != ("episode",)]  # a scalar `episode` and an `episode` table cannot both be
    for key in keys:
        value, ok = draw(SETTINGS[key])
        table = config
        for part in key[:-1]:
            table = table.setdefault(part, {})
        table[key[-1]] = value
        acceptable_keys[key] = ok
    flags = []
    for flag in draw(st.lists(st.sampled_from(list(FLAGS)), unique=True, max_size=2)):
        value, ok = draw(FLAGS[flag])
        flags += [flag, value]
        acceptable_keys.pop(FLAG_OVERRIDES.get(flag, ()), None)
        acceptable_keys[(flag,)] = ok
    acceptable = all(acceptable_keys.values())
    episode = config.get("episode")
    if "--epochs" not in flags and not (isinstance(episode, dict) and "max_epochs" in episode):
        flags += ["--epochs", "1"]  # valid inputs run exactly one epoch
    return config, flags, draw(st.sampled_from(["json", "yaml"])), acceptable


def _placeholders(value: Any, deep_values: list[Deep]) -> Any:
    if isinstance(value, dict):
        return {key: _placeholders(item, deep_values) for key, item in value.items()}
    if isinstance(value, Deep):
        deep_values.append(value)
        return f"DEEP{len(deep_values) - 1}"
    return value


def write_config(directory: Path, config: dict[str, Any], kind: str) -> Path:
    path = directory / f"config.{kind}"
    deep_values: list[Deep] = []
    plain = _placeholders(config, deep_values)
    # Python's json writes NaN/Infinity, which the reader accepts; yaml writes .nan/.inf.
    text = json.dumps(plain) if kind == "json" else yaml.safe_dump(plain, default_flow_style=True, width=10**9)
    for index, value in enumerate(deep_values):
        quoted = f'"DEEP{index}"' if kind == "json" else f"DEEP{index}"
        text = text.replace(quoted, "[" * value.levels + "1" + "]" * value.levels)
    path.write_text(text)
    return path


def invoke(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def assert_one_line_user_error(code: int, err: str, command: str) -> None:
    assert code == EXIT_USER_ERROR, err
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[:2000]
    assert lines[0].startswith(f"morphogen {command}: error: ")
    assert len(lines[0]) <= MAX_ERROR_LINE + 100


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(run_inputs())
def test_run_config_files_and_flags(case: tuple[dict[str, Any], list[str], str, bool]) -> None:
    config, flags, kind, acceptable = case
    event("acceptable" if acceptable else "refused")
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        path = write_config(directory, config, kind)
        argv = ["run", "--config", str(path), *flags, "--max-train-samples", "60", "--no-baseline",
                "--run-dir", str(directory / "run")]
        code, out, err = invoke(argv)
        if not acceptable:
            assert_one_line_user_error(code, err, "run")
            assert not (directory / "run" / "summary.json").exists()
            return
        assert code == 0, err[-3000:]
        assert "epoch   1/1" in out and (directory / "run" / "summary.json").is_file()


@pytest.mark.parametrize("flags", [
    ["--hidden-size", "1000000"], ["--envs", "100000"], ["--rounds", str(10**12)], ["--episode-length", "0"],
    ["--seed", str(2**64)], ["--max-train-samples", "0"], ["--device", "meta"],
])
def test_train_flags_out_of_bounds_are_one_line(flags: list[str], tmp_path: Path) -> None:
    code, _, err = invoke(["train", *flags, "--run-dir", str(tmp_path / "run")])
    assert_one_line_user_error(code, err, "train")
    assert not (tmp_path / "run").exists(), "a refused command creates no run directory"


@pytest.mark.parametrize("table", ["[ppo]\nlearning_rate = inf\n", "[ppo]\nlearning_rate = nan\n",
                                   "[ppo]\ngamma = inf\n", "hidden_size = 1e3\n", "n_envs = 99999999\n"])
def test_train_config_files_out_of_bounds_are_one_line(table: str, tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(table)
    code, _, err = invoke(["train", "--config", str(path), "--run-dir", str(tmp_path / "run")])
    assert_one_line_user_error(code, err, "train")
