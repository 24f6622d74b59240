"""`distill --method medusa --quick` end to end: a loadable heads directory in seconds, cached features,
resume, and the flags that do not apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdecode import generate
from specdecode.config import ConfigError
from specdecode.drafters.medusa import MedusaDrafter
from specdecode.drafters.medusa_heads import CONFIG_FILE, WEIGHTS_FILE
from specdecode.models import load_model
from specdecode.train.cli import main as train_cli
from specdecode.train.medusa import restricted_fkl

from medusa_util import FLAT

pytestmark = pytest.mark.slow  # full tier: make test-full


def _medusa(target: Path, corpus: Path, out: Path, run: Path, *extra: str) -> int:
    return train_cli(["distill", "--method", "medusa", "--quick", "--target", str(target), "--corpus", str(corpus),
                      "--out", str(out), "--run-dir", str(run), "--threads", "1", *extra])


def test_quick_medusa_end_to_end(tmp_path: Path, quick_target: Path, corpus_dir: Path, capsys) -> None:
    out, run = tmp_path / "heads", tmp_path / "run"
    assert _medusa(quick_target, corpus_dir, out, run, "--medusa-heads", "3") == 0
    assert "held-out top-1 accuracy" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {CONFIG_FILE, WEIGHTS_FILE, "draft_vocab.json"}
    cfg = json.loads((out / CONFIG_FILE).read_text())
    target = load_model(quick_target)
    assert (cfg["num_heads"], cfg["dim"], cfg["vocab_size"]) == (3, target.config.dim, target.vocab_size)
    assert cfg["target"]["path"] == str(quick_target) and cfg["recipe"]["steps_done"] == 12
    assert len(cfg["alpha"]) == 3 and all(0.0 <= a <= 1.0 for a in cfg["alpha"])
    assert len(cfg["rank_acceptance"]) == 3 and all(sum(row) <= 1.0 + 1e-6 for row in cfg["rank_acceptance"])
    ranking = json.loads((out / "draft_vocab.json").read_text())
    assert sorted(ranking["token_ids"]) == list(range(target.vocab_size)) and ranking["size"] == 64
    drafter = MedusaDrafter.load(out, costs=FLAT, gamma=6)  # loadable, and exact
    prompt = "def alpha_beta(alpha, beta=3):\n"
    ref = generate(target, prompt, max_new_tokens=24, ignore_eos=True)
    got = generate(target, prompt, drafter, max_new_tokens=24, ignore_eos=True)
    assert got.token_ids == ref.token_ids and got.stats.drafted > 0
    cached = list(run.glob("medusa-data-*.pt"))
    assert len(cached) == 1
    assert _medusa(quick_target, corpus_dir, tmp_path / "heads2", run, "--steps", "2") == 0
    assert "reusing cached rollouts" in capsys.readouterr().err


def test_quick_medusa_resume(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    out, run = tmp_path / "h", tmp_path / "r"
    assert _medusa(quick_target, corpus_dir, out, run, "--steps", "6", "--stop-after", "3") == 0
    assert torch.load(run / "ckpt.pt", weights_only=False)["step"] == 3 and not out.exists()
    assert _medusa(quick_target, corpus_dir, out, run, "--steps", "6", "--resume") == 0
    assert torch.load(run / "ckpt.pt", weights_only=False)["step"] == 6
    assert (out / WEIGHTS_FILE).is_file()


def test_medusa_flag_errors(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    with pytest.raises(ConfigError, match="--layers shape a draft model"):
        _medusa(quick_target, corpus_dir, tmp_path / "h", tmp_path / "r", "--layers", "3")
    with pytest.raises(ConfigError, match="need --method medusa"):
        train_cli(["distill", "--quick", "--medusa-heads", "2", "--target", str(quick_target)])


def test_restricted_fkl_matches_the_full_divergence_and_drops_unproposable_mass() -> None:
    logits = torch.randn(2, 3, 50)
    lp = torch.log_softmax(logits, -1)
    v, i = lp.topk(10, -1)
    assert restricted_fkl(logits, v, i).item() == pytest.approx(0.0, abs=1e-5)
    assert restricted_fkl(torch.zeros(2, 3, 50), v, i).item() > 0.01
    keep = torch.arange(25)  # a restricted vocabulary: the first 25 tokens; teacher mass elsewhere joins the tail
    pos = torch.where(i < 25, i, torch.full_like(i, -1))
    q_logits = torch.randn(2, 3, 25)
    lq = torch.log_softmax(q_logits, -1)
    inside = pos >= 0
    p = v.exp() * inside
    q = lq.gather(-1, pos.clamp_min(0)).exp() * inside
    p_rest, q_rest = 1 - p.sum(-1), 1 - q.sum(-1)
    head = torch.where(inside, p * (v - lq.gather(-1, pos.clamp_min(0))), torch.zeros(())).sum(-1)
    want = (head + p_rest * (p_rest.log() - q_rest.log())).mean()
    assert restricted_fkl(q_logits, v, pos).item() == pytest.approx(want.item(), rel=1e-5)
    assert len(keep) == q_logits.shape[-1]
