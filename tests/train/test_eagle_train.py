"""`distill --method eagle --quick` end to end: an EAGLE-3 directory in seconds that drafts exactly,
cached features, resume, the CPU budget, and the flags that do not apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdecode import generate
from specdecode.config import ConfigError
from specdecode.drafters.eagle import EagleDrafter
from specdecode.drafters.eagle_model import CONFIG_FILE, EXTRA_FILE, WEIGHTS_FILE, EagleConfig, EagleNet
from specdecode.models import load_model
from specdecode.train.cli import main as train_cli

from eagle_util import FLAT

pytestmark = pytest.mark.slow  # full tier: make test-full


def _eagle(target: Path, corpus: Path, out: Path, run: Path, *extra: str) -> int:
    return train_cli(["distill", "--method", "eagle", "--quick", "--target", str(target), "--corpus", str(corpus),
                      "--out", str(out), "--run-dir", str(run), "--threads", "1", *extra])


def test_quick_eagle_end_to_end(tmp_path: Path, quick_target: Path, corpus_dir: Path, capsys) -> None:
    out, run = tmp_path / "eagle", tmp_path / "run"
    assert _eagle(quick_target, corpus_dir, out, run) == 0
    assert "held-out acceptance by depth" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {CONFIG_FILE, WEIGHTS_FILE, EXTRA_FILE, "draft_vocab.json"}
    extra = json.loads((out / EXTRA_FILE).read_text())
    target = load_model(quick_target)
    assert extra["target"]["path"] == str(quick_target) and extra["recipe"]["steps_done"] == 10
    assert len(extra["depth_acceptance"]) == 6 and all(0.0 <= a <= 1.0 for a in extra["depth_acceptance"])
    cfg = json.loads((out / CONFIG_FILE).read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 64
    drafter = EagleDrafter.load(out, costs=FLAT, gamma=8)  # loadable, and exact
    prompt = "def alpha_beta(alpha, beta=3):\n"
    ref = generate(target, prompt, max_new_tokens=24, ignore_eos=True)
    got = generate(target, prompt, drafter, max_new_tokens=24, ignore_eos=True)
    assert got.token_ids == ref.token_ids and got.stats.drafted > 0
    assert len(list(run.glob("eagle-data-*.pt"))) == 1
    assert _eagle(quick_target, corpus_dir, tmp_path / "eagle2", run, "--steps", "2") == 0
    assert "reusing cached rollouts" in capsys.readouterr().err


def test_quick_eagle_resume_and_budget(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    out, run = tmp_path / "e", tmp_path / "r"
    assert _eagle(quick_target, corpus_dir, out, run, "--steps", "6", "--stop-after", "3") == 0
    ck = torch.load(run / "ckpt.pt", weights_only=False)
    assert ck["step"] == 3 and ck["cpu_seconds"] > 0 and not out.exists()
    assert _eagle(quick_target, corpus_dir, out, run, "--steps", "6", "--resume") == 0
    assert torch.load(run / "ckpt.pt", weights_only=False)["step"] == 6
    # a budget already spent by the data and earlier steps: no further step, still a directory
    assert _eagle(quick_target, corpus_dir, tmp_path / "e2", run, "--steps", "50", "--resume",
                  "--budget-minutes", "0.0001") == 0
    assert torch.load(run / "ckpt.pt", weights_only=False)["step"] == 6
    assert (tmp_path / "e2" / WEIGHTS_FILE).is_file()


def test_eagle_layers_flag(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    """--eagle-layers picks the features the draft reads; a layer the target lacks fails before any rollout."""
    out, run = tmp_path / "e", tmp_path / "r"
    assert _eagle(quick_target, corpus_dir, out, run, "--steps", "2", "--eagle-layers", "0,1,1") == 0
    cfg = json.loads((out / CONFIG_FILE).read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 1]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 2]
    assert EagleDrafter.load(out).cfg.aux_layers == (0, 1, 1)
    with pytest.raises(ConfigError, match=r"0\.\.1"):
        _eagle(quick_target, corpus_dir, tmp_path / "e2", tmp_path / "r2", "--eagle-layers", "0,1,5")
    assert not (tmp_path / "r2" / "ckpt.pt").exists()
    with pytest.raises(SystemExit):
        _eagle(quick_target, corpus_dir, tmp_path / "e3", tmp_path / "r3", "--eagle-layers", "3,1")


def test_eagle_flags_that_do_not_apply(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    with pytest.raises(ConfigError, match="--dim"):
        _eagle(quick_target, corpus_dir, tmp_path / "o", tmp_path / "r", "--dim", "32")
    with pytest.raises(ConfigError, match="need --method eagle"):
        train_cli(["distill", "--quick", "--target", str(quick_target), "--eagle-depth", "2"])


def test_training_time_test_masks_match_tree_attention() -> None:
    """Step k at position p sees step-0 keys at positions <= p - k and step j's key at p - k + j only:
    perturbing a feature after p - k leaves step k's output at p unchanged."""
    torch.manual_seed(0)
    cfg = EagleConfig(dim=16, n_heads=2, n_kv_heads=1, head_dim=8, ffn=24, vocab_size=20, draft_vocab_size=20,
                      aux_layers=(0, 0, 1), target_layers=2)
    net = EagleNet(cfg, torch.arange(20))
    aux, emb = torch.randn(1, 10, 48), torch.randn(1, 10, 16)
    outs = net.unroll(aux, emb, 3)
    p, k = 7, 2
    aux2 = aux.clone()
    aux2[0, p - k + 1 :] += 5.0  # features the depth-2 node drafted after anchor p - 2 must not see
    emb2 = emb.clone()
    emb2[0, p + 1 :] += 5.0
    outs2 = net.unroll(aux2, emb2, 3)
    assert torch.allclose(outs[k][0, p], outs2[k][0, p], atol=1e-5)
    assert not torch.allclose(outs[0][0, p], outs2[0][0, p], atol=1e-3)


def test_eagle_warm_frac_trains_depth_one_first(tmp_path: Path, quick_target: Path, corpus_dir: Path, monkeypatch,
                                                capsys) -> None:
    """--eagle-warm-frac F: the first F of the steps train step 0 alone (the target's features), the rest
    the full training-time test; a share outside [0, 1) is refused by the parser, naming the flag."""
    import specdecode.train.eagle as te

    depths: list[int] = []
    real = te.ttt_loss

    def spy(*args):
        depths.append(args[-1])
        return real(*args)

    monkeypatch.setattr(te, "ttt_loss", spy)
    assert _eagle(quick_target, corpus_dir, tmp_path / "e", tmp_path / "r", "--eagle-warm-frac", "0.5") == 0
    assert depths == [1] * 5 + [2] * 5  # QUICK: 10 steps, training-time-test depth 2
    capsys.readouterr()
    with pytest.raises(SystemExit):
        _eagle(quick_target, corpus_dir, tmp_path / "e2", tmp_path / "r2", "--eagle-warm-frac", "1.5")
    assert "--eagle-warm-frac" in capsys.readouterr().err
