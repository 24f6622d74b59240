"""The bundled pair in models/ loads, shares a tokenizer and stays within the size budget."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from specdecode.models import load_model
from specdecode.train.evaluate import check_compatible

MODELS = Path(__file__).resolve().parents[2] / "models"


def _shipped_files() -> list[Path]:
    """The files of models/ that the repository holds: what a user trains into a drafter's folder there
    (the SmolLM2 draft model, git-ignored) is not part of the budget."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "models"], cwd=MODELS.parent, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist): everything there is shipped
        return [f for f in MODELS.rglob("*") if f.is_file()]
    return [MODELS.parent / name for name in out.stdout.decode().split("\0") if name]


@pytest.mark.skipif(not (MODELS / "code-target" / "config.json").is_file(), reason="bundled models not present")
def test_bundled_pair_is_compatible_and_small() -> None:
    target, draft = load_model(MODELS / "code-target"), load_model(MODELS / "code-draft")
    check_compatible(target, draft)
    assert draft.num_parameters() < target.num_parameters() / 5
    assert sum(f.stat().st_size for f in _shipped_files()) < 100 * 2**20
    for name in ("code-target", "code-draft"):
        cfg = json.loads((MODELS / name / "config.json").read_text())
        assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["torch_dtype"] == "bfloat16"
    ids = target.encode("def main():\n")
    assert ids[0] == 0 and target.decode(ids) == "def main():\n"


@pytest.mark.skipif(not (MODELS / "code-medusa" / "medusa_config.json").is_file(), reason="bundled heads not present")
def test_bundled_medusa_heads_fit_the_target_and_stay_exact() -> None:
    from specdecode import generate
    from specdecode.sizing.costs import Costs
    from specdecode.drafters.medusa import MedusaDrafter

    heads_dir = MODELS / "code-medusa"
    assert sum(f.stat().st_size for f in heads_dir.iterdir()) < 4 * 2**20
    target = load_model(MODELS / "code-target")
    drafter = MedusaDrafter.load(heads_dir, costs=Costs(0.0, (1.0,) * 64))  # no timing in a test: free nodes
    assert drafter.config.target["fingerprint"] and len(drafter.config.alpha) == drafter.num_heads == 4
    assert drafter.config.alpha[0] > 0.6  # the held-out accuracy the model card reports
    prompt = "import os\n\n\ndef main():\n    for name in os.listdir("
    plain = generate(target, prompt, max_new_tokens=48, ignore_eos=True)
    spec = generate(target, prompt, drafter, max_new_tokens=48, ignore_eos=True)
    assert spec.token_ids == plain.token_ids and spec.stats.target_passes < plain.stats.target_passes
