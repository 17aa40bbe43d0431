"""The command answers `--help`, `--version` and `list tasks` without loading torch (or the data, UI and
plotting libraries): those answers must come at once. Timings are in benchmarks/startup.py."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

HEAVY = ("torch", "sklearn", "scipy", "matplotlib", "mnist1d", "textual", "duckdb", "yaml", "tensorboard")
PROBE = """
import sys
from morphogen.cli import main
sys.argv = ["morphogen", *sys.argv[1:]]
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
sys.stderr.write(repr((code, sorted(name for name in {heavy} if name in sys.modules))))
"""


@pytest.mark.parametrize("arguments", [["--help"], ["--version"], ["list", "tasks"], ["run", "--help"]])
def test_answers_without_loading_torch(arguments: list[str]) -> None:
    probe = PROBE.format(heavy=HEAVY)
    result = subprocess.run([sys.executable, "-c", probe, *arguments], capture_output=True, text=True, timeout=120,
                            check=False)
    code, loaded = ast.literal_eval(result.stderr.strip().splitlines()[-1])  # the probe's repr, written last
    assert code in (0, None) and loaded == [], (result.stdout[-300:], result.stderr[-300:])
    assert result.stdout.strip(), "the command printed its answer"


def test_the_public_api_loads_on_first_use() -> None:
    probe = ("import sys, morphogen\nbefore = 'torch' in sys.modules\nmodel = morphogen.MorphogeneticModel\n"
             "print(before, 'torch' in sys.modules, model.__module__)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["False", "True", "morphogen.core.model"]
