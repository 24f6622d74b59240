"""`train --quick` end to end: HF export, parity with transformers, exact resume, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdecode.models import load_model
from specdecode.train.cli import main as train_cli

pytestmark = pytest.mark.slow  # full tier: make test-full


def test_export_is_a_complete_hf_directory(quick_target: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (quick_target / name).is_file(), name
    cfg = json.loads((quick_target / "config.json").read_text())
    gen = json.loads((quick_target / "generation_config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert gen["eos_token_id"] == cfg["eos_token_id"] == 0
    info = json.loads((quick_target / "training_info.json").read_text())["pretrain"]
    assert info["held_out_loss"] > 0 and info["held_out_ppl"] > 1


def test_transformers_and_our_runtime_agree(quick_target: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ours = load_model(quick_target, dtype="fp32", kv_dtype="fp32")  # transformers' fp32 numbers, cache too
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(quick_target), dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(quick_target))
    text = "def alpha_beta(alpha, beta=3):\n    return alpha + beta\n"
    ids = tok(text).input_ids
    assert ids == ours.encode(text) and ids[0] == 0
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = hf(x).logits
    got = ours.forward(x, ours.new_cache(1, len(ids)))
    assert (got - ref).abs().max().item() <= 1e-4


def test_bf16_export(tmp_path: Path, corpus_dir: Path) -> None:
    out = tmp_path / "t"
    assert train_cli(["train", "--quick", "--steps", "3", "--corpus", str(corpus_dir), "--out", str(out),
                      "--run-dir", str(tmp_path / "run")]) == 0
    assert all(t.dtype == torch.bfloat16 for t in load_file(str(out / "model.safetensors")).values())
    assert load_model(out).vocab_size == json.loads((out / "config.json").read_text())["vocab_size"]


def test_resume_continues_from_the_saved_step_exactly(tmp_path: Path, corpus_dir: Path) -> None:
    common = ["train", "--quick", "--steps", "8", "--ckpt-every", "2", "--corpus", str(corpus_dir),
              "--save-dtype", "fp32"]
    assert train_cli(common + ["--out", str(tmp_path / "a"), "--run-dir", str(tmp_path / "ra")]) == 0
    assert train_cli(common + ["--out", str(tmp_path / "b"), "--run-dir", str(tmp_path / "rb"),
                               "--stop-after", "5"]) == 0
    ck = torch.load(tmp_path / "rb" / "ckpt.pt", weights_only=False)
    assert ck["step"] == 5 and not (tmp_path / "b" / "model.safetensors").exists()
    assert train_cli(common + ["--out", str(tmp_path / "b"), "--run-dir", str(tmp_path / "rb"), "--resume"]) == 0
    assert torch.load(tmp_path / "rb" / "ckpt.pt", weights_only=False)["step"] == 8
    wa = load_file(str(tmp_path / "a" / "model.safetensors"))
    wb = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-6)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path: Path, corpus_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train_cli(["train", "--quick", "--resume", "--corpus", str(corpus_dir), "--out", str(tmp_path / "x"),
                   "--run-dir", str(tmp_path / "r")])


def test_bad_corpus_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="corpus is empty"):
        train_cli(["train", "--quick", "--corpus", str(tmp_path / "empty"), "--out", str(tmp_path / "o"),
                   "--run-dir", str(tmp_path / "r")])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train_cli(["train", "--quick", "--corpus", str(tmp_path / "missing"), "--out", str(tmp_path / "o"),
                   "--run-dir", str(tmp_path / "r")])


def test_bad_shape_flags(tmp_path: Path, corpus_dir: Path) -> None:
    with pytest.raises(ValueError, match="divisible"):
        train_cli(["train", "--quick", "--heads", "3", "--corpus", str(corpus_dir), "--out", str(tmp_path / "o"),
                   "--run-dir", str(tmp_path / "r")])
