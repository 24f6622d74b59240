"""The bundled pair in models/ loads, shares a tokenizer and stays within the size budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdecode.models import load_model
from specdecode.train.evaluate import check_compatible

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.mark.skipif(not (MODELS / "code-target" / "config.json").is_file(), reason="bundled models not present")
def test_bundled_pair_is_compatible_and_small() -> None:
    target, draft = load_model(MODELS / "code-target"), load_model(MODELS / "code-draft")
    check_compatible(target, draft)
    assert draft.num_parameters() < target.num_parameters() / 5
    size = sum(f.stat().st_size for f in MODELS.rglob("*") if f.is_file())
    assert size < 100 * 2**20
    for name in ("code-target", "code-draft"):
        cfg = json.loads((MODELS / name / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["torch_dtype"] == "bfloat16"
    ids = target.encode("def main():\n")
    assert ids[0] == 0 and target.decode(ids) == "def main():\n"
