"""Fixtures for the training tests: a tiny code corpus and one quick target shared by the session."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from specdecode.train.cli import main as train_cli

WORDS = ["alpha", "beta", "gamma", "delta", "value", "index", "count", "total", "items", "result", "node", "left",
         "right", "key", "name", "path", "data", "size", "buffer", "offset"]


def _module_source(rng: random.Random, n_funcs: int) -> str:
    out = ['"""Generated module for tests."""', "", "import os", ""]
    for _ in range(n_funcs):
        a, b, c = rng.sample(WORDS, 3)
        out += [f"def {a}_{b}({a}, {b}={rng.randint(0, 9)}):",
                f"    {c} = {a} + {b}",
                f"    for i in range({rng.randint(2, 20)}):",
                f"        {c} += i * {b}",
                f"    if {c} > {rng.randint(10, 99)}:",
                f"        return {c} - {a}",
                f"    return {c}", ""]
    out += ["class Thing:", "    def __init__(self, x, y):", "        self.x = x", "        self.y = y", ""]
    return "\n".join(out) + "\n"


def write_corpus(root: Path, n_files: int = 24, seed: int = 0) -> Path:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        sub = root / ("pkg" if i % 3 == 0 else "lib")
        sub.mkdir(exist_ok=True)
        (sub / f"mod_{i:02d}.py").write_text(_module_source(rng, 6))
    return root


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "code")


@pytest.fixture(scope="session")
def quick_target(tmp_path_factory, corpus_dir) -> Path:
    """A --quick target saved in fp32 (so logits can be compared with transformers to 1e-4)."""
    base = tmp_path_factory.mktemp("target")
    out = base / "target"
    assert train_cli(["train", "--quick", "--corpus", str(corpus_dir), "--out", str(out),
                      "--run-dir", str(base / "run"), "--save-dtype", "fp32"]) == 0
    return out
