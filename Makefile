# `make run` and `make test` create (or reuse) .venv and install what they need.
# On a machine without an NVIDIA GPU the CPU build of torch is pinned first, so that the
# unpinned `torch>=2.5` requirement is already satisfied and no multi-GB CUDA build is pulled.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_CPU := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint typecheck bench clean chromium screenshots

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		echo "NVIDIA GPU found: keeping whatever torch is installed (bring your own CUDA build)"; \
	else \
		$(BIN)/python -m pip install -q "$(TORCH_CPU)"; \
	fi
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/morphogen run

# The HTML report's browser test needs Chromium (about 30 s to install with apt); it is installed only when
# missing, as root, with apt-get at hand. Elsewhere that test skips and says why.
chromium:
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium for the HTML report test"; \
		apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	fi

# One test process per core (pytest-xdist's `-n auto`): every test runs its torch with one thread (tests/conftest.py),
# so on 2 cores two processes take half the time of one.
test: $(STAMP) chromium
	$(BIN)/python -m pytest -q -n auto -m "slow or not slow"

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n auto

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy

screenshots: $(STAMP) chromium
	$(BIN)/python docs/make_screenshots.py

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) runs
