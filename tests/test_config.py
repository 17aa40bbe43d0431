"""Tests for typed config loading: files in three formats, nested dataclasses, enums, and error messages."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from morphogen.commands.run import RunConfig
from morphogen.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    build_config,
    config_to_dict,
    merge_tables,
    preset_description,
    preset_names,
    read_config_file,
    read_config_source,
)
from morphogen.core.alpha import AlphaCurve
from morphogen.core.blend import BlendKind
from morphogen.core.lifecycle import GateMode, Stage
from morphogen.env.rewards import RewardMode

TOML = """
task = "digits"
slots = ["r0c1", "r0c2"]
max_train_samples = 300

[episode]
max_epochs = 12
reward_mode = "sparse"

[episode.optimizer]
host_lr = 0.05

[episode.slots]
blend = "gate"
blend_curve = "COSINE"

[episode.slots.gates]
mode = "permissive"
auto_advance = ["training", "blending"]

[heuristic]
rotation = ["norm", "attention"]
"""

JSON = {
    "task": "digits", "slots": ["r0c1", "r0c2"], "max_train_samples": 300,
    "episode": {"max_epochs": 12, "reward_mode": "sparse", "optimizer": {"host_lr": 0.05},
                "slots": {"blend": "gate", "blend_curve": "COSINE",
                          "gates": {"mode": "permissive", "auto_advance": ["training", "blending"]}}},
    "heuristic": {"rotation": ["norm", "attention"]},
}

YAML = """
task: digits
slots: [r0c1, r0c2]
max_train_samples: 300
episode:
  max_epochs: 12
  reward_mode: sparse
  optimizer: {host_lr: 0.05}
  slots:
    blend: gate
    blend_curve: COSINE
    gates:
      mode: permissive
      auto_advance: [training, blending]
heuristic:
  rotation: [norm, attention]
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("name", "text"), [("run.toml", TOML), ("run.json", json.dumps(JSON)),
                                            ("run.yaml", YAML), ("run.YML", YAML)])
def test_the_three_formats_give_the_same_typed_config(tmp_path: Path, name: str, text: str) -> None:
    config = build_config(RunConfig, read_config_file(write(tmp_path, name, text)))
    assert config.slots == ("r0c1", "r0c2")
    assert config.max_train_samples == 300
    assert config.run_dir is None  # untouched fields keep their defaults
    episode = config.episode
    assert episode.max_epochs == 12
    assert episode.reward_mode is RewardMode.SPARSE
    assert episode.optimizer.host_lr == 0.05 and isinstance(episode.optimizer.host_lr, float)
    assert episode.optimizer.host_momentum == 0.9
    assert episode.slots.blend is BlendKind.GATE
    assert episode.slots.blend_curve is AlphaCurve.COSINE  # by member name, case-insensitive
    assert episode.slots.gates.mode is GateMode.PERMISSIVE
    assert episode.slots.gates.auto_advance == frozenset({Stage.TRAINING, Stage.BLENDING})
    assert config.heuristic.rotation == ("norm", "attention")


def test_empty_yaml_file_is_all_defaults(tmp_path: Path) -> None:
    assert build_config(RunConfig, read_config_file(write(tmp_path, "empty.yaml", ""))) == RunConfig()


def test_config_to_dict_is_json_and_builds_the_same_config() -> None:
    config = build_config(RunConfig, JSON)
    plain = config_to_dict(config)
    assert plain["episode"]["slots"]["gates"]["auto_advance"] == ["blending", "training"]  # sorted, by value
    assert plain["episode"]["reward_mode"] == "sparse"
    assert build_config(RunConfig, json.loads(json.dumps(plain))) == config


def test_int_is_accepted_where_a_float_is_expected() -> None:
    config = build_config(RunConfig, {"episode": {"optimizer": {"host_lr": 1}}})
    assert config.episode.optimizer.host_lr == 1.0 and isinstance(config.episode.optimizer.host_lr, float)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"bogus": 1}, r"^bogus: unknown key; accepted: task, seed, "),
        ({"episode": {"optimizer": {"bogus": 1}}},
         r"^episode\.optimizer\.bogus: unknown key; accepted: name, host_lr, "),
        ({"episode": {"max_epochs": "ten"}}, r"^episode\.max_epochs: expected an integer, got 'ten'"),
        ({"episode": {"max_epochs": True}}, r"^episode\.max_epochs: expected an integer, got True"),
        ({"episode": {"optimizer": {"host_lr": float("nan")}}},
         r"^episode\.optimizer\.host_lr: expected a finite number"),
        ({"baseline": "yes"}, r"^baseline: expected true or false, got 'yes'"),
        ({"task": 3}, r"^task: expected a string of at most 4096 characters, got 3"),
        ({"max_train_samples": "x"}, r"^max_train_samples: expected an integer, got 'x'"),
        ({"slots": "r0c1"}, r"^slots: expected a list, got 'r0c1'"),
        ({"slots": ["r0c1", 2]}, r"^slots\[1\]: expected a string of at most 4096 characters, got 2"),
        ({"episode": 5}, r"^episode: expected a table of settings, got 5"),
        ({"episode": {"reward_mode": "dense"}},
         r"^episode\.reward_mode: 'dense' is not one of 'contribution', 'simplified', 'sparse', 'loss'$"),
        ({"episode": {"slots": {"gates": {"auto_advance": ["training", "waiting"]}}}},
         r"^episode\.slots\.gates\.auto_advance\[1\]: 'waiting' is not one of 'dormant', "),
    ],
)
def test_type_errors_name_the_key_path(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config(RunConfig, values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"episode": {"max_epochs": 0}}, r"^episode\.max_epochs: must be >= 1, got 0$"),
        ({"episode": {"optimizer": {"host_lr": -1.0}}}, r"^episode\.optimizer\.host_lr: must be > 0, got -1\.0$"),
        ({"episode": {"governor": {"sigma": 0}}}, r"^episode\.governor\.sigma: .*must be > 0, got 0"),
        ({"episode": {"governor": {"window": 1}}}, r"^episode\.governor\.window: need 2 <= min_history <= window"),
        ({"episode": {"slots": {"gates": {"auto_advance": ["fossilized"]}}}},
         r"^episode\.slots\.gates\.auto_advance: may not contain FOSSILIZED"),
        ({"heuristic": {"plateau_epochs": 0}}, r"^heuristic\.plateau_epochs: "),
        ({"telemetry": {"level": "loud"}},
         r"^telemetry\.level: must be one of off, minimal, normal, debug; got 'loud'$"),
        ({"slots": []}, r"^slots: must name at least one slot"),
    ],
)
def test_rejected_values_name_the_key_path_and_the_accepted_range(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config(RunConfig, values)


def test_error_message_is_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(RunConfig, {"episode": {"slots": {"gates": {"mode": "lenient"}}}})
    assert "\n" not in str(caught.value)
    assert str(caught.value) == "episode.slots.gates.mode: 'lenient' is not one of 'strict', 'permissive'"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.toml", 'task = "digits\n', r"^config file .*bad\.toml is not valid TOML: "),
        ("bad.json", '{"task": ', r"^config file .*bad\.json is not valid JSON: "),
        ("bad.yaml", "task: [digits\n", r"^config file .*bad\.yaml is not valid YAML: "),
        ("list.yaml", "- digits\n", r"expected a table of settings at the top level"),
        ("run.ini", "task = digits\n", r"unknown format '\.ini'; use \.toml, \.json, \.yaml or \.yml"),
    ],
)
def test_unreadable_files_are_config_errors(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        read_config_file(write(tmp_path, name, text))
    assert "\n" not in str(caught.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_config_file(tmp_path / "nope.toml")


def test_a_config_that_is_no_file_or_too_large_is_refused_unread(tmp_path: Path) -> None:
    """A FIFO would wait for a writer forever, /dev/zero never ends, a huge file is read whole before parsing."""
    os.mkfifo(tmp_path / "fifo.toml")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "huge.toml").write_text(f'task = "{"x" * MAX_CONFIG_BYTES}"\n')
    for name, reason in (("fifo.toml", "not a regular file"), ("zero.json", "not a regular file"),
                         ("huge.toml", f"larger than {MAX_CONFIG_BYTES:,} bytes")):
        with pytest.raises(ConfigError) as caught:
            read_config_file(tmp_path / name)
        assert str(caught.value) == f"config file {tmp_path / name}: {reason}"


def test_shipped_config_files_and_presets_build() -> None:
    """Every config under configs/ (cited by the README) loads and validates as the config of the command its
    first line names (`morphogen train`); every preset as `morphogen run`'s, and says what it is for."""
    from morphogen.commands.run import RunConfig
    from morphogen.control.trainer import TrainConfig

    files = sorted((Path(__file__).parent.parent / "configs").glob("*.toml"))
    assert {path.name for path in files} >= {"default_policy.toml"}
    for path in files:
        command = path.read_text().split("morphogen ", 1)[1].split()[0]
        # Raises ConfigError naming a bad key.
        build_config({"train": TrainConfig, "run": RunConfig}[command], read_config_file(path))
    assert preset_names() == ["grow_for_compute", "grow_lean", "wider_inside_blocks"]
    for name in preset_names():
        build_config(RunConfig, read_config_source(name))
        assert len(preset_description(name)) > 20


def test_the_compute_saving_preset_grows_late_by_depth_and_keeps_what_lowers_the_loss() -> None:
    """The `grow_for_compute` preset: the settings the README's compute figures were measured with (30 epochs,
    the host alone for 15 of them)."""
    from morphogen.commands.run import RunConfig
    from morphogen.core.lifecycle import Criterion

    config = build_config(RunConfig, read_config_source("grow_for_compute"))
    heuristic, gates = config.heuristic, config.episode.slots.gates
    assert (heuristic.depth_blueprint, heuristic.warmup_fraction, heuristic.first_growth_by) == ("conv_light", 0.5, 0.5)
    assert heuristic.loss_fossilize_threshold == 0.0 and gates.loss_min_contribution == 0.0
    assert gates.criterion is Criterion.LOSS and config.episode.max_epochs == 30


@pytest.mark.parametrize(("source", "message"), [
    ("grow_fast", "config 'grow_fast': not a preset (grow_for_compute, grow_lean, wider_inside_blocks) nor a file (a "
                  "config file ends in .toml, .json, .yaml or .yml)"),
    ("settings/grow_lean", "config file settings/grow_lean does not exist"),
    ("grow_lenn", "config 'grow_lenn': not a preset (grow_for_compute, grow_lean, wider_inside_blocks) nor a file (a "
                  "config file ends in .toml, .json, .yaml or .yml); did you mean grow_lean?"),
    ("wider_inside", "config 'wider_inside': not a preset (grow_for_compute, grow_lean, wider_inside_blocks) nor a "
                     "file (a config file ends in .toml, .json, .yaml or .yml); did you mean wider_inside_blocks?"),
    ("grow_lean.toml", "config file grow_lean.toml does not exist; the preset grow_lean is named without a suffix"),
])
def test_a_config_that_is_neither_a_preset_nor_a_file_is_one_line(source: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_config_source(source)
    assert str(caught.value) == message


def test_a_directory_given_as_a_config_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "settings").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"config 'settings': not a preset \(.*\) nor a file \(it is a directory\)"):
        read_config_source("settings")


def test_merged_tables_keep_what_the_override_leaves_out_at_every_depth() -> None:
    base = {"episode": {"max_epochs": 30, "slots": {"gates": {"criterion": "loss"}}}, "seed": 1}
    over = {"episode": {"slots": {"gates": {"loss_min_contribution": 0.0}}}, "seed": 2}
    assert merge_tables(base, over) == {
        "episode": {"max_epochs": 30, "slots": {"gates": {"criterion": "loss", "loss_min_contribution": 0.0}}},
        "seed": 2}
    assert base["seed"] == 1  # not changed in place


def test_a_table_without_a_required_key_names_the_table_and_the_key() -> None:
    from morphogen.control.trainer import TrainConfig

    with pytest.raises(ConfigError, match=r"^mix\[1\]: task is required$"):
        build_config(TrainConfig, {"mix": [{"task": "digits"}, {"episode_length": 3}]})


@pytest.mark.parametrize(("name", "text", "message"), [
    ("twice.json", '{"seed": 1, "episode": {"max_epochs": 2, "max_epochs": 3}}',
     "key 'max_epochs' is given twice in one table"),
    ("twice.yaml", "seed: 1\nseed: 2\n", "key 'seed' is given twice in one table (line 2)"),
    ("twice.yml", "episode:\n  max_epochs: 2\n  max_epochs: 3\n",
     "key 'max_epochs' is given twice in one table (line 3)"),
])
def test_a_key_given_twice_in_json_or_yaml_is_refused_as_in_toml(tmp_path: Path, name: str, text: str,
                                                                 message: str) -> None:
    """JSON and YAML parsers keep the last of two equal keys: the first would look set and change nothing."""
    with pytest.raises(ConfigError) as caught:
        read_config_file(write(tmp_path, name, text))
    assert str(caught.value) == f"config file {tmp_path / name}: {message}"


def test_keys_a_yaml_merge_brings_in_may_be_overridden(tmp_path: Path) -> None:
    text = "shared: &base\n  seed: 1\n  device: cpu\nrun:\n  <<: *base\n  seed: 3\n"
    assert read_config_file(write(tmp_path, "merged.yaml", text))["run"] == {"seed": 3, "device": "cpu"}


def test_a_yaml_number_with_an_exponent_is_the_float_toml_and_json_read(tmp_path: Path) -> None:
    """PyYAML reads YAML 1.1, where `1e-3` (no decimal point) is a string: `host_lr: 1e-3` was refused as "got
    '1e-3'" though TOML and JSON read the same text as 0.001."""
    from morphogen.commands.run import load_config

    yaml_file = write(tmp_path, "lr.yaml", "episode:\n  optimizer:\n    host_lr: 1e-3\n    seed_lr: 2E+0\n"
                                            "task_name: '1e-3'\n")
    toml_file = write(tmp_path, "lr.toml", "[episode.optimizer]\nhost_lr = 1e-3\nseed_lr = 2E+0\n")
    for path in (yaml_file, toml_file):
        optimizer = load_config(path).episode.optimizer
        assert (optimizer.host_lr, optimizer.seed_lr) == (0.001, 2.0)
    assert read_config_file(yaml_file)["task_name"] == "1e-3"  # quoted, it stays a string


@pytest.mark.parametrize(("name", "text", "message"), [
    ("date.yaml", "seed: 2024-01-01\n", "seed: expected an integer, got '2024-01-01'"),
    ("stamp.yaml", "seed: 2024-01-01 10:00:00\n", "seed: expected an integer, got '2024-01-01 10:00:00'"),
    ("date.toml", "seed = 2024-01-01\n", "seed: expected an integer, got 2024-01-01 (a date)"),
    ("time.toml", "seed = 07:30:00\n", "seed: expected an integer, got 07:30:00 (a time)"),
])
def test_a_date_where_a_setting_is_expected_is_quoted_as_written(tmp_path: Path, name: str, text: str,
                                                                 message: str) -> None:
    """Not as Python's `datetime.date(2024, 1, 1)`: YAML reads an unquoted date as text (as YAML 1.2 does), TOML's
    dates are quoted in ISO form."""
    with pytest.raises(ConfigError) as raised:
        build_config(RunConfig, read_config_file(write(tmp_path, name, text)))
    assert str(raised.value) == message


def test_an_unquoted_date_in_yaml_is_the_string_it_reads_as(tmp_path: Path) -> None:
    config = build_config(RunConfig, read_config_file(write(tmp_path, "dated.yaml", "run_dir: 2024-01-01\n")))
    assert config.run_dir == "2024-01-01"


def test_an_empty_yaml_section_is_an_empty_table_as_in_toml(tmp_path: Path) -> None:
    """`episode:` with its keys commented out is null in YAML; TOML's `[episode]` alone is an empty table. Both
    leave every setting of the table as it was (a train config's permissive gates too)."""
    from morphogen.control.trainer import TrainConfig

    yaml_file = write(tmp_path, "sections.yaml", "episode:\n  # max_epochs: 30\nhost:\ntelemetry:\n")
    toml_file = write(tmp_path, "sections.toml", "[episode]\n[host]\n[telemetry]\n")
    for config_class in (RunConfig, TrainConfig):
        for path in (yaml_file, toml_file):
            assert build_config(config_class, read_config_file(path)) == config_class()
    assert build_config(RunConfig, {"heuristic": None}) == RunConfig()
    assert build_config(RunConfig, {"compare_with": None}).compare_with == {}


@pytest.mark.parametrize(("name", "text"), [("marked.toml", "seed = 3\n"), ("marked.json", '{"seed": 3}'),
                                            ("marked.yaml", "seed: 3\n")])
def test_a_config_saved_with_a_byte_order_mark_reads_as_without(tmp_path: Path, name: str, text: str) -> None:
    """Some Windows editors start a UTF-8 file with a byte-order mark: TOML saw an invalid statement there."""
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert read_config_file(path) == {"seed": 3}


def test_the_path_settings_of_a_file_or_of_python_expand_the_home_directory(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from morphogen.commands.evaluate import EvalConfig
    from morphogen.commands.run import load_config
    from morphogen.control.trainer import TrainConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "grow.toml").write_text('run_dir = "~/runs/a"\ndata_dir = "~/cifar"\ntext_file = "~/t.txt"\n'
                                        'policy = "~/runs/p"\nruns_root = "~/runs"\n')
    config = load_config("~/grow.toml")  # the file itself is found in the home directory
    assert (config.run_dir, config.data_dir, config.text_file, config.policy, config.runs_root) == (
        f"{tmp_path}/runs/a", f"{tmp_path}/cifar", f"{tmp_path}/t.txt", f"{tmp_path}/runs/p", f"{tmp_path}/runs")
    assert TrainConfig(run_dir="~/runs/t").run_dir == f"{tmp_path}/runs/t"
    evaluation = EvalConfig(policy="~/runs/p", run_dir="~/runs/e", data_dir="~/cifar", text_file="~/t.txt")
    assert (evaluation.policy, evaluation.run_dir, evaluation.data_dir, evaluation.text_file) == (
        f"{tmp_path}/runs/p", f"{tmp_path}/runs/e", f"{tmp_path}/cifar", f"{tmp_path}/t.txt")
    assert RunConfig(run_dir="runs/~a", policy="default").run_dir == "runs/~a"  # only a leading ~ is the home
