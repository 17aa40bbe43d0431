"""Regenerate the README's screenshots from real, tiny runs: `python docs/make_screenshots.py` (or `make screenshots`).

Writes docs/report.png (the HTML report of a `morphogen run`, drawn by headless Chromium) and
docs/dashboard.svg (the dashboard on a finished `morphogen train` run, saved by Textual). Nothing here
is drawn by hand: rerun it after changing the report or the dashboard.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from morphogen.cli import main
from morphogen.ui.dashboard import Dashboard
from morphogen.ui.html_report import write_html_report

DOCS = Path(__file__).resolve().parent
RUN_CONFIG = """
max_train_samples = 400
slots = ["r0c0", "r0c1"]
[episode]
max_epochs = 16
[episode.slots]
blend_epochs = 3
[episode.slots.gates]
mode = "permissive"
min_training_epochs = 3
[heuristic]
warmup_epochs = 2
plateau_epochs = 1
plateau_threshold = 100.0
min_training_epochs = 3
"""


async def _dashboard_svg(run_dir: Path, target: Path) -> None:
    app = Dashboard(run_dir, poll_seconds=0.1)
    async with app.run_test(size=(132, 40)) as pilot:
        await pilot.pause(0.5)
        app.save_screenshot(filename=target.name, path=str(target.parent))


def main_script() -> int:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        print("needs chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "run.toml").write_text(RUN_CONFIG)
        assert main(["run", "--config", str(root / "run.toml"), "--run-dir", str(root / "run")]) == 0
        assert main(["train", "--envs", "3", "--rounds", "4", "--episode-length", "8", "--max-train-samples", "300",
                     "--hidden-size", "32", "--run-dir", str(root / "train")]) == 0
        page = write_html_report(root / "run")
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1200,1450", f"--screenshot={DOCS / 'report.png'}", page.as_uri()],
                       check=True, capture_output=True)
        asyncio.run(_dashboard_svg(root / "train", DOCS / "dashboard.svg"))
    print(f"wrote {DOCS / 'report.png'} and {DOCS / 'dashboard.svg'}")
    return 0


if __name__ == "__main__":
    sys.exit(main_script())
