"""The bundled EAGLE-3 draft (models/code-eagle) fits the bundled target, drafts exactly, and exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdecode.models import load_model

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.mark.skipif(not (MODELS / "code-eagle" / "config.json").is_file(), reason="bundled EAGLE draft not present")
def test_bundled_eagle_fits_the_target_and_stays_exact(tmp_path: Path) -> None:
    from specdecode import generate
    from specdecode.sizing.costs import Costs
    from specdecode.drafters.eagle import EagleDrafter
    from specdecode.train.export_engines import export_eagle

    root = MODELS / "code-eagle"
    assert sum(f.stat().st_size for f in root.iterdir()) < 12 * 2**20
    target = load_model(MODELS / "code-target")
    drafter = EagleDrafter.load(root, costs=Costs(0.0, (1.0,) * 64), gamma=16)  # no timing in a test: free nodes
    cfg = drafter.cfg
    assert cfg.target["fingerprint"] and cfg.aux_layers == (1, 4, 6) and len(cfg.depth_acceptance) >= 3
    assert cfg.depth_acceptance[0] > 0.5  # the held-out acceptance the model card reports
    prompt = "import os\n\n\ndef main():\n    for name in os.listdir("
    plain = generate(target, prompt, max_new_tokens=48, ignore_eos=True)
    spec = generate(target, prompt, drafter, max_new_tokens=48, ignore_eos=True)
    assert spec.token_ids == plain.token_ids and spec.stats.target_passes < plain.stats.target_passes
    out = export_eagle(str(root), str(MODELS / "code-target"), str(tmp_path / "vllm"), "vllm")
    assert json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [2, 5, 7]
