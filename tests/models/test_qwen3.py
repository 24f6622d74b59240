"""Qwen 3 (the llama block plus an RMSNorm on each q/k head): logits and greedy tokens equal transformers',
from a Hugging Face directory and from a GGUF file, eager and on the default fast CPU path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

import specdecode as sd
from specdecode.models import ModelConfig, UnsupportedModelError
from gguf_util import write_gguf
from tiny import build_model

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"
NEW = 32


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("qwen3") / "m", "qwen3", seed=7, intermediate_size=128)


def hf_model(path: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def check_logits(model: sd.Model, ref_model: torch.nn.Module) -> None:
    """Prefill, cached steps, and a rolled-back wrong draft, against one full transformers forward."""
    torch.manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (1, 14))
    with torch.no_grad():
        ref = ref_model(ids).logits
    cache = model.new_cache(1, 32)
    torch.testing.assert_close(model.forward(ids[:, :8], cache), ref[:, :8], atol=1e-4, rtol=0)
    for i in range(8, 11):
        torch.testing.assert_close(model.forward(ids[:, i : i + 1], cache), ref[:, i : i + 1], atol=1e-4, rtol=0)
    model.forward(torch.tensor([[1, 2, 3]]), cache)
    cache.trim(3)
    torch.testing.assert_close(model.forward(ids[:, 11:], cache), ref[:, 11:], atol=1e-4, rtol=0)


def test_config() -> None:
    hf = {"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
          "num_attention_heads": 2, "head_dim": 8, "rope_theta": 1e6}
    cfg = ModelConfig.from_hf(hf)
    assert cfg.architecture == "Qwen3ForCausalLM" and cfg.qk_norm and not cfg.qkv_bias and cfg.head_dim == 8
    assert cfg.rope_theta == 1e6 and not cfg.plain_llama
    with pytest.raises(UnsupportedModelError, match="use_sliding_window"):
        ModelConfig.from_hf({**hf, "use_sliding_window": True})


@pytest.mark.parametrize("fast", [False, True], ids=["eager", "fast"])
def test_logits_match_transformers(qwen3: Path, fast: bool) -> None:
    check_logits(sd.load_model(qwen3, kv_dtype="fp32", fast=fast), hf_model(qwen3))


def test_greedy_identity_with_transformers_and_drafters(qwen3: Path) -> None:
    target = sd.load_model(qwen3, kv_dtype="fp32")
    ids = target.encode(PROMPT)
    with torch.no_grad():
        gen = hf_model(qwen3).generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                       max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    plain = sd.generate(target, PROMPT, max_new_tokens=NEW, ignore_eos=True)
    assert plain.token_ids == gen[0, len(ids):].tolist()
    for drafter in [sd.DraftModelDrafter(target, 3), sd.PromptLookupDrafter(num_draft_tokens=4)]:
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=NEW, ignore_eos=True)
        assert r.token_ids == plain.token_ids, type(drafter).__name__
    # the default (fp16) KV cache: speculation still reproduces plain decoding of the model as run
    default = sd.load_model(qwen3)
    plain16 = sd.generate(default, PROMPT, max_new_tokens=NEW, ignore_eos=True)
    own = sd.generate(default, PROMPT, drafter=sd.DraftModelDrafter(default, 4), max_new_tokens=NEW, ignore_eos=True)
    assert own.token_ids == plain16.token_ids and own.stats.alpha == 1.0


def test_gguf_matches_the_same_weights_in_hf_form(qwen3: Path, tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    path = write_gguf(qwen3, tmp_path / "qwen3.gguf", "F32", "qwen3", pre="qwen2")
    ours = sd.load_model(path, kv_dtype="fp32")
    assert ours.config.architecture == "Qwen3ForCausalLM" and ours.config.qk_norm
    check_logits(ours, hf_model(qwen3))
