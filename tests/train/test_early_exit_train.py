"""`distill --method early-exit --quick` end to end: a loadable exit adapter directory in seconds that drafts
exactly, cached features, resume, and the flags that do not apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdecode import generate
from specdecode.config import ConfigError
from specdecode.drafters.exit_adapter import CONFIG_FILE, WEIGHTS_FILE, ExitAdapterDrafter
from specdecode.models import load_model
from specdecode.train.cli import main as train_cli

pytestmark = pytest.mark.slow  # full tier: make test-full


def _early_exit(target: Path, corpus: Path, out: Path, run: Path, *extra: str) -> int:
    return train_cli(["distill", "--method", "early-exit", "--quick", "--target", str(target), "--corpus",
                      str(corpus), "--out", str(out), "--run-dir", str(run), "--threads", "1", *extra])


def test_quick_early_exit_end_to_end(tmp_path: Path, quick_target: Path, corpus_dir: Path, capsys) -> None:
    out, run = tmp_path / "adapter", tmp_path / "run"
    target = load_model(quick_target)
    assert _early_exit(quick_target, corpus_dir, out, run, "--exit-layer", "1", "--adapter-width", "24",
                       "--adapter-vocab", "100") == 0
    assert "exit after layer 1: held-out greedy α" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {CONFIG_FILE, WEIGHTS_FILE}
    cfg = json.loads((out / CONFIG_FILE).read_text())
    assert (cfg["exit_layer"], cfg["dim"], cfg["width"], cfg["n_layers"], cfg["vocab_size"], cfg["draft_vocab"]) == \
        (1, target.config.dim, 24, target.config.n_layers, target.vocab_size, 100)
    assert cfg["target"]["path"] == str(quick_target) and cfg["recipe"]["steps_done"] == 12
    assert 0.0 <= cfg["alpha"] <= 1.0 and 0.0 <= cfg["alpha_training_free"] <= 1.0
    assert set(cfg["recipe"]["eval_tau"]) == {"1", "2", "3", "4", "5"}
    assert all(1.0 <= t <= 1 + int(g) for g, t in cfg["recipe"]["eval_tau"].items())
    drafter = ExitAdapterDrafter.load(out, gamma=3)  # loadable, trained (W_2 moved off zero), and exact
    assert drafter.adapter.block.w2.abs().sum() > 0 and len(drafter.adapter.vocab_ids) == 100
    prompt = "def alpha_beta(alpha, beta=3):\n"
    ref = generate(target, prompt, max_new_tokens=24, ignore_eos=True)
    got = generate(target, prompt, drafter, max_new_tokens=24, ignore_eos=True)
    assert got.token_ids == ref.token_ids and got.stats.drafted > 0
    assert len(list(run.glob("exit-data-*.pt"))) == 1
    assert _early_exit(quick_target, corpus_dir, tmp_path / "a2", run, "--exit-layer", "1", "--steps", "2") == 0
    assert "reusing cached rollouts" in capsys.readouterr().err


def test_quick_early_exit_resume(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    out, run = tmp_path / "a", tmp_path / "r"
    assert _early_exit(quick_target, corpus_dir, out, run, "--steps", "6", "--stop-after", "3") == 0
    assert torch.load(run / "ckpt.pt", weights_only=False)["step"] == 3 and not out.exists()
    assert _early_exit(quick_target, corpus_dir, out, run, "--steps", "6", "--resume") == 0
    assert torch.load(run / "ckpt.pt", weights_only=False)["step"] == 6
    assert (out / WEIGHTS_FILE).is_file()
    with pytest.raises(ValueError, match="different exit adapter shape"):
        _early_exit(quick_target, corpus_dir, out, run, "--steps", "8", "--resume", "--adapter-width", "8")


def test_early_exit_flag_errors(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    with pytest.raises(ConfigError, match="--layers shape a draft model.*--exit-layer"):
        _early_exit(quick_target, corpus_dir, tmp_path / "o", tmp_path / "r", "--layers", "3")
    with pytest.raises(ConfigError, match="--medusa-heads do not apply to --method early-exit"):
        _early_exit(quick_target, corpus_dir, tmp_path / "o", tmp_path / "r", "--medusa-heads", "3")
    with pytest.raises(ConfigError, match="--exit-layer need --method early-exit"):
        train_cli(["distill", "--quick", "--target", str(quick_target), "--exit-layer", "1"])
    with pytest.raises(ConfigError, match="exit layer must be in 1..1"):
        _early_exit(quick_target, corpus_dir, tmp_path / "o", tmp_path / "r", "--exit-layer", "2")
