"""`distill --quick` end to end: shared tokenizer, cached on-policy data, resume, α report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdecode.models import load_model
from specdecode.train.cli import main as train_cli
from specdecode.train.distill_common import bucket_divergence

pytestmark = pytest.mark.slow  # full tier: make test-full


def _distill(target: Path, corpus: Path, out: Path, run: Path, *extra: str) -> int:
    return train_cli(["distill", "--quick", "--target", str(target), "--corpus", str(corpus), "--out", str(out),
                      "--run-dir", str(run), *extra])


def test_distill_end_to_end_and_rerun_reuses_rollouts(tmp_path: Path, quick_target: Path, corpus_dir: Path,
                                                     capsys) -> None:
    out, run = tmp_path / "draft", tmp_path / "run"
    assert _distill(quick_target, corpus_dir, out, run) == 0
    printed = capsys.readouterr()
    assert "α (T=0)" in printed.out
    ranking = json.loads((out / "draft_vocab.json").read_text())  # distill ranks the tokens for the runtime
    assert sorted(ranking["token_ids"]) == list(range(len(ranking["token_ids"])))
    assert f"draft/top{ranking['size']}" in printed.out or ranking["size"] >= len(ranking["token_ids"])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (quick_target / name).read_bytes()
    draft, target = load_model(out), load_model(quick_target)
    assert draft.vocab_size == target.vocab_size and draft.eos_token_ids == target.eos_token_ids
    assert draft.num_parameters() < target.num_parameters()
    result = json.loads((run / "result.json").read_text())
    assert 0.0 <= result["held_out_alpha"]["rows"][0]["alpha_t0"] <= 1.0
    cached = list(run.glob("distill-data-*.pt"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    assert _distill(quick_target, corpus_dir, tmp_path / "draft2", run, "--steps", "2") == 0
    assert "reusing cached on-policy data" in capsys.readouterr().err
    assert cached[0].stat().st_mtime_ns == mtime


def test_distill_resume(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    out, run = tmp_path / "d", tmp_path / "r"
    assert _distill(quick_target, corpus_dir, out, run, "--steps", "6", "--stop-after", "3") == 0
    assert torch.load(run / "ckpt.pt", weights_only=False)["step"] == 3
    assert _distill(quick_target, corpus_dir, out, run, "--steps", "6", "--resume") == 0
    assert torch.load(run / "ckpt.pt", weights_only=False)["step"] == 6
    assert (out / "model.safetensors").is_file()


def test_distill_errors(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        _distill(tmp_path / "no-such-target", corpus_dir, tmp_path / "d", tmp_path / "r")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        _distill(quick_target, corpus_dir, tmp_path / "d", tmp_path / "r2", "--resume")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="corpus is empty"):
        _distill(quick_target, tmp_path / "empty", tmp_path / "d", tmp_path / "r3")


def test_bucket_divergence_is_zero_for_identical_distributions() -> None:
    logits = torch.randn(2, 3, 50)
    lp = torch.log_softmax(logits, -1)
    v, i = lp.topk(10, -1)
    assert bucket_divergence(logits, v, i, "fkl").item() == pytest.approx(0.0, abs=1e-5)
    assert bucket_divergence(logits, v, i, "tv").item() == pytest.approx(0.0, abs=1e-5)
    assert bucket_divergence(torch.zeros(2, 3, 50), v, i, "fkl").item() > 0.01
