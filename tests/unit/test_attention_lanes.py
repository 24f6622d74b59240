"""Grouped attention's 16-lane walk (AVX-512, fp16 / bf16 caches) against the 8-lane one: the same bits.

A verification pass is exact only if each query's output is what its one-token step computes, and a machine's
choice of walk must not change a result: every head size, cache type, pass width and tree gives both walks' bits,
and within the 16-lane walk a pass still equals its tokens one at a time."""

from __future__ import annotations

import pytest
import torch

from specdecode.kernels.fused import load_fused_extension
from specdecode.models.config import ModelConfig
from specdecode.models.llama import rope_tables

ext = load_fused_extension()
pytestmark = pytest.mark.skipif(ext is None or not ext.has_avx512(), reason="no fused ops or no AVX-512F here")


def _tables(h: int, kv: int, d: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = ModelConfig(architecture="LlamaForCausalLM", family="llama", vocab_size=10, dim=h * d, n_layers=1,
                      n_heads=h, n_kv_heads=kv, head_dim=d, intermediate_size=8, max_position_embeddings=n,
                      norm_eps=1e-5, tie_embeddings=True)
    return rope_tables(cfg, n)


def _both(isa_args: tuple, caches: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    before = ext.set_attention_isa("avx2")
    try:
        for isa in ("avx2", "avx512"):
            ext.set_attention_isa(isa)
            kc, vc = caches[0].clone(), caches[1].clone()
            out[isa] = ext.attention(isa_args[0], isa_args[1], isa_args[2], kc, vc, *isa_args[3:])
    finally:
        ext.set_attention_isa(before)
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [16, 40, 64, 128, 256])
@pytest.mark.parametrize("t", [1, 5, 9])
def test_the_16_lane_walk_gives_the_8_lane_bits(dtype: torch.dtype, d: int, t: int) -> None:
    # contexts that end inside a 16-key block, on a block's edge and past whole 32-key tiles; 4 query heads a kv
    # head (GQA: 4 * t queries share each tile); d = 40 has an odd number of 8-lane chunks (the 8-lane walk runs)
    h, kv, n = 8, 2, 128
    cos, sin = _tables(h, kv, d, n)
    g = torch.Generator().manual_seed(d * 10 + t)
    caches = (torch.randn(3, kv, n, d, generator=g).to(dtype), torch.randn(3, kv, n, d, generator=g).to(dtype))
    starts = [37, 64, 5]
    qkv = torch.randn(3, t, (h + 2 * kv) * d, generator=g)
    out = _both((qkv, cos, sin, 0, starts, h, kv, d, d ** -0.5), caches)
    assert torch.equal(out["avx2"], out["avx512"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_trees_and_windows_give_the_8_lane_bits(dtype: torch.dtype) -> None:
    h, kv, d, n, t = 4, 1, 64, 96, 7
    cos, sin = _tables(h, kv, d, n)
    g = torch.Generator().manual_seed(2)
    caches = (torch.randn(2, kv, n, d, generator=g).to(dtype), torch.randn(2, kv, n, d, generator=g).to(dtype))
    qkv = torch.randn(2, t, (h + 2 * kv) * d, generator=g)
    parents = [-1, 0, 0, 1, 1, 2, 3]  # each node sees its ancestors and itself
    mask = torch.zeros(t, t, dtype=torch.bool)
    for i, p in enumerate(parents):
        mask[i, i] = True
        while p >= 0:
            mask[i, p], p = True, parents[p]
    for tree, window in ((mask, 0), (None, 24), (mask, 40)):
        out = _both((qkv, cos, sin, 0, [50, 33], h, kv, d, 0.125, None, tree, window), caches)
        assert torch.equal(out["avx2"], out["avx512"]), (tree is not None, window)


def test_a_pass_equals_its_tokens_one_at_a_time_on_16_lanes() -> None:
    h, kv, d, n, t = 6, 2, 64, 80, 9
    cos, sin = _tables(h, kv, d, n)
    g = torch.Generator().manual_seed(4)
    kc0, vc0 = torch.randn(1, kv, n, d, generator=g).half(), torch.randn(1, kv, n, d, generator=g).half()
    qkv = torch.randn(1, t, (h + 2 * kv) * d, generator=g)
    before = ext.set_attention_isa("avx512")
    try:
        full = ext.attention(qkv, cos, sin, kc0.clone(), vc0.clone(), 0, [41], h, kv, d, 0.125)
        kc, vc = kc0.clone(), vc0.clone()
        for i in range(t):
            one = ext.attention(qkv[:, i:i + 1].contiguous(), cos, sin, kc, vc, 0, [41 + i], h, kv, d, 0.125)
            assert torch.equal(one[0, 0], full[0, i]), i
    finally:
        ext.set_attention_isa(before)


def test_the_walk_is_named_and_bad_names_say_the_fix() -> None:
    before = ext.set_attention_isa("auto")
    try:
        assert ext.attention_isa() in ("avx2", "avx512")
        with pytest.raises(RuntimeError, match="isa must be auto, avx2 or avx512"):
            ext.set_attention_isa("sse")
    finally:
        ext.set_attention_isa(before)
