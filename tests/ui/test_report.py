"""`morphogen report` tells a run's story from its run directory alone."""

from __future__ import annotations

import html
import json
import shutil

import pytest

from morphogen.cli import main
from morphogen.run_directory import evaluation_env_id
from morphogen.telemetry.events import ActionTaken, EpochCompleted, RewardComputed, SlotState
from morphogen.ui.html_report import render_html
from morphogen.ui.run_files import load_run_files


def test_report_of_a_run_shows_epochs_seeds_and_the_comparison(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["run", "--epochs", "4", "--max-train-samples", "150", "--slots", "r0c1", "--run-dir", str(run_dir)]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 0
    report = capsys.readouterr().out
    assert report.startswith(f"run {run_dir}: task digits, seed 0")
    assert "epochs (env 0):" in report and report.count("WAIT") + report.count("GERMINATE") >= 4
    assert "seeds" in report
    assert "reward by component" not in report, "the heuristic never reads a reward: its run shows none"
    assert "health: no rollbacks, no anomalies" in report
    assert "no growth" in report and "time by phase" in report
    # Every model's training FLOPs; four epochs grow nothing, so from scratch is no growth, as the run says.
    assert "FLOP in " in report and report.rstrip().endswith(
        " s (nothing kept: the final architecture is the host, so these are no growth's figures)")


def test_report_of_a_training_run_lists_its_rounds(tmp_path, capsys):
    run_dir = tmp_path / "train"
    args = ["train", "--envs", "2", "--rounds", "2", "--episode-length", "3", "--max-train-samples", "150",
            "--hidden-size", "16", "--run-dir", str(run_dir)]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 0
    report = capsys.readouterr().out
    rounds = report[report.index("rounds:"):].splitlines()
    assert rounds[2].split()[0] == "1" and rounds[3].split()[0] == "2"
    assert "reward by component" in report and "terminal" in report, "a reward steered the policy: it is shown"


def test_report_of_something_that_is_not_a_run_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert main(["report", str(tmp_path)]) == 2  # a directory, but no events.jsonl
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(line.startswith("morphogen report: error:") for line in errors)
    assert "events.jsonl" in errors[1]
    (tmp_path / "runs" / "one").mkdir(parents=True)
    (tmp_path / "runs" / "one" / "events.jsonl").write_text("")
    assert main(["report", str(tmp_path / "runs")]) == 2  # the runs root, not one of its runs
    assert capsys.readouterr().err.strip().endswith("is a directory of runs, not one run: name one of them "
                                                    f"({tmp_path / 'runs'}/<run>), or list them with `morphogen runs "
                                                    f"{tmp_path / 'runs'}`")


def test_training_report_has_round_and_env_columns(trained_run, capsys):
    assert main(["report", str(trained_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    episodes = lines[lines.index("episodes:") + 2:][:4]
    assert [row.split()[:2] for row in episodes] == [["1", "0"], ["1", "1"], ["2", "0"], ["2", "1"]]
    epochs = lines[lines.index("epochs of round 2 (env 0):") + 2:][:4]
    assert [row.split()[:3] for row in epochs] == [["2", "0", str(epoch)] for epoch in range(1, 5)]


def test_the_rounds_table_heads_its_ppo_columns_in_words(trained_run, capsys):
    """`kl` and `ev` are the trainer's shorthand; a reader of the report is told what the columns are."""
    assert main(["report", str(trained_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[lines.index("rounds:") + 1]
    assert header.split("  ")[-3:] == ["approx KL", "explained variance", "seconds"] and "params added" in header
    first = lines[lines.index("rounds:") + 2]
    assert len(first) == len(header) and first.split()[0] == "1"  # the figures stand under their headers


def test_report_of_a_regression_shows_the_loss_and_shares_of_it(tmp_path, capsys):
    import io

    import torch

    import morphogen

    torch.manual_seed(0)
    x = torch.randn(400, 6)
    y = torch.sin(2 * x[:, :3]).sum(1, keepdim=True)  # (400, 1)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    host = morphogen.host_from_module(net, ["1"], example_input=x[:2])
    task = morphogen.task_from_data("sines", (x[:300], y[:300]), (x[300:], y[300:]), loss=torch.nn.functional.mse_loss)
    run_dir = tmp_path / "run"
    morphogen.grow(task, host, epochs=3, run_dir=str(run_dir), out=io.StringIO())
    assert main(["report", str(run_dir)]) == 0
    report = capsys.readouterr().out
    epochs = report[report.index("epochs (env 0):"):].splitlines()
    assert epochs[1].split()[:4] == ["env", "epoch", "val", "loss"]  # no negated loss beside the loss
    assert "%" not in "\n".join(epochs[:5])
    comparison = report.rstrip().splitlines()[-1]
    assert comparison.startswith("grown loss ") and "no growth loss " in comparison


def test_the_score_a_summary_names_is_read_with_bounds() -> None:
    from morphogen.telemetry.story import SeedStory
    from morphogen.ui.run_files import ScoreKind, score_kind

    assert score_kind(None) == ScoreKind() == score_kind({"score": "accuracy"})
    assert score_kind({"score": {"name": "R2", "criterion": "relative_loss"}}) == ScoreKind("R2", "relative_loss")
    # Untrusted: a name too long or not a string, an unknown criterion, read as the defaults.
    assert score_kind({"score": {"name": "x" * 101, "criterion": "rm -rf"}}) == ScoreKind()
    assert score_kind({"score": {"name": 3, "criterion": None}}) == ScoreKind()
    story = SeedStory(0, "r0c0", "wider", 1, contribution=1.5, loss_contribution=0.02,
                      relative_loss_contribution=0.04)
    assert ScoreKind().contribution(story) == "+1.50 pts"
    assert ScoreKind("accuracy", "loss").contribution(story) == "+0.0200 nats"
    assert ScoreKind("negative loss", "relative_loss").contribution(story) == "+4.00% of loss"
    assert ScoreKind("R2", "relative_loss").format(0.98765) == "0.9877" and ScoreKind().format(97.5) == "97.50%"


def test_a_refused_action_shows_the_gates_words_and_a_reasonless_one_still_reads_refused(tmp_path, capsys):
    slots = (SlotState("r0c1", "TRAINING", "wider", 0.0),)
    events = [
        ActionTaken(22, 0, "ADVANCE", "r0c1", None, False, "blended in, the seed would add +0.0023 nats < 0.005"),
        EpochCompleted(22, 0, 0.3, 0.29, 91.8, 1594, slots, "ADVANCE r0c1", False),
        EpochCompleted(23, 0, 0.3, 0.28, 92.4, 1594, slots, "ADVANCE r0c1", False),  # its reason was not recorded
        ActionTaken(24, 0, "PRUNE", "r0c1", None, True, "pruned r0c1"),
        EpochCompleted(24, 0, 0.3, 0.28, 92.6, 1594, slots, "PRUNE r0c1", True),
    ]
    lines = [json.dumps({"time": 1.0 + index, **event.to_dict()}) for index, event in enumerate(events)]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(tmp_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "r0c1" in line]
    assert rows[0].endswith("ADVANCE r0c1  (refused: blended in, the seed would add +0.0023 nats < 0.005)")
    assert rows[1].endswith("ADVANCE r0c1  (refused)") and rows[2].endswith("PRUNE r0c1")


def _report_of_one_advance(tmp_path, capsys, reason: str, succeeded: bool) -> list[str]:
    """The lines of `report` on a run of one ADVANCE of r0c1 for `reason`, that took effect if `succeeded`."""
    slots = (SlotState("r0c1", "TRAINING", "wider", 0.0),)
    events = [ActionTaken(22, 0, "ADVANCE", "r0c1", None, succeeded, reason),
              EpochCompleted(22, 0, 0.3, 0.29, 91.8, 1594, slots, "ADVANCE r0c1", succeeded)]
    lines = [json.dumps({"time": 1.0 + index, **event.to_dict()}) for index, event in enumerate(events)]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(tmp_path)]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("succeeded", [True, False], ids=["taken", "refused"])
def test_a_long_reason_wraps_whole_under_itself_within_the_line_width(tmp_path, capsys, succeeded):
    words = [f"figure{index}=+0.{index:04d}" for index in range(22)]
    reason = "blended in: " + " ".join(words)  # about 300 characters: the gate's figures last
    assert len(reason) >= 300
    lines = _report_of_one_advance(tmp_path, capsys, reason, succeeded)
    first = next(index for index, line in enumerate(lines) if "ADVANCE r0c1" in line)
    row = lines[first:first + 1 + next(index for index, line in enumerate(lines[first + 1:]) if not line.strip())]
    assert len(row) > 2 and all(len(line) <= 150 for line in row)
    column = row[0].index("blended in")
    assert all(line[:column].isspace() and not line[column].isspace() for line in row[1:])  # under the reason
    shown = " ".join(line.strip() for line in row)
    assert shown.endswith(f"{words[-1]})") and all(f" {word}" in shown for word in words) and "…" not in shown


def test_a_hostile_reason_is_escaped_whole_on_every_line_it_wraps_onto(tmp_path, capsys):
    # Sequences between spaces, then one word of 60 escapes, wider than a line, which must break between them.
    reason = "refused: " + "\x1b]52;c;aGk=\x07\x1b[2J " * 12 + "\x1b" * 60 + "\u202eend"
    lines = _report_of_one_advance(tmp_path, capsys, reason, False)
    out = "\n".join(lines)
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    row = [line for line in lines if "\\x1b" in line or "ADVANCE r0c1" in line]
    assert len(row) > 2 and all(len(line) <= 150 for line in row)
    shown = "".join(line.strip() for line in row)
    assert shown.count("\\x1b]52;c;aGk=\\x07\\x1b[2J") == 12 and shown.endswith("\\x1b" * 60 + "\\u202eend)")
    assert all(not line.rstrip().endswith("\\") for line in row)  # no escape split across lines


def test_a_stopped_run_of_a_task_with_its_own_metric_reads_the_metric_config_json_names(tmp_path, capsys):
    """A heuristic `run` that stopped before writing summary.json (diverged, killed): its epoch table names the
    task's metric as config.json does, in its own units and whole, not as a percent accuracy, and it is shown no
    reward, as the dashboard reads it from the same config."""
    config = {"task": "my_task:make_task", "task_name": "sinreg", "task_metric": "mean abs error", "policy": None,
              "episode": {"slots": {"gates": {"criterion": "relative_loss"}}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    events = [EpochCompleted(1, 0, 105.0, 113.77, 9.968, 153, (), "WAIT", True),
              RewardComputed(1, 0, -1.0, (("rollback", -1.0),))]
    lines = [json.dumps({"time": 1.0 + index, **event.to_dict()}) for index, event in enumerate(events)]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    epochs = report[report.index("epochs (env 0):"):].splitlines()
    assert epochs[1].split()[:7] == ["env", "epoch", "val", "mean", "abs", "error", "val"]
    assert epochs[2].split()[:4] == ["0", "1", "9.968", "113.7700"] and "%" not in epochs[2]
    assert "reward by component" not in report, "config.json names no policy: the heuristic read no reward"

    from morphogen.ui.run_files import ScoreKind, load_run_files
    assert load_run_files(tmp_path).score == ScoreKind("mean abs error", "relative_loss")


def test_report_of_a_run_over_seeds_shows_each_seed_and_the_differences(tmp_path, capsys):
    """`report` of `run --seeds`: each seed's scores as seeds.json keeps them, the paired differences, and the hosts
    compared with, also in each seed's own report; `report --html` names the seeds' runs instead."""
    run_dir = tmp_path / "seeds"
    assert main(["run", "--seeds", "2", "--epochs", "2", "--max-train-samples", "150", "--no-from-scratch",
                 "--compare", "3x4=n_blocks=3,base_channels=4", "--threads", "1", "--run-dir", str(run_dir)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert main(["report", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    figures = json.loads((run_dir / "seeds.json").read_text())
    # The run's closing table (score and validation loss as mean ± std, parameters, FLOPs, seconds), to the digit.
    header = next(index for index, line in enumerate(printed) if "val loss" in line)
    table = printed[header:header + 4]
    assert [line.split()[0] for line in table[1:]] == ["grown", "no", "3x4"]
    assert lines[lines.index(table[0]):lines.index(table[0]) + 4] == table
    assert lines[0] == f"run over 2 seeds {run_dir}: final validation accuracy by seed"
    assert lines[2].split() == ["seed", "grown", "no", "growth", "3x4"]
    for seed in ("0", "1"):
        scores = figures["seeds"][seed]
        row = next(line.split() for line in lines if line.split()[:1] == [seed])
        assert row == [seed, f"{scores['grown']:.2f}%", f"{scores['no growth']:.2f}%", f"{scores['fixed']['3x4']:.2f}%"]
    means = next(line.split() for line in lines if line.split()[:1] == ["mean"])
    assert means[1] == f"{(figures['seeds']['0']['grown'] + figures['seeds']['1']['grown']) / 2:.2f}%"
    mean = figures["differences"]["3x4"]["mean"]
    assert any(line.split()[:4] == ["grown", "-", "3x4", f"{mean:+.2f}"] for line in lines)
    # What dominates the grown model, from the figures the file holds.
    verdicts = figures["dominated_by"]
    for cost, words in (("parameters", "in parameters"), ("training_flops", "in training FLOPs")):
        line = next(line for line in lines if line.startswith(f"  {words} "))
        assert line.endswith(f"dominated by {', '.join(verdicts[cost])}" if verdicts[cost] else "any model here")
    assert lines[-1] == f"each seed's run: morphogen report {run_dir}/seed_<s>"
    assert main(["report", str(run_dir / "seed_1")]) == 0
    assert "; 3x4 " in capsys.readouterr().out
    assert main(["report", "--html", str(run_dir)]) == 2
    assert f"{run_dir} holds a run over several seeds (seeds.json): name one of its runs" in capsys.readouterr().err


def test_a_damaged_seeds_file_reads_what_it_can_and_escapes_every_string(tmp_path, capsys):
    run_dir = tmp_path / "seeds"
    run_dir.mkdir()
    hostile = "\x1b[2Jx[bold]"
    (run_dir / "seeds.json").write_text(json.dumps({
        "score": {"name": ["not", "a", "name"]},
        "seeds": {"0": {"grown": 91.5, "no growth": "NaN", "fixed": {hostile: 90.0, "x" * 500: 1.0}},
                  "1": {"grown": 10**400, "no growth": 88.0, "fixed": [1, 2]}, "2": "not a table", hostile: {}},
        "differences": {"no growth": {"mean": 1.5, "standard_error": None}, hostile: {"mean": -0.25,
                                                                                      "standard_error": 0.5}}}))
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "x" * 100 not in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[3:6] if line.strip()}
    assert rows["0"][:2] == ["91.50%", "-"] and rows["1"][:2] == ["-", "88.00%"]
    # The differences come from the scores shown, never from the file's own summary of them (-0.25 there).
    assert "grown - \\x1b[2Jx[bold]" in out and "+1.50 ± n/a points (1 seed: 1 ahead, 0 behind)" in out
    assert "-0.25" not in out
    assert "grown - no growth" not in out  # no seed has both scores
    (run_dir / "seeds.json").write_text("[1, 2")
    assert main(["report", str(run_dir)]) == 2
    assert "seeds.json cannot be read" in capsys.readouterr().err


def test_figures_of_a_seeds_file_past_1e100_read_as_missing(tmp_path, capsys):
    """Finite figures too large for any score or cost (an edited seeds.json): shown as "-", not a traceback of an
    OverflowError in their mean."""
    run_dir = tmp_path / "seeds"
    run_dir.mkdir()
    costs = {"grown": {"parameters": 10, "flops": 1.7e308}, "no growth": {"parameters": 1.7e308, "flops": 100}}
    (run_dir / "seeds.json").write_text(json.dumps({"seeds": {
        seed: {"grown": 1.7e308, "no growth": 80.0 + index, "costs": costs} for index, seed in enumerate("01")}}))
    assert main(["report", str(run_dir)]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:] if line.strip()}
    assert rows["0"] == ["-", "80.00%"] and rows["1"] == ["-", "81.00%"] and rows["mean"] == ["-", "80.50%"]
    assert rows["grown"] == ["-", "-", "10", "-", "-"]
    assert rows["no"] == ["growth", "80.50", "±", "0.71", "-", "-", "100", "FLOP", "-"]


def test_a_run_over_seeds_reports_the_loss_and_seconds_its_table_printed(tmp_path, capsys):
    """`run --seeds` printed each model's validation loss and seconds; `report` left them out."""
    run_dir = tmp_path / "seeds"
    run_dir.mkdir()
    costs = [{"grown": {"loss": 0.5241, "parameters": 1442, "flops": 1237650048, "seconds": 0.558},
              "no growth": {"loss": 0.5241, "parameters": 1442, "flops": 1237650048, "seconds": 0.523}},
             {"grown": {"loss": 0.5065, "parameters": 1442, "flops": 1237650048, "seconds": 0.484},
              "no growth": {"loss": 0.5065, "parameters": 1442, "flops": 1237650048, "seconds": 0.400}}]
    (run_dir / "seeds.json").write_text(json.dumps({"score": {"name": "accuracy"}, "seeds": {
        seed: {"grown": 89.44 + index, "no growth": 89.44, "costs": costs[index]} for index, seed in enumerate("01")}}))
    assert main(["report", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(index for index, line in enumerate(lines) if "val loss" in line)
    assert lines[header].split() == ["val", "accuracy", "val", "loss", "parameters", "training", "FLOPs", "seconds"]
    assert lines[header + 1].split() == ["grown", "89.94", "±", "0.71", "0.5153", "±", "0.0124", "1,442", "1.24",
                                         "GFLOP", "0.5s"]
    assert lines[header + 2].split()[:2] == ["no", "growth"] and lines[header + 2].split()[-1] == "0.5s"


def test_a_run_whose_events_were_lost_names_the_seeds_its_summary_lists(grown_run, tmp_path, capsys):
    import shutil

    run = shutil.copytree(grown_run, tmp_path / "run")
    (run / "events.jsonl").write_text("")  # cut short: no event left to tell the seeds' stories
    summary = json.loads((run / "summary.json").read_text())
    summary["grown"]["seeds"] = [{"slot": "r0c0", "blueprint": "wider", "outcome": "fossilized"},
                                 {"slot": "r0c1", "blueprint": "\x1b[31mwider", "outcome": "pruned"}]
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(run)]) == 0
    report = capsys.readouterr().out
    assert "seeds: none in the events that could be read; summary.json names 2: wider in r0c0 (fossilized)" in report
    assert "none germinated" not in report and "\x1b" not in report  # escaped, as every string of a run


def test_report_of_a_run_without_telemetry_prints_its_summary_and_claims_nothing_else(tmp_path, capsys):
    # `--telemetry off` writes config.json and summary.json but no events: the report says what the summary
    # holds (the seeds it names, the comparison) and does not claim a clean health record it never saw.
    run_dir = tmp_path / "quiet"
    config = tmp_path / "quick.toml"
    config.write_text("max_train_samples = 200\n[episode]\nmax_epochs = 8\n[episode.slots.gates]\nmode = 'permissive'\n"
                      "min_training_epochs = 2\n[heuristic]\nwarmup_epochs = 1\nplateau_epochs = 1\n"
                      "plateau_threshold = 100.0\nmin_training_epochs = 2\n")
    assert main(["run", "--config", str(config), "--telemetry", "off", "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    assert not (run_dir / "events.jsonl").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert main(["report", str(run_dir)]) == 0
    report = capsys.readouterr().out
    assert report.startswith(f"run {run_dir}: task digits, seed 0, 0 events (no events.jsonl: made with "
                             "--telemetry off, its figures are summary.json's)")
    assert "seeds: no events written; summary.json names" in report
    assert f"grown {summary['grown']['final_accuracy']:.2f}%" in report
    assert "health" not in report
    assert main(["report", str(run_dir), "--html"]) == 2  # the page is drawn from events
    error = capsys.readouterr().err.strip()
    assert error.endswith("it was made with --telemetry off, so only `morphogen report "
                          f"{run_dir}` (its summary.json, as text) and `morphogen runs` read it")


def test_report_says_why_the_controller_acted_and_a_run_that_grew_nothing_says_why(grown_run, tmp_path, capsys):
    assert main(["report", str(grown_run)]) == 0
    rows = capsys.readouterr().out.splitlines()
    germinated = next(row for row in rows if " GERMINATE " in row)
    assert "  (germinated " in germinated and ": " in germinated.split("(germinated ", 1)[1]
    assert any(" WAIT  (waited: " in row for row in rows)
    # Eight epochs are too few for the default heuristic to grow: the run says why, not only that it did not.
    assert main(["run", "--epochs", "8", "--max-train-samples", "150", "--no-baseline", "--no-from-scratch",
                 "--threads", "1", "--run-dir", str(tmp_path / "short")]) == 0
    out = capsys.readouterr().out
    assert "none germinated (last epoch: waited: 1 epoch left, fewer than the 7 a seed needs to reach the output)" \
        in " ".join(out.split())


def test_a_run_that_kept_no_seed_gives_no_growths_figures_as_from_scratch_marked_nothing_kept(
        grown_run, tmp_path, capsys):
    # Its final architecture is the host: the run's seed lines and seeds.json give the no-growth figure for it.
    import shutil

    run = shutil.copytree(grown_run, tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["from_scratch"] = None
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(run)]) == 0
    closing = capsys.readouterr().out.rstrip().splitlines()[-1]
    baseline = summary["baseline"]
    assert (f"; from scratch {baseline['final_accuracy']:.2f}% with {baseline['parameters']:,} parameters and "
            in closing) and closing.endswith(" (nothing kept: the final architecture is the host, so these are no "
                                             "growth's figures)")


def test_an_event_whose_time_is_past_1e100_is_a_skipped_line(grown_run, tmp_path, capsys):
    """No clock reads 1e200 seconds: such a line is skipped and counted like one whose time is not a number."""
    run = tmp_path / "run"
    shutil.copytree(grown_run, run)
    records = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    records[1]["time"] = 1e200
    (run / "events.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    assert main(["report", str(run)]) == 0
    assert "(1 line skipped)" in capsys.readouterr().out.splitlines()[0]


def test_report_of_an_evaluation_names_the_controller_and_episode_of_each_env(tmp_path, capsys):
    """eval numbers its envs controller by controller (`evaluation_env_id`); its eval.json names the controllers
    in that order and config.json the episodes of each, so the report can say which env is which."""
    run_dir = tmp_path / "eval"
    assert main(["eval", "--policy", "default", "--episodes", "2", "--episode-length", "2", "--max-train-samples",
                 "150", "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "epochs (env 0, learned episode 1):" in out
    # The reward per controller, not the three controllers' rewards added up.
    assert "reward by component (per episode, mean over each controller's episodes; each episode's own reward, " \
        "nothing subtracted):" in out
    assert [line.split()[0] for line in out.splitlines() if line.startswith("  ") and "rent" in line] == [
        "learned", "heuristic", "no"]
    page = render_html(run_dir)
    assert "reward by component (env 0, learned episode 1)" in page
    files = load_run_files(run_dir)
    assert files.evaluation is not None
    labels = [files.evaluation.label(evaluation_env_id(position, index, 2)) for position in range(3)
              for index in range(2)]
    assert labels == ["env 0, learned episode 1", "env 1, learned episode 2", "env 2, heuristic episode 1",
                      "env 3, heuristic episode 2", "env 4, no growth episode 1", "env 5, no growth episode 2"]
    assert files.evaluation.label(6) == "env 6" and files.evaluation.label(-1) == "env -1"
    (run_dir / "eval.json").write_text('[{"name": ' + "[" * 100_000 + "]}]")  # damaged: bare ids, no error
    assert load_run_files(run_dir).evaluation is None
    assert main(["report", str(run_dir)]) == 0 and "epochs (env 0):" in capsys.readouterr().out


def test_a_run_stopped_before_its_summary_says_so_in_one_line_in_report_runs_and_html(grown_run, tmp_path, capsys):
    """Killed after epoch 3 of 8: every view says no summary.json follows and how far the events reach, instead of
    ending without final figures and no word why."""
    from morphogen.ui.runs import query_runs

    run = shutil.copytree(grown_run, tmp_path / "runs" / "stopped")
    (run / "summary.json").unlink()
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    fourth_epoch = [i for i, line in enumerate(lines) if '"epoch_completed"' in line][3]
    (run / "events.jsonl").write_text("".join(lines[:fourth_epoch]))
    note = "no summary.json: the run stopped, or is still going, after epoch 3 of 8"
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(f" events ({note})")
    assert query_runs(tmp_path / "runs")[2] == [f"run stopped: {note}"]
    assert f"({note})</p>" in render_html(run)
    assert load_run_files(grown_run).damage_note() is None  # a finished run has nothing to say


def test_report_of_an_evaluation_ends_with_each_controllers_means_as_eval_printed_them(tmp_path, capsys):
    """The result of an evaluation is its table: each controller's mean final accuracy and parameters added over its
    episodes, from eval.json (a figure that is not a finite number leaves that controller out), in text and HTML."""
    (tmp_path / "config.json").write_text(json.dumps({"policy": "default", "task": "digits", "episodes": 2}))
    events = [EpochCompleted(1, env, 1.0, 1.0, 90.0, 1442, (), "WAIT", True) for env in range(6)]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps({"time": 1.0, **e.to_dict()}) + "\n" for e in events))
    table = [{"name": "learned", "accuracies": [95.0, 96.5], "added": [1240.0, 0.0]},
             {"name": "heuristic", "accuracies": [94.0, 95.0], "added": [1240.0, 1240.0]},
             {"name": "no growth", "accuracies": [93.0, "NaN"], "added": [0.0, 0.0]}]
    (tmp_path / "eval.json").write_text(json.dumps(table))
    assert main(["report", str(tmp_path)]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == (
        "evaluation (eval.json, means over 2 episodes each): learned 95.75% adding 620 parameters; heuristic 94.50% "
        "adding 1,240 parameters")
    page = render_html(tmp_path)
    assert "<title>morphogen evaluation: digits</title>" in page
    assert "<tr><td>learned</td><td class='num'>95.75%</td><td class='num'>620</td></tr>" in page
    assert "<td>no growth</td>" not in page


def test_the_closing_line_gives_each_models_wall_time_as_the_runs_table_does(grown_run, tmp_path, capsys):
    """`run`'s table, the HTML report and `runs` give each training's seconds; the text report's last line gave none."""
    run = shutil.copytree(grown_run, tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["grown"]["seconds"], summary["baseline"]["seconds"] = 12.345, 3.21
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(run)]) == 0
    closing = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert closing.startswith("grown ") and "FLOP in 12.3 s; no growth " in closing
    assert closing.split("; ")[1].endswith("FLOP in 3.2 s")


def test_time_by_phase_reads_as_the_phase_table_run_printed(tmp_path, capsys):
    """In the order (train, validate, act, update, then the rest) and to the milliseconds of `run`'s phase table;
    in the events' order to a tenth of a second, `act 0.0 s` hid what the table gave as 0.002."""
    from morphogen.telemetry.events import PhaseTimes

    (tmp_path / "config.json").write_text(json.dumps({"task": "digits", "policy": None}))
    events = [EpochCompleted(1, 0, 1.0, 1.0, 50.0, 10, (), "WAIT", True),
              PhaseTimes(1, 0, (("validate", 0.185), ("probe", 0.06), ("train", 4.0421), ("act", 0.0024)))]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps({"time": 1.0, **e.to_dict()}) + "\n" for e in events))
    assert main(["report", str(tmp_path)]) == 0
    assert "time by phase: train 4.042 s, validate 0.185 s, act 0.002 s, probe 0.060 s" in capsys.readouterr().out


def test_a_run_recorded_at_minimal_telemetry_says_so_instead_of_reading_as_damaged(grown_run, tmp_path, capsys):
    """At `--telemetry minimal` no action, stage change or counterfactual is written: the report said its seeds were
    "none in the events that could be read", as if lines were lost, and gave no reason for any action."""
    run = shutil.copytree(grown_run, tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["telemetry"]["level"] = "minimal"
    (run / "config.json").write_text(json.dumps(config))
    normal = ('"action_taken"', '"stage_transition"', '"counterfactual_measured"')
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    (run / "events.jsonl").write_text("".join(line for line in lines if not any(kind in line for kind in normal)))
    note = "recorded at --telemetry minimal: no actions' reasons, stage changes or seed measurements"
    assert main(["report", str(run)]) == 0
    report = capsys.readouterr().out
    assert report.splitlines()[0].endswith(f" events ({note})")
    assert "seeds: not recorded at --telemetry minimal; summary.json names " in report
    assert f"({html.escape(note)})</p>" in render_html(run)
    assert load_run_files(grown_run).recording_note is None


def test_an_evaluations_rewards_are_each_episodes_own_and_its_return_over_no_growth_is_trains_figure(
        tmp_path, capsys):
    """An eval episode's terminal reward is the whole final accuracy (0.5 per point in the shipped policy's reward),
    while `train --paired-baseline` reports a round's return net of a no-growth twin's: the report says the first
    is nothing subtracted and gives the second, learned minus no growth on the same seed."""
    (tmp_path / "config.json").write_text(json.dumps({"policy": "default", "task": "digits", "episodes": 2}))
    # (env id, terminal, rent): learned episodes 1-2, heuristic 1-2, no growth 1-2 (`evaluation_env_id`).
    finals = [(0, 47.5, -0.25), (1, 48.0, -0.25), (2, 47.0, -0.25), (3, 47.75, -0.5), (4, 47.0, 0.0), (5, 47.25, 0.0)]
    events = [RewardComputed(2, env, terminal + rent, (("terminal", terminal), ("rent", rent), ("rollback", 0.0)))
              for env, terminal, rent in finals]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps({"time": 1.0, **e.to_dict()}) + "\n" for e in events))
    table = [{"name": name, "accuracies": [95.0, 96.0], "added": [0.0, 0.0]}
             for name in ("learned", "heuristic", "no growth")]
    (tmp_path / "eval.json").write_text(json.dumps(table))
    assert main(["report", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    heading = next(index for index, line in enumerate(lines) if line.startswith("reward by component"))
    assert "each episode's own reward, nothing subtracted" in lines[heading]
    assert lines[heading + 1].split() == ["learned", "terminal", "+47.750", "rent", "-0.250", "rollback", "+0.000"]
    # learned: (47.25 - 47.0 + 47.75 - 47.25) / 2; heuristic: (46.75 - 47.0 + 47.25 - 47.25) / 2.
    assert lines[heading + 4].startswith("return over no growth on the same seed (")
    assert lines[heading + 4].endswith("paired_baseline): learned +0.375  heuristic -0.125")


def test_a_paired_training_runs_report_says_its_rounds_return_is_net_of_the_twin(trained_run, tmp_path, capsys):
    """With `paired_baseline` the rounds' return subtracts each env's no-growth twin's, the episodes' returns and the
    reward by component do not: the report says which is which (and says nothing of a twin in a run without one)."""
    assert main(["report", str(trained_run)]) == 0
    unpaired = capsys.readouterr().out
    assert "twin" not in unpaired
    run = shutil.copytree(trained_run, tmp_path / "paired")
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "paired_baseline": True}))
    assert main(["report", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert next(line for line in lines if line.startswith("reward by component")).startswith(
        "reward by component (summed over all envs and epochs; each env's own reward, before its no-growth twin's "
        "is subtracted): contribution ")
    rounds = lines[lines.index("rounds:"):]
    assert rounds[4].startswith("  (return: mean over the round's envs of each episode's return minus its no-growth "
                                "twin's (paired_baseline)")
    assert "reward by component (per episode, mean over envs; each env&#x27;s own, its no-growth twin&#x27;s not " \
        "subtracted)" in render_html(run) and "twin" not in render_html(trained_run)
