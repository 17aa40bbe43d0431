"""`morphogen run --seeds N`: the run once per seed, then means over the seeds and differences paired by seed."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import morphogen.commands.run as run_module
from morphogen.cli import EXIT_USER_ERROR, main


def test_run_over_seeds_writes_each_seed_and_the_figures_over_them(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--task", "digits", "--max-train-samples", "200", "--epochs", "2", "--seed", "4",
                 "--seeds", "2", "--no-from-scratch", "--threads", "1", "--run-dir", str(tmp_path / "seeds")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("seed 4: grown ") and "\nseed 5: grown " in out
    assert "2 seeds (4, 5): mean ± std over the seeds" in out and "grown - no growth" in out
    assert "grown - from scratch" not in out  # --no-from-scratch
    assert "per cost (dominated: " in out and "  in training FLOPs " in out
    figures = json.loads((tmp_path / "seeds" / "seeds.json").read_text())
    assert set(figures["seeds"]) == {"4", "5"} and set(figures["differences"]) == {"no growth"}
    assert set(figures["dominated_by"]) == {"parameters", "training_flops"}
    assert figures["flops_of_from_scratch"] is None  # --no-from-scratch
    for seed in (4, 5):
        assert json.loads((tmp_path / "seeds" / f"seed_{seed}" / "config.json").read_text())["seed"] == seed
        # Each model's costs on each seed, as its run's summary.json has them: per-FLOP comparisons need no more.
        summary = json.loads((tmp_path / "seeds" / f"seed_{seed}" / "summary.json").read_text())
        costs = figures["seeds"][str(seed)]["costs"]
        for model, key in (("grown", "grown"), ("no growth", "baseline")):
            assert costs[model] == {"loss": summary[key]["final_loss"], "parameters": summary[key]["parameters"],
                                    "flops": summary[key]["flops"]["total"], "seconds": summary[key]["seconds"]}
    # The same directory again: refused in one line before anything runs.
    assert main(["run", "--epochs", "2", "--seeds", "2", "--run-dir", str(tmp_path / "seeds")]) == EXIT_USER_ERROR
    assert "already holds another run" in capsys.readouterr().err
    # Commands about one run name the seeds' runs.
    assert main(["export", str(tmp_path / "seeds")]) == EXIT_USER_ERROR
    assert f"holds a run over several seeds: name one of its runs, {tmp_path / 'seeds'}/seed_<s>" in \
        capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "seeds")]) == EXIT_USER_ERROR
    assert "holds a finished run over several seeds: nothing to resume" in capsys.readouterr().err


def test_one_seed_has_no_spread_and_says_so_rather_than_zero(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--max-train-samples", "150", "--epochs", "2", "--seeds", "1", "--no-from-scratch",
                 "--threads", "1", "--run-dir", str(tmp_path / "one")]) == 0
    out = capsys.readouterr().out
    assert "1 seed (0): mean ± std over the seeds" in out
    grown = next(line for line in out.splitlines() if line.strip().startswith("grown ") and "±" in line)
    assert grown.split()[2:4] == ["±", "n/a"] and "± 0.00" not in out
    assert " ± n/a points" in next(line for line in out.splitlines() if "grown - no growth" in line)
    figures = json.loads((tmp_path / "one" / "seeds.json").read_text())
    assert figures["differences"]["no growth"]["standard_error"] is None
    assert main(["report", str(tmp_path / "one")]) == 0
    assert "± n/a points (1 seed: " in capsys.readouterr().out


def test_run_over_no_seeds_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--seeds", "0"]) == EXIT_USER_ERROR
    assert "--seeds must be >= 1, got 0" in capsys.readouterr().err


def test_seeds_past_the_largest_seed_are_refused_before_any_plays(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`--seed 2**63-1 --seeds 2` played the first seed, then stopped with a traceback at the second."""
    run_dir = tmp_path / "seeds"
    assert main(["run", "--seed", str(2**63 - 1), "--seeds", "2", "--epochs", "1", "--threads", "1",
                 "--run-dir", str(run_dir)]) == EXIT_USER_ERROR
    assert capsys.readouterr().err.splitlines() == [
        "morphogen run: error: --seeds 2 from seed 9,223,372,036,854,775,807 goes past the largest seed, "
        "9,223,372,036,854,775,807"]
    assert not run_dir.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_device_this_machine_lacks_is_refused_before_the_run_directory_is_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each seed's run refused it, but after the run over seeds had written its plan into a new directory."""
    run_dir = tmp_path / "seeds"
    assert main(["run", "--seeds", "2", "--epochs", "1", "--threads", "1", "--device", "cuda",
                 "--run-dir", str(run_dir)]) == EXIT_USER_ERROR
    assert capsys.readouterr().err.startswith("morphogen run: error: device: 'cuda' requested but CUDA is not "
                                              "available here")
    assert not run_dir.exists()


#: A task of the user's own, as `--task user_seeds_task:make_task` names it: it draws its data from torch's global
#: generator, which `morphogen` seeds before calling it, and its host function is a lambda, which no worker process
#: could be sent.
USER_TASK = """
import torch
import morphogen

def make_task():
    x = torch.randn(240, 6)
    labels = (x.sum(1) > 0).long()
    net = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    task = morphogen.task_from_data("signs", (x[:180], labels[:180]), (x[180:], labels[180:]), num_classes=2)
    return task, lambda: morphogen.host_from_module(net, ["1"], example_input=x[:2])
"""


def _figures_of(run_dir: Path) -> dict[str, object]:
    figures = json.loads((run_dir / "seeds.json").read_text())
    for seed in figures["seeds"].values():
        seed.pop("run_dir")
        for costs in seed["costs"].values():
            costs.pop("seconds")  # wall time: the one figure no two runs share
    return figures  # type: ignore[no-any-return]


@pytest.mark.parametrize("task", ["digits", "user_seeds_task:make_task"])
def test_run_over_seeds_in_worker_processes_gives_the_figures_of_one_process(
        task: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`--jobs 2`: the same figures. A user's task whose optimizer table names no optimizer is loaded before the
    seeds run (to resolve the table), and its host is a lambda, which no worker could receive: each worker loads
    that task itself."""
    (tmp_path / "user_seeds_task.py").write_text(USER_TASK)
    (tmp_path / "lr.toml").write_text("[episode.optimizer]\nhost_lr = 0.05\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for jobs in ("1", "2"):
        size = ["--max-train-samples", "200"] if task == "digits" else []
        assert main(["run", "--task", task, *size, "--epochs", "3", "--seeds", "2", "--jobs", jobs,
                     "--no-from-scratch", "--threads", "1", "--config", "lr.toml",
                     "--run-dir", f"seeds{jobs}"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("seed 1: grown ") == 2
    assert _figures_of(tmp_path / "seeds1") == _figures_of(tmp_path / "seeds2")


def test_jobs_without_seeds_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--jobs", "2"]) == EXIT_USER_ERROR
    assert "--jobs plays the seeds of --seeds side by side; give --seeds N with it" in capsys.readouterr().err


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no `except Exception` catches it."""


def test_a_run_over_seeds_killed_in_a_seed_resumes_to_the_figures_of_one_that_was_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Killed in seed 1's grown run: `run --resume` reads seed 0 back, resumes seed 1 and plays seed 2."""
    argv = ["run", "--seeds", "3", "--epochs", "3", "--max-train-samples", "150", "--threads", "1",
            "--compare", "3x4=n_blocks=3,base_channels=4"]
    assert main([*argv, "--run-dir", str(tmp_path / "whole")]) == 0
    original, saves = run_module.save_training_state, 0

    def save_then_die(*args: Any, **kwargs: Any) -> None:
        nonlocal saves
        original(*args, **kwargs)
        saves += 1
        if saves == 3 * 3 + 2:  # seed 0's grown run, its twin and 3x4 (it grows nothing), then 2 epochs of seed 1
            raise Killed

    monkeypatch.setattr(run_module, "save_training_state", save_then_die)
    with pytest.raises(Killed):
        main([*argv, "--run-dir", str(tmp_path / "killed")])
    monkeypatch.undo()
    killed = tmp_path / "killed"
    assert (killed / "seed_0" / "summary.json").is_file() and not (killed / "seed_1" / "summary.json").exists()
    assert not (killed / "seed_2").exists() and not (killed / "seeds.json").exists()
    capsys.readouterr()
    assert main(["report", str(killed)]) == EXIT_USER_ERROR
    assert f"`morphogen run --resume {killed}` goes on with it" in capsys.readouterr().err
    assert main(["run", "--resume", str(killed), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert all(f"seed {seed}: grown " in out for seed in range(3)) and "grown - 3x4" in out
    assert _figures_of(killed) == _figures_of(tmp_path / "whole")
    assert main(["run", "--resume", str(killed), "--seeds", "2"]) == EXIT_USER_ERROR
    assert "only --device, --policy, --threads and --jobs may be given with it, not --seeds" in \
        capsys.readouterr().err


def test_a_seeds_directory_planted_as_a_link_is_refused_on_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A copied run over seeds may hold `seed_<s>` as a link to another directory: resuming would play that seed's
    run there. One line, exit 2, and the other directory stays empty."""
    original = run_module.save_training_state

    def save_then_die(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        raise Killed

    monkeypatch.setattr(run_module, "save_training_state", save_then_die)
    killed = tmp_path / "killed"
    with pytest.raises(Killed):
        main(["run", "--seeds", "2", "--epochs", "2", "--max-train-samples", "150", "--threads", "1",
              "--run-dir", str(killed)])
    monkeypatch.undo()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (killed / "seed_1").symlink_to(elsewhere)
    capsys.readouterr()
    assert main(["run", "--resume", str(killed), "--threads", "1"]) == EXIT_USER_ERROR
    assert capsys.readouterr().err == (f"morphogen run: error: {killed / 'seed_1'} is a symbolic link; morphogen "
                                       "does not write through links in a run directory (remove it)\n")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("accuracy", [10**400, "NaN", None, True, 1.7e308])
def test_a_finished_seeds_damaged_summary_is_one_line_on_resume(accuracy: object, tmp_path: Path) -> None:
    """A resume reads back finished seeds from their summary.json, an untrusted file: a figure that is not a finite
    number (an integer past the float range included), or one past 1e100 (whose mean over seeds overflowed), is a
    `ConfigError` naming the file, not a traceback."""
    from morphogen.config import ConfigError
    from morphogen.seeds_summary import SeedRun

    flops = {"training": 1, "shadow": 0, "validation": 1, "counterfactual": 0, "probe": 0}
    grown = {"final_accuracy": 90.0, "final_loss": 0.3, "parameters": 10, "host_parameters": 10, "seconds": 1.0,
             "episode_return": 0.0, "flops": flops}
    (tmp_path / "summary.json").write_text(json.dumps({"grown": grown, "baseline": grown}))
    assert SeedRun.read(tmp_path, from_scratch=False).grown.final_accuracy == 90.0
    (tmp_path / "summary.json").write_text(json.dumps({"grown": {**grown, "final_accuracy": accuracy}}))
    with pytest.raises(ConfigError, match=r"summary\.json: cannot be read as a finished run.s figures"):
        SeedRun.read(tmp_path, from_scratch=False)


def test_from_scratch_trainings_that_counted_no_flops_give_no_flops_ratio(tmp_path: Path) -> None:
    """Seeds read back from summary.json whose from-scratch training counted no FLOPs (nothing was kept: it is the
    no-growth one, as here): the figures over seeds show no ratio to them, as one seed's closing table shows none
    (it stopped on a ZeroDivisionError)."""
    from morphogen.seeds_summary import SeedRun, differences_of, seed_pairs, seeds_figures, summary_lines

    no_flops = {"training": 0, "shadow": 0, "validation": 0, "counterfactual": 0, "probe": 0}
    grown = {"final_accuracy": 90.0, "final_loss": 0.3, "parameters": 10, "host_parameters": 10, "seconds": 1.0,
             "episode_return": 0.0, "flops": {**no_flops, "training": 5}}
    runs = {}
    for seed in (0, 1):
        (tmp_path / f"seed_{seed}").mkdir()
        (tmp_path / f"seed_{seed}" / "summary.json").write_text(json.dumps(
            {"grown": grown, "baseline": {**grown, "flops": no_flops}, "from_scratch": None}))
        runs[seed] = SeedRun.read(tmp_path / f"seed_{seed}", from_scratch=True)
    pairs = seed_pairs(list(runs.values()))
    assert "from scratch" in pairs
    lines = summary_lines(runs, pairs, differences_of(pairs))
    assert not any("those of from scratch" in line for line in lines)
    assert seeds_figures(runs, differences_of(pairs))["flops_of_from_scratch"] is None


def test_a_run_over_seeds_of_a_policy_records_it_and_refuses_another_on_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from morphogen.commands.evaluate import DEFAULT_POLICY_FILE, policy_checksum
    from morphogen.control.checkpoint import load_checkpoint, save_checkpoint

    shipped = load_checkpoint(DEFAULT_POLICY_FILE)
    other = {key: value for key, value in shipped.items() if key not in ("format_version", "checksum")}
    name = next(key for key, tensor in other["policy"].items() if tensor.is_floating_point())
    other["policy"] = {**other["policy"], name: other["policy"][name] + 0.5}
    save_checkpoint(other, tmp_path / "other.pt")
    original, saves = run_module.save_training_state, 0

    def save_then_die(*args: Any, **kwargs: Any) -> None:
        nonlocal saves
        original(*args, **kwargs)
        saves += 1
        if saves == 3:  # seed 0's two epochs, then one of seed 1
            raise Killed

    run = tmp_path / "seeds"
    monkeypatch.setattr(run_module, "save_training_state", save_then_die)
    with pytest.raises(Killed):
        main(["run", "--policy", "default", "--max-train-samples", "200", "--epochs", "2", "--seeds", "2",
              "--no-baseline", "--no-from-scratch", "--threads", "1", "--run-dir", str(run)])
    monkeypatch.undo()
    plan = json.loads((run / "seeds_plan.json").read_text())["config"]
    assert (plan["policy"], plan["policy_checksum"]) == ("default", policy_checksum(shipped))
    capsys.readouterr()
    assert main(["run", "--resume", str(run), "--policy", str(tmp_path / "other.pt")]) == EXIT_USER_ERROR
    assert f"the run over seeds in {run} was played by policy default (weights {policy_checksum(shipped)[:12]}), " \
        f"not by policy {tmp_path / 'other.pt'} (weights {policy_checksum(other)[:12]})" in capsys.readouterr().err
    assert main(["run", "--resume", str(run), "--threads", "1"]) == 0
    assert json.loads((run / "seed_1" / "summary.json").read_text())["controller"] == "policy"


def test_the_figures_over_seeds_of_a_task_with_its_own_loss_show_the_loss_once_in_its_own_units(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A regression scored by its negated mean squared error: the closing table over seeds has one "val loss" column
    (not the loss twice), its differences read in the loss, not in nats, and `report` of the run over seeds names
    the loss as what its table holds."""
    from morphogen.seeds_summary import SeedRun, differences_of, seed_pairs, seeds_figures, summary_lines

    flops = {"training": 1, "shadow": 0, "validation": 1, "counterfactual": 0, "probe": 0}
    runs = {}
    for seed, (grown_loss, baseline_loss) in enumerate(((2.5, 3.0), (2.0, 2.2))):
        def figures(loss: float) -> dict[str, object]:
            return {"final_accuracy": -loss, "final_loss": loss, "parameters": 10, "host_parameters": 10,
                    "seconds": 1.0, "episode_return": 0.0, "flops": flops}
        (tmp_path / f"seed_{seed}").mkdir()
        (tmp_path / f"seed_{seed}" / "summary.json").write_text(json.dumps(
            {"grown": figures(grown_loss), "baseline": figures(baseline_loss),
             "score": {"name": "negative loss", "criterion": "relative_loss"}}))
        runs[seed] = SeedRun.read(tmp_path / f"seed_{seed}", from_scratch=False)
    pairs = seed_pairs(list(runs.values()))
    differences = differences_of(pairs)
    lines = summary_lines(runs, pairs, differences)
    header = next(line for line in lines if "parameters" in line)
    assert header.split() == ["val", "loss", "parameters", "training", "FLOPs", "seconds"]
    grown = next(line for line in lines if line.startswith("  grown "))
    assert grown.split()[1:4] == ["2.2500", "±", "0.3536"] and grown.split()[4] == "10"
    difference = next(line for line in lines if "grown - no growth" in line)
    assert "-0.3500 ± 0.1500 in loss" in difference and "nats" not in difference
    (tmp_path / "seeds.json").write_text(json.dumps(seeds_figures(runs, differences)))
    assert main(["report", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    assert report.splitlines()[0] == f"run over 2 seeds {tmp_path}: final validation loss by seed"
    assert "-0.3500 ± 0.1500 in loss (2 seeds: 2 ahead, 0 behind)" in report and "nats" not in report


def test_grow_over_seeds_reads_a_tilde_as_the_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import morphogen.over_seeds as over_seeds
    from morphogen.data import load_task

    monkeypatch.setenv("HOME", str(tmp_path))
    where: list[Any] = []
    monkeypatch.setattr(over_seeds, "play_over_seeds", lambda play, seeds, run_dir, runs_root, *rest, **options:
                        where.append((run_dir, runs_root)))
    over_seeds.grow_over_seeds(load_task("digits", max_train_samples=100), seeds=1, run_dir="~/seeds",
                               runs_root="~/runs")
    assert where == [(f"{tmp_path}/seeds", f"{tmp_path}/runs")]
