# Quick start: `make run` (set up .venv, generate with the bundled models) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup run test bench serve clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch==2.13.0 is pinned here: its CPU build installs without a multi-GB CUDA download.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(VENV)/bin/specdecode generate --prompt-file examples/prompt.py --max-new-tokens 96 --gamma 4

test: setup
	$(PY) -m pytest -q -x --durations=15

clean:
	rm -rf $(VENV) build *.egg-info
