"""`morphogen report RUN_DIR --html`: one self-contained page whose figures a real browser draws."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from morphogen.cli import main
from morphogen.telemetry.events import CounterfactualMeasured, EpochCompleted, SlotState, StageTransition
from morphogen.telemetry.sinks import read_events
from morphogen.telemetry.story import SeedStory
from morphogen.ui.html_report import contribution_pairs, render_html, seed_segments
from morphogen.ui.report import render_report
from morphogen.ui.run_files import ScoreKind, load_run_files
from morphogen.ui.stages import STAGE_COLOURS
from morphogen.ui.svg import nice_ticks

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    assert nice_ticks(0.0, 100.0) == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    assert nice_ticks(0.3, 0.9) == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert nice_ticks(-0.28, 0.8) == pytest.approx([-0.5, 0.0, 0.5, 1.0])


@pytest.mark.parametrize(("low", "high"), [(50.0, math.nextafter(50.0, 99)), (1e300, math.nextafter(1e300, 2e300)),
                                           (-1e308, 1e308), (5e-324, 1e-323), (0.0, 1e-300), (-7.0, 1e15)])
def test_nice_ticks_end_with_few_ticks_covering_any_finite_range(low: float, high: float) -> None:
    ticks = nice_ticks(low, high)
    assert 1 <= len(ticks) <= 8
    assert ticks[0] <= low and (ticks[-1] >= high or len(ticks) == 1)


def test_html_report_replaces_a_planted_link_instead_of_writing_through_it(
        grown_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(grown_run, run)
    target = tmp_path / "authorized_keys"
    target.write_text("ssh-ed25519 AAAA key\n")
    (run / "report.html").symlink_to(target)
    assert main(["report", str(run), "--html"]) == 0
    assert target.read_text() == "ssh-ed25519 AAAA key\n"
    assert not (run / "report.html").is_symlink() and "<svg" in (run / "report.html").read_text()


def test_html_report_to_an_unwritable_place_is_one_line(grown_run: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(grown_run), "--html", "--output", str(tmp_path / "missing" / "x" / "r.html")]) == 0
    (tmp_path / "file").write_text("")
    assert main(["report", str(grown_run), "--html", "--output", str(tmp_path / "file" / "r.html")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"morphogen report: error: cannot write {tmp_path / 'file'}")


def test_html_report_never_replaces_a_file_the_run_keeps(grown_run: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(grown_run, run)
    kept = {name: (run / name).read_bytes() for name in ("events.jsonl", "summary.json")}
    for name in kept:
        assert main(["report", str(run), "--html", "--output", str(run / name)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert err == [f"morphogen report: error: --output {run / name} would replace the {name} of the run in {run}; "
                       "choose another name"]
    assert {name: (run / name).read_bytes() for name in kept} == kept
    assert main(["report", str(run), "--html", "--output", str(run / "baseline" / "events.jsonl")]) == 2
    assert main(["report", str(run), "--html"]) == 0 and main(["report", str(run), "--html"]) == 0  # its own page


def test_strings_from_the_run_reach_the_page_as_escapes_never_as_control_characters(grown_run: Path,
                                                                                    tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(grown_run, run)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "task_name": "\x1b]0;pwn\x07<i>n</i>\u202e"}))
    page = render_html(run)
    assert not any(character in page for character in "\x1b\x07\u202e")
    assert "\\x1b]0;pwn\\x07&lt;i&gt;n&lt;/i&gt;\\u202e" in page


def test_seed_segments_follow_the_stages_to_the_end_of_the_episode() -> None:
    kept = SeedStory(0, "r0c1", "conv_light", germinated=2, stages={"training": 3, "blending": 5, "holding": 7,
                                                                     "fossilized": 8}, outcome="fossilized")
    spans = [(s.start, s.end, s.colour) for s in seed_segments(kept, episode_end=12)]
    assert spans == [(2, 3, STAGE_COLOURS["germinated"]), (3, 5, STAGE_COLOURS["training"]),
                     (5, 7, STAGE_COLOURS["blending"]), (7, 8, STAGE_COLOURS["holding"]),
                     (8, 12, STAGE_COLOURS["fossilized"])]
    pruned = SeedStory(0, "r0c1", "norm", germinated=2, stages={"training": 2, "pruned": 4}, outcome="pruned")
    assert [(s.start, s.end) for s in seed_segments(pruned, episode_end=12)][-1] == (4, 5)


def test_contribution_pairs_take_the_shadow_before_blending_and_the_measurement_after() -> None:
    seed = (SlotState("r0c1", "training", "norm", 0.0),)
    blended = (SlotState("r0c1", "blending", "norm", 0.5),)
    history = [
        StageTransition(2, 0, "r0c1", "norm", "dormant", "germinated", "germinated norm"),
        StageTransition(2, 0, "r0c1", "norm", "germinated", "training", "advanced"),
        EpochCompleted(2, 0, 1.0, 1.0, 50.0, 10, seed, "GERMINATE", True),
        CounterfactualMeasured(2, 0, ("main", "with:r0c1"), (50.0, 52.0), (1.0, 0.9), (("r0c1", 2.0),)),
        CounterfactualMeasured(3, 0, ("main", "with:r0c1"), (50.0, 53.5), (1.0, 0.9), (("r0c1", 3.5),)),
        StageTransition(4, 0, "r0c1", "norm", "training", "blending", "advanced"),
        EpochCompleted(4, 0, 1.0, 1.0, 55.0, 10, blended, "ADVANCE", True),
        CounterfactualMeasured(4, 0, ("main", "without:r0c1"), (55.0, 54.0), (1.0, 1.0), (("r0c1", 1.0),)),
    ]
    [pair] = contribution_pairs(history)
    assert (pair.predicted, pair.measured) == (3.5, 1.0) and pair.label == "r0c1 norm@2"
    # Judged by the validation loss, the chart reads nats, as the run's seed story and the text report do.
    [in_nats] = contribution_pairs(history, ScoreKind("accuracy", "loss"))
    assert (in_nats.predicted, in_nats.measured) == (pytest.approx(0.1), 0.0) and in_nats.label == "r0c1 norm@2"


def test_a_seeds_tooltip_gives_its_contributions_to_the_text_reports_digits(grown_run: Path) -> None:
    """Judged in nats, a seed's shadow said +0.0283 nats and the text report says so; the chart's tooltip said +0.03,
    with no unit."""
    stories = re.findall(r"predicted (\S+ nats)  measured (\S+ nats)", render_report(grown_run))
    assert stories, "the run's seeds were measured in nats"
    page = render_html(grown_run)
    for predicted, measured in stories:
        assert f"predicted {predicted}, measured {measured}</title>" in page


def test_the_page_lists_every_decision_with_its_epoch_and_why(grown_run: Path, tmp_path: Path) -> None:
    """Each action but a wait that events.jsonl holds is a row: its epoch, what, carried out or refused, and the reason
    as written (a gate's figure and threshold for a refusal), escaped."""
    run = shutil.copytree(grown_run, tmp_path / "run")
    refused = {"time": 1e9, "event": "action_taken", "schema_version": 2, "epoch": 8, "env_id": 0, "op": "PRUNE",
               "slot": "r0c1", "blueprint": None, "succeeded": False, "reason": "<b>the seed adds +0.10 nats >= 0.005"}
    with (run / "events.jsonl").open("a") as events:
        events.write(json.dumps(refused) + "\n")
    page = render_html(run)
    decisions = page[page.index("<h2>Decisions</h2>"):page.index("<h2>Seeds</h2>")]
    taken = [record for record in map(json.loads, (run / "events.jsonl").read_text().splitlines())
             if record["event"] == "action_taken" and record["op"] != "WAIT"]
    assert len(taken) >= 2 and decisions.count("<tr>") == 1 + len(taken)
    for record in taken:
        what = " ".join(part for part in (record["op"], record["slot"], record["blueprint"]) if part)
        outcome = "carried out" if record["succeeded"] else "refused"
        assert (f"<td class='num'>{record['epoch']}</td><td>{what}</td><td>{outcome}</td>"
                f"<td>{html.escape(record['reason'])}</td>") in decisions


def test_html_of_a_run_is_self_contained_with_every_figure(grown_run: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(grown_run), "--html"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {grown_run / 'report.html'}"
    page = (grown_run / "report.html").read_text()
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert re.findall(r"https?://[^\"' ]+", page) == ["http://www.w3.org/2000/svg"] * page.count("<svg ")
    for title in ("validation accuracy", "parameters", "seeds by stage", "predicted (shadow) vs measured"):
        assert title in page, title
    assert page.count(STAGE_COLOURS["training"]) >= 2, "the timeline colours seeds by stage"


def test_a_heuristic_runs_charts_hold_every_comparison_and_no_reward(grown_run: Path) -> None:
    """The heuristic never reads a reward: its run shows none; the comparisons are curves next to the grown one."""
    summary = json.loads((grown_run / "summary.json").read_text())
    assert summary["controller"] == "heuristic" and summary["from_scratch"] is not None
    page = render_html(grown_run)
    assert "<h2>Reward</h2>" not in page and "reward by component" not in page
    accuracy = page[page.index("validation accuracy"):page.index("</svg>", page.index("validation accuracy"))]
    epochs = sum(isinstance(e, EpochCompleted) for e in read_events(grown_run / "from_scratch" / "events.jsonl"))
    for name in ("grown", "no growth", "from scratch"):
        assert f">{name}</text>" in accuracy, f"{name} is in the legend"
    assert accuracy.count("<title>from scratch: ") == epochs > 0, "one point per epoch of the from-scratch run"
    text = render_report(grown_run)
    assert "reward by component" not in text and "; from scratch " in text.splitlines()[-1]


def test_the_result_table_holds_the_hosts_a_run_was_compared_with(tmp_path: Path) -> None:
    """`run --compare`'s hosts are in the HTML report's result table beside the grown model, with the figures
    summary.json holds, as in `run`'s closing table and the text report's closing line."""
    figures = {"final_accuracy": -2.637, "final_loss": 2.637, "parameters": 153, "seconds": 0.8,
               "flops": {"total": 1.61e7}}
    wide = {**figures, "name": "w32", "final_accuracy": 0.5736, "final_loss": 0.6677, "parameters": 1377}
    (tmp_path / "config.json").write_text(json.dumps({"task_name": "sinreg", "task_metric": "mean abs error"}))
    (tmp_path / "summary.json").write_text(json.dumps(
        {"controller": "heuristic", "score": {"name": "mean abs error", "criterion": "relative_loss"},
         "grown": {**figures, "final_accuracy": 1.207}, "baseline": {**figures, "final_accuracy": 1.207},
         "from_scratch": None, "fixed": [wide]}))
    event = EpochCompleted(1, 0, 2.7, 2.637, 1.207, 153, (), "WAIT", True)
    (tmp_path / "events.jsonl").write_text(json.dumps({"time": 1.0, **event.to_dict()}) + "\n")
    page = render_html(tmp_path)
    table = page[page.index("<h2>Result</h2>"):page.index("</table>", page.index("<h2>Result</h2>"))]
    assert "<th>w32</th>" in table
    rows = {row.split("</td>")[0].removeprefix("<td>"): re.findall(r"<td class='num'>([^<]*)</td>", row)
            for row in table.split("<tr>")[2:]}
    assert rows["final val mean abs error"] == ["1.207", "1.207", "-", "0.5736"]
    assert rows["parameters"] == ["153", "153", "-", "1,377"]
    assert render_report(tmp_path).rstrip().endswith("; w32 mean abs error 0.5736 with 1,377 parameters and "
                                                     "16.1 MFLOP in 0.8 s")


def test_html_of_a_training_run_has_ppo_curves_per_round(trained_run: Path) -> None:
    page = render_html(trained_run)
    for title in ("final accuracy per round", "PPO losses", "PPO KL and clipping", "policy entropy per head",
                  "reward by component"):
        assert title in page, title


def _chromium() -> str | None:
    return next((path for path in map(shutil.which, CHROMIUM_NAMES) if path is not None), None)


def test_chromium_draws_the_report_without_console_errors(grown_run: Path, tmp_path: Path) -> None:
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH: install the Debian package `chromium` (make test does when it can)")
    image = pytest.importorskip("PIL.Image", reason="Pillow (a tensorboard dependency) reads the screenshot")
    page = tmp_path / "report.html"
    page.write_text(render_html(grown_run))
    screenshot = tmp_path / "shot.png"
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
         "--v=0", "--window-size=1200,1600", f"--screenshot={screenshot}", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], "the page logs nothing to the console (no errors, no warnings)"
    with image.open(screenshot) as shot:
        colours = shot.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot shows figures, not a blank page"
    drawn = {colour for _, colour in colours}
    for stage in ("training", "blending"):
        hex_colour = STAGE_COLOURS[stage]
        assert tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)) in drawn, f"{stage} bars are drawn"


class CountedEvents(list):  # type: ignore[type-arg]
    """A run's events that count how often a reader walks through them."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        CountedEvents.walks += 1
        return super().__iter__()


@pytest.mark.parametrize("render", [render_html, render_report], ids=["html", "text"])
def test_readers_walk_the_events_a_fixed_number_of_times(grown_run: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, render: Any) -> None:
    """Not once per event: a 200,000-event run took minutes when every event walked all of them again."""
    walks = []
    for copies in (1, 10):
        run = tmp_path / f"run{copies}"
        shutil.copytree(grown_run, run)
        (run / "events.jsonl").write_text((grown_run / "events.jsonl").read_text() * copies)
        files = load_run_files(run)
        files.events = CountedEvents(files.events)
        module = sys.modules[render.__module__]
        monkeypatch.setattr(module, "load_run_files", lambda _, loaded=files, **__: loaded)
        CountedEvents.walks = 0
        render(run)
        walks.append(CountedEvents.walks)
    assert walks[0] == walks[1], walks
