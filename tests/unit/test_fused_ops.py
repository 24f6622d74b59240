"""The fused CPU decode ops (kernels/decode_ops.cpp) against the eager math they replace.

Each op is checked on odd sizes against the PyTorch expression, attention also
for its KV-cache writes and per-row offsets, and for batch invariance: a query's
output must be bit-identical whatever else is in the call, because speculative
verification relies on verification logits equalling one-at-a-time logits.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import specdecode as sd
from specdecode.kernels import select_kernels
from specdecode.kernels.fused import load_fused_extension
from specdecode.models.llama import apply_rope, rope_tables
from specdecode.models.config import ModelConfig
from tiny import build_model

ext = load_fused_extension()
pytestmark = pytest.mark.skipif(ext is None, reason="fused ops cannot be built here (no compiler or no AVX2)")


@pytest.mark.parametrize("d", [1, 7, 8, 13, 64, 100])
def test_rms_norm_and_add(d: int) -> None:
    g = torch.Generator().manual_seed(d)
    x = torch.randn(3, 5, d, generator=g)
    w = torch.randn(d, generator=g)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(ext.rms_norm(x, w, 1e-5), ref, rtol=1e-5, atol=1e-6)
    delta = torch.randn(3, 5, d, generator=g)
    x2 = x.clone()
    h = ext.add_rms_norm_(x2, delta, w, 1e-5)
    s = x + delta
    torch.testing.assert_close(x2, s)
    torch.testing.assert_close(h, s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("f", [1, 5, 8, 21, 64])
def test_silu_mul(f: int) -> None:
    gu = torch.randn(2, 3, 2 * f, generator=torch.Generator().manual_seed(f)) * 6
    gate, up = gu.split(f, dim=-1)
    torch.testing.assert_close(ext.silu_mul(gu), F.silu(gate) * up, rtol=1e-5, atol=1e-6)


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(RuntimeError, match="norm weight"):
        ext.rms_norm(torch.randn(2, 8), torch.randn(7), 1e-5)
    with pytest.raises(RuntimeError, match="even"):
        ext.silu_mul(torch.randn(2, 7))
    with pytest.raises(RuntimeError, match="fp32"):
        ext.rms_norm(torch.randn(2, 8, dtype=torch.float64), torch.randn(8), 1e-5)


def _cfg(h: int, kv: int, d: int, max_len: int) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", family="llama", vocab_size=10, dim=h * d, n_layers=1,
                       n_heads=h, n_kv_heads=kv, head_dim=d, intermediate_size=8, max_position_embeddings=max_len,
                       norm_eps=1e-5, tie_embeddings=True)


def _eager_attention(qkv, cos, sin, kc, vc, row0, starts, h, kv, d):
    """Reference: RoPE, cache write and masked SDPA as the eager layer does them."""
    b, t, _ = qkv.shape
    x = qkv.view(b, t, h + 2 * kv, d).transpose(1, 2)
    pos = torch.tensor(starts).unsqueeze(1) + torch.arange(t).unsqueeze(0)
    c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
    q, k, v = apply_rope(x[:, :h], c, s), apply_rope(x[:, h : h + kv], c, s), x[:, h + kv :]
    for i in range(b):
        kc[row0 + i, :, starts[i] : starts[i] + t] = k[i]
        vc[row0 + i, :, starts[i] : starts[i] + t] = v[i]
    end = max(starts) + t
    mask = torch.arange(end).view(1, 1, 1, end) <= pos.view(b, 1, t, 1)
    out = F.scaled_dot_product_attention(q, kc[row0 : row0 + b, :, :end], vc[row0 : row0 + b, :, :end],
                                         attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).reshape(b, t, h * d)


@pytest.mark.parametrize("h,kv,d", [(4, 2, 8), (6, 2, 64), (3, 3, 12), (4, 1, 18)])
@pytest.mark.parametrize("starts,t", [([0], 5), ([9], 1), ([17], 4), ([3, 11, 0], 3), ([30, 30], 1)])
def test_attention_matches_eager(h: int, kv: int, d: int, starts: list[int], t: int) -> None:
    g = torch.Generator().manual_seed(h * 100 + d + t)
    cfg = _cfg(h, kv, d, 64)
    cos, sin = rope_tables(cfg, 64)
    rows, L, b, row0 = 4, 48, len(starts), 1
    kc0, vc0 = torch.randn(rows, kv, L, d, generator=g), torch.randn(rows, kv, L, d, generator=g)
    qkv = torch.randn(b, t, (h + 2 * kv) * d, generator=g)
    kc, vc = kc0.clone(), vc0.clone()
    out = ext.attention(qkv, cos, sin, kc, vc, row0, starts, h, kv, d, 1 / math.sqrt(d))
    kr, vr = kc0.clone(), vc0.clone()
    ref = _eager_attention(qkv, cos, sin, kr, vr, row0, starts, h, kv, d)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(kc, kr, rtol=1e-6, atol=1e-6)
    assert torch.equal(vc, vr)


def test_attention_is_batch_invariant() -> None:
    """A query's output is bit-identical alone, among more queries, and among more rows."""
    h, kv, d, L = 6, 2, 64, 40
    cfg = _cfg(h, kv, d, L)
    cos, sin = rope_tables(cfg, L)
    g = torch.Generator().manual_seed(3)
    kc0, vc0 = torch.randn(3, kv, L, d, generator=g), torch.randn(3, kv, L, d, generator=g)
    qkv = torch.randn(3, 5, (h + 2 * kv) * d, generator=g)
    kc, vc = kc0.clone(), vc0.clone()
    full = ext.attention(qkv, cos, sin, kc, vc, 0, [10, 20, 4], h, kv, d, 0.125)
    for r, start in enumerate([10, 20, 4]):
        kc1, vc1 = kc0.clone(), vc0.clone()
        for t in range(5):  # one token at a time into the same row
            one = ext.attention(qkv[r : r + 1, t : t + 1].contiguous(), cos, sin, kc1, vc1, r, [start + t],
                                h, kv, d, 0.125)
            assert torch.equal(one[0, 0], full[r, t])


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("window", [0, 8, 64])
def test_windowed_and_wide_heads_are_batch_invariant(d: int, window: int) -> None:
    """Head dim 256 and sliding windows (Gemma 3): a pass of 5 tokens past the window (each query skipping its own
    keys) gives every token the bits of its one-token step (the grouped walk, its keys from the window's first), and
    a window wider than the context the bits of no window at all."""
    h, kv, L = 4, 1, 40
    cfg = _cfg(h, kv, d, L)
    cos, sin = rope_tables(cfg, L)
    g = torch.Generator().manual_seed(5)
    kc0, vc0 = torch.randn(2, kv, L, d, generator=g), torch.randn(2, kv, L, d, generator=g)
    qkv = torch.randn(2, 5, (h + 2 * kv) * d, generator=g)
    starts = [20, 3]
    kc, vc = kc0.clone(), vc0.clone()
    full = ext.attention(qkv, cos, sin, kc, vc, 0, starts, h, kv, d, 0.125, None, None, window)
    for r, start in enumerate(starts):
        kc1, vc1 = kc0.clone(), vc0.clone()
        for t in range(5):
            one = ext.attention(qkv[r:r + 1, t:t + 1].contiguous(), cos, sin, kc1, vc1, r, [start + t], h, kv, d,
                                0.125, None, None, window)
            assert torch.equal(one[0, 0], full[r, t]), (r, t)
    if window == 64:  # wider than every position here: no key is outside it
        kc2, vc2 = kc0.clone(), vc0.clone()
        assert torch.equal(ext.attention(qkv, cos, sin, kc2, vc2, 0, starts, h, kv, d, 0.125), full)


def test_model_logits_fused_equal_eager_and_rows_invariant(tmp_path: Path) -> None:
    """The whole llama forward with the fused ops equals the eager layer; a verification pass
    equals the one-token passes bit for bit."""
    path = build_model(tmp_path / "m", "llama", num_key_value_heads=2)
    model = sd.load_model(path)  # the default: the small-M kernel and the fused ops
    fast = model.kernels
    assert fast.fused is ext
    ids = torch.randint(1, model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    results = {}
    for fused in (False, True):
        model.kernels = fast if fused else dataclasses.replace(fast, fused=None)  # this model only
        cache = model.new_cache(2, 32)
        model.forward(ids[:1, :6], cache, rows=slice(0, 1))
        model.forward(ids[1:, :3], cache, rows=slice(1, 2))
        results[fused] = model.forward(ids[:, 6:10], cache)  # rows at offsets 6 and 3
    # the eager pass rounds differently (a vector norm, residual adds inside addmm): fp32 ulps, not more
    torch.testing.assert_close(results[True], results[False], atol=3e-5, rtol=0)
    cache = model.new_cache(1, 32)
    model.forward(ids[:1, :6], cache)
    steps = torch.cat([model.forward(ids[:1, i : i + 1], cache) for i in range(6, 10)], dim=1)
    cache.trim(4)
    # with the fast linear too, the 4-token pass equals the four 1-token passes exactly
    assert torch.equal(model.forward(ids[:1, 6:10], cache), steps)


def test_env_var_turns_fused_ops_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECDECODE_FUSED_OPS", "0")
    assert select_kernels(True, "bf16", torch.device("cpu")).fused is None
    assert sd.load_model(build_model(tmp_path / "m", "llama")).kernels.fused is None


def test_python_layer_loop_equals_the_one_call_stack(tmp_path: Path) -> None:
    """With a linear that only Python can call (a user's own), the layer loop runs in Python; it must
    give the same logits as the whole-stack C++ call."""
    path = build_model(tmp_path / "m", "llama", num_key_value_heads=2)
    model = sd.load_model(path)
    fast = model.kernels
    ids = torch.randint(1, model.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    out = {}
    for python_loop in (False, True):
        if python_loop:  # a Python-only linear: no address for C++ to call
            model.kernels = dataclasses.replace(fast, linear=lambda x, w, b=None: fast.linear(x, w, b), native=None)
        cache = model.new_cache(1, 16)
        model.forward(ids[:, :5], cache)
        out[python_loop] = model.forward(ids[:, 5:], cache)
    assert torch.equal(out[False], out[True])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embed_rows_and_bad_ids(dtype: torch.dtype) -> None:
    table = torch.randn(11, 6).to(dtype)
    tokens = torch.tensor([[3, 0, 10], [7, 7, 1]])
    out = ext.embed(tokens, table)
    assert out.dtype == torch.float32 and torch.equal(out, F.embedding(tokens, table).float())
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        ext.embed(torch.tensor([[11]]), table)


def test_long_prefill_attention_in_blocks_matches_eager_and_single_queries() -> None:
    """A prefill long enough that the queries are processed in several blocks (bounded buffers)."""
    h, kv, d, t, L = 3, 1, 8, 700, 720
    cos, sin = rope_tables(_cfg(h, kv, d, L), L)
    g = torch.Generator().manual_seed(5)
    kc0, vc0 = torch.zeros(1, kv, L, d), torch.zeros(1, kv, L, d)
    qkv = torch.randn(1, t, (h + 2 * kv) * d, generator=g)
    kc, vc = kc0.clone(), vc0.clone()
    out = ext.attention(qkv, cos, sin, kc, vc, 0, [0], h, kv, d, 1 / math.sqrt(d))
    kr, vr = kc0.clone(), vc0.clone()
    ref = _eager_attention(qkv, cos, sin, kr, vr, 0, [0], h, kv, d)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for pos in (0, 498, 499, 699):  # around the block boundary: same bits as one query alone
        one = ext.attention(qkv[:, pos : pos + 1].contiguous(), cos, sin, kc, vc, 0, [pos], h, kv, d, 1 / math.sqrt(d))
        assert torch.equal(one[0, 0], out[0, pos])


@pytest.mark.parametrize("shape", [(1,), (7,), (8192,), (5, 8192), (3, 13)])
def test_argmax_list_equals_torch(shape: tuple[int, ...]) -> None:
    from specdecode.ops import argmax_list

    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    assert argmax_list(x) == x.argmax(-1).reshape(-1).tolist()
    x = x.round()  # ties: the first maximum, as torch
    assert argmax_list(x) == x.argmax(-1).reshape(-1).tolist()


def test_argmax_list_special_values() -> None:
    from specdecode.ops import argmax_list

    inf, nan = float("inf"), float("nan")
    for row in ([-inf] * 10, [1.0, nan, 3.0, nan], [1.0] * 9 + [inf], [nan] + [0.0] * 20, [-1.0] * 17 + [nan]):
        x = torch.tensor(row)
        assert argmax_list(x) == [int(x.argmax())], row
    assert argmax_list(torch.randn(4, 10)[:, ::2]) is not None  # non-contiguous rows fall back to torch
