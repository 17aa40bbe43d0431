"""`morphogen report` tells a run's story from its run directory alone."""

from __future__ import annotations

from morphogen.cli import main


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
    assert "FLOP;" in report and report.rstrip().endswith("FLOP")  # both models' training FLOPs


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


def test_training_report_has_round_and_env_columns(trained_run, capsys):
    assert main(["report", str(trained_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    episodes = lines[lines.index("episodes:") + 2:][:4]
    assert [row.split()[:2] for row in episodes] == [["1", "0"], ["1", "1"], ["2", "0"], ["2", "1"]]
    epochs = lines[lines.index("epochs of round 2 (env 0):") + 2:][:4]
    assert [row.split()[:3] for row in epochs] == [["2", "0", str(epoch)] for epoch in range(1, 5)]
