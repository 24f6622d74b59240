"""Our runtime's logits equal transformers' for each architecture: prefill, cached decode, after trim."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

import specdecode as sd
from tiny import build_model

ARCHS = ["llama", "qwen2", "gpt2", "mistral"]


def hf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


def check_parity(path: Path) -> None:
    ours = sd.load_model(path, kv_dtype="fp32")  # the default fp16 cache differs from fp32 by ~1e-3
    torch.manual_seed(0)
    ids = torch.randint(0, ours.vocab_size, (1, 14))
    ref = hf_logits(path, ids)
    cache = ours.new_cache(1, 32)
    prefill = ours.forward(ids[:, :8], cache)
    torch.testing.assert_close(prefill, ref[:, :8], atol=1e-4, rtol=0)
    for i in range(8, 11):  # step by step with the cache
        step = ours.forward(ids[:, i : i + 1], cache)
        torch.testing.assert_close(step, ref[:, i : i + 1], atol=1e-4, rtol=0)
    # write 3 wrong tokens, roll them back, then continue with the right ones
    ours.forward(torch.tensor([[1, 2, 3]]), cache)
    assert cache.trim(3) == 11
    rest = ours.forward(ids[:, 11:], cache)
    torch.testing.assert_close(rest, ref[:, 11:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(tiny_dirs: dict[str, Path], arch: str) -> None:
    check_parity(tiny_dirs[arch])


@pytest.mark.parametrize("overrides", [
    dict(tie_word_embeddings=True),
    dict(num_key_value_heads=4),  # plain multi-head attention
    dict(num_key_value_heads=1),  # multi-query attention
    dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8}, rope_theta=500000.0),
    dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
], ids=["tied", "mha", "mqa", "llama3-rope", "linear-rope"])
def test_llama_variants(tmp_path: Path, overrides: dict) -> None:
    check_parity(build_model(tmp_path / "m", "llama", **overrides))


def test_batched_rows_with_different_lengths_match_single_rows(tiny_dirs: dict[str, Path]) -> None:
    """Per-row cache lengths: a batch whose rows sit at different positions equals each row alone."""
    model = sd.load_model(tiny_dirs["llama"])
    torch.manual_seed(1)
    a, b = torch.randint(0, 300, (1, 9)), torch.randint(0, 300, (1, 5))
    ref_a = model.forward(a, model.new_cache(1, 32))
    ref_b = model.forward(b, model.new_cache(1, 32))
    cache = model.new_cache(2, 32)
    model.forward(a[:, :6], cache, rows=slice(0, 1))
    model.forward(b[:, :2], cache, rows=slice(1, 2))
    step = model.forward(torch.cat([a[:, 6:9], b[:, 2:5]]), cache)  # rows at positions 6 and 2
    torch.testing.assert_close(step[0], ref_a[0, 6:9], atol=1e-4, rtol=0)
    torch.testing.assert_close(step[1], ref_b[0, 2:5], atol=1e-4, rtol=0)


def test_bf16_runs_close_to_fp32(tiny_dirs: dict[str, Path]) -> None:
    fp32 = sd.load_model(tiny_dirs["llama"])
    bf16 = sd.load_model(tiny_dirs["llama"], dtype="bf16")
    assert bf16.dtype == torch.bfloat16
    ids = torch.randint(0, 300, (1, 6))
    a = fp32.forward(ids, fp32.new_cache(1, 16))
    b = bf16.forward(ids, bf16.new_cache(1, 16))
    assert b.dtype == torch.float32
    assert (a - b).abs().max() < 0.1 * a.abs().max()


def test_bf16_checkpoint_keeps_bf16_weights_under_fp32_compute(tmp_path: Path) -> None:
    """weight_dtype=auto: a bf16 checkpoint's matrices stay bf16 in a model that runs the fast kernel
    (and only there: an eager model gets fp32 ones), with the logits of fp32 weights."""
    path = build_model(tmp_path / "m", "llama")
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    hf.to(torch.bfloat16).save_pretrained(path)
    wide = sd.load_model(path, weight_dtype="same")
    eager = sd.load_model(path, fast=False)  # weight_dtype="auto" follows this model's own kernels
    assert wide.dtype == eager.dtype == torch.float32
    assert wide.weight_dtype == eager.weight_dtype == torch.float32
    if not sd.load_model(path).fast:
        pytest.skip("the fast kernel cannot be built here")
    ids = torch.randint(0, 300, (1, 7))
    b = wide.forward(ids, wide.new_cache(1, 16))
    for matmul in ("fp32", "bf16"):
        narrow = sd.load_model(path, matmul=matmul)  # weight_dtype="auto"
        assert narrow.dtype == torch.float32 and narrow.weight_dtype == torch.bfloat16
        a = narrow.forward(ids, narrow.new_cache(1, 16))
        if matmul == "bf16":  # activations rounded to bf16: close to the fp32 run, not equal
            assert (a - b).abs().max() < 0.05 * b.abs().max()
        else:  # exact fp32 products of the bf16 weights
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
        # either way, verifying several tokens gives the one-token logits bit for bit...
        cache = narrow.new_cache(1, 16)
        steps = torch.cat([narrow.forward(ids[:, i : i + 1], cache) for i in range(7)], dim=1)
        cache.trim(4)
        assert torch.equal(narrow.forward(ids[:, 3:], cache), steps[:, 3:])
        # ...so speculation reproduces plain decoding of the model as run
        plain = sd.generate(narrow, "def", max_new_tokens=12, ignore_eos=True)
        spec = sd.generate(narrow, "def", drafter=sd.DraftModelDrafter(narrow, 3), max_new_tokens=12,
                           ignore_eos=True)
        assert spec.token_ids == plain.token_ids
