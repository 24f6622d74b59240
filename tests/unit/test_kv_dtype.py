"""KV-cache storage dtypes (``load_model(..., kv_dtype=)``, ``--kv-dtype``): fp32, fp16, bf16.

A narrow cache is rounded once when written and widened exactly when read, so everything the fp32
cache guarantees must still hold for it: the fused attention matches the eager math over the stored
values, a query's result is bit-identical whatever else shares the call (verification logits equal
one-token-at-a-time logits, a tree node equals its path fed as a chain, ``keep`` packs the accepted
path), and greedy speculative decoding gives plain decoding's tokens.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import specdecode as sd
from specdecode.config import ConfigError, ModelLoadConfig, add_dataclass_args
from specdecode.kernels.fused import load_fused_extension
from specdecode.models.config import ModelConfig
from specdecode.models.llama import apply_rope, rope_tables
from tiny import build_model

ext = load_fused_extension()
needs_ext = pytest.mark.skipif(ext is None, reason="fused ops cannot be built here (no compiler or no AVX2)")
NARROW = [torch.float16, torch.bfloat16]
NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _cfg(h: int, kv: int, d: int, max_len: int) -> ModelConfig:
    return ModelConfig(architecture="LlamaForCausalLM", family="llama", vocab_size=10, dim=h * d, n_layers=1,
                       n_heads=h, n_kv_heads=kv, head_dim=d, intermediate_size=8, max_position_embeddings=max_len,
                       norm_eps=1e-5, tie_embeddings=True)


def _eager_attention(qkv, cos, sin, kc, vc, row0, starts, h, kv, d):
    """Reference: RoPE, the write into the (narrow) cache, and fp32 SDPA over the stored values widened."""
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
    out = F.scaled_dot_product_attention(q, kc[row0 : row0 + b, :, :end].float(), vc[row0 : row0 + b, :, :end].float(),
                                         attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2).reshape(b, t, h * d)


@needs_ext
@pytest.mark.parametrize("dtype", NARROW, ids=["fp16", "bf16"])
@pytest.mark.parametrize("h,kv,d", [(6, 2, 64), (4, 1, 8), (4, 1, 18)])  # grouped kernel, and one query at a time
@pytest.mark.parametrize("starts,t", [([0], 5), ([37], 1), ([3, 40, 0], 3)])
def test_attention_over_a_narrow_cache_matches_eager(dtype: torch.dtype, h: int, kv: int, d: int,
                                                     starts: list[int], t: int) -> None:
    g = torch.Generator().manual_seed(h * 100 + d + t)
    cos, sin = rope_tables(_cfg(h, kv, d, 64), 64)
    rows, L, b, row0 = 4, 48, len(starts), 1
    kc0 = (torch.randn(rows, kv, L, d, generator=g) * 3).to(dtype)
    vc0 = torch.randn(rows, kv, L, d, generator=g).to(dtype)
    qkv = torch.randn(b, t, (h + 2 * kv) * d, generator=g)
    kc, vc = kc0.clone(), vc0.clone()
    out = ext.attention(qkv, cos, sin, kc, vc, row0, starts, h, kv, d, 1 / math.sqrt(d))
    kr, vr = kc0.clone(), vc0.clone()
    ref = _eager_attention(qkv, cos, sin, kr, vr, row0, starts, h, kv, d)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-6)
    assert torch.equal(vc, vr)  # v rounded once, nearest even, as torch rounds it
    eps = torch.finfo(dtype).eps  # k: RoPE's last fp32 bit may differ from torch's, so one step of the format
    torch.testing.assert_close(kc.float(), kr.float(), rtol=eps, atol=0)


@needs_ext
@pytest.mark.parametrize("dtype", [torch.float32, *NARROW], ids=["fp32", "fp16", "bf16"])
def test_attention_over_a_narrow_cache_is_batch_invariant(dtype: torch.dtype) -> None:
    """A query's output is bit-identical alone, among more queries and among more rows."""
    h, kv, d, L = 6, 2, 64, 80
    cos, sin = rope_tables(_cfg(h, kv, d, L), L)
    g = torch.Generator().manual_seed(3)
    kc0 = torch.randn(3, kv, L, d, generator=g).to(dtype)
    vc0 = torch.randn(3, kv, L, d, generator=g).to(dtype)
    qkv = torch.randn(3, 5, (h + 2 * kv) * d, generator=g)
    starts = [10, 41, 4]  # prefixes that end inside and at the edge of a 32-key tile
    kc, vc = kc0.clone(), vc0.clone()
    full = ext.attention(qkv, cos, sin, kc, vc, 0, starts, h, kv, d, 0.125)
    for r, start in enumerate(starts):
        kc1, vc1 = kc0.clone(), vc0.clone()
        for t in range(5):  # one token at a time into the same row
            one = ext.attention(qkv[r : r + 1, t : t + 1].contiguous(), cos, sin, kc1, vc1, r, [start + t],
                                h, kv, d, 0.125)
            assert torch.equal(one[0, 0], full[r, t])
        assert torch.equal(kc1[r], kc[r]) and torch.equal(vc1[r], vc[r])


def test_narrow_cache_errors_are_clear() -> None:
    if ext is None:
        pytest.skip("fused ops cannot be built here")
    cos, sin = rope_tables(_cfg(2, 1, 8, 16), 16)
    qkv = torch.randn(1, 1, 4 * 8)
    with pytest.raises(RuntimeError, match="differ in layout or dtype"):
        ext.attention(qkv, cos, sin, torch.zeros(1, 1, 16, 8, dtype=torch.float16), torch.zeros(1, 1, 16, 8), 0, [0],
                      2, 1, 8, 0.3)
    with pytest.raises(RuntimeError, match="fp32, fp16 or bf16"):
        ext.attention(qkv, cos, sin, torch.zeros(1, 1, 16, 8, dtype=torch.float64),
                      torch.zeros(1, 1, 16, 8, dtype=torch.float64), 0, [0], 2, 1, 8, 0.3)


# ------------------------------------------------------------------ the choice, per model


def test_kv_dtype_choice_belongs_to_the_model(tiny_dirs: dict[str, Path]) -> None:
    auto = sd.load_model(tiny_dirs["llama"])
    fused = auto.kernels.fused is not None
    assert auto.kv_dtype == (torch.float16 if fused else torch.float32)  # "auto"
    assert auto.new_cache(1, 8).k.dtype == auto.kv_dtype
    assert sd.load_model(tiny_dirs["llama"], fast=False).kv_dtype == torch.float32  # the eager layer: compute dtype
    assert sd.load_model(tiny_dirs["gpt2"]).kv_dtype == torch.float32  # no fused attention
    for name, dt in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        m = sd.load_model(tiny_dirs["llama"], kv_dtype=name)
        assert m.kv_dtype == dt and m.new_cache(1, 8).v.dtype == dt and m.dtype == torch.float32
    with pytest.raises(ConfigError, match="kv_dtype"):
        sd.load_model(tiny_dirs["llama"], kv_dtype="fp8")
    with pytest.raises(ConfigError, match="kv_dtype"):
        ModelLoadConfig(kv_dtype="int8")


def test_kv_dtype_flag_reaches_load_model(tiny_dirs: dict[str, Path]) -> None:
    import argparse

    from specdecode.cli import model_loader
    from specdecode.config import from_args

    p = argparse.ArgumentParser()
    add_dataclass_args(p, ModelLoadConfig)
    assert p.parse_args([]).kv_dtype == "auto"
    cfg = from_args(ModelLoadConfig, p.parse_args(["--kv-dtype", "bf16"]))
    assert model_loader(cfg)(str(tiny_dirs["llama"])).kv_dtype == torch.bfloat16


# ------------------------------------------------------------------ whole models


PATHS = ["fused", "loop", "eager"]


def _on_path(model: sd.Model, path: str) -> None:
    """Run ``model`` on the one-call C++ stack, the fused ops in a Python loop, or the eager layer."""
    base = model.__dict__.setdefault("_base_kernels", model.kernels)
    if path != "eager" and base.fused is None:
        pytest.skip("fused ops unavailable here")
    model.kernels = {"fused": base, "loop": dataclasses.replace(base, native=None),
                     "eager": dataclasses.replace(base, fused=None)}[path]


@pytest.fixture(scope="module")
def llamas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, sd.Model]:
    path = build_model(tmp_path_factory.mktemp("kv") / "llama", "llama", seed=7, num_key_value_heads=2)
    return {name: sd.load_model(path, kv_dtype=name) for name in ("fp32", "fp16", "bf16")}


def ids(n: int, seed: int, rows: int = 1) -> torch.Tensor:
    return torch.randint(1, 290, (rows, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kv", ["fp16", "bf16"])
@pytest.mark.parametrize("path", ["fused", "loop"])
def test_verify_pass_equals_one_token_passes_bit_for_bit(llamas: dict[str, sd.Model], kv: str, path: str) -> None:
    model = llamas[kv]
    _on_path(model, path)
    toks = ids(14, 0)
    cache = model.new_cache(1, 32)
    model.forward(toks[:, :8], cache)
    steps = torch.cat([model.forward(toks[:, i : i + 1], cache) for i in range(8, 14)], dim=1)
    cache.trim(6)
    assert torch.equal(model.forward(toks[:, 8:14], cache), steps)
    # and rows at different offsets in one pass equal each row alone
    batch = model.new_cache(2, 32)
    model.forward(toks[:, :8], batch, rows=slice(0, 1))
    model.forward(toks[:, :5], batch, rows=slice(1, 2))
    both = model.forward(torch.cat([toks[:, 8:11], toks[:, 5:8]]), batch)
    assert torch.equal(both[0], steps[0, :3])
    alone = model.new_cache(1, 32)
    model.forward(toks[:, :5], alone)
    assert torch.equal(both[1], model.forward(toks[:, 5:8], alone)[0])


PARENTS = [-1, 0, 0, 1, 1, 2, 5]


def _ancestors(parents: list[int]) -> torch.Tensor:
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for i in range(len(parents)):
        j = i
        while j >= 0:
            mask[i, j], j = True, parents[j]
    return mask


def _path(node: int) -> list[int]:
    out = []
    while node >= 0:
        out, node = [node] + out, PARENTS[node]
    return out


@pytest.mark.parametrize("kv", ["fp16", "bf16"])
@pytest.mark.parametrize("path", ["fused", "eager"])
def test_tree_nodes_equal_their_chains_and_keep_packs_the_path(llamas: dict[str, sd.Model], kv: str,
                                                              path: str) -> None:
    """Fused: bit for bit. Eager: the eager layer is not batch-invariant, and a last-bit difference in
    a new key can round to the other neighbouring fp16/bf16 value, so the logits agree to the format's
    precision rather than to fp32's (the fused path is what runs by default)."""
    model = llamas[kv]
    _on_path(model, path)
    tol = 0.0 if path == "fused" else (2e-3 if kv == "fp16" else 2e-2)
    toks = ids(6 + len(PARENTS) + 2, 2)
    prefix, nodes = toks[:, :6], toks[0, 6 : 6 + len(PARENTS)].tolist()
    cache = model.new_cache(1, 32)
    model.forward(prefix, cache)
    tree = model.forward(torch.tensor([nodes]), cache, tree_mask=_ancestors(PARENTS))
    for i in range(len(PARENTS)):
        chain = model.new_cache(1, 32)
        model.forward(prefix, chain)
        ref = model.forward(torch.tensor([[nodes[j] for j in _path(i)]]), chain)[0, -1]
        torch.testing.assert_close(tree[0, i], ref, atol=tol, rtol=0)
    # accept the path to node 6 (0 -> 2 -> 5 -> 6), then decode on: as if the chain had been fed
    cache.keep(_path(6))
    after = model.forward(toks[:, -2:], cache)
    chain = model.new_cache(1, 32)
    model.forward(prefix, chain)
    model.forward(torch.tensor([[nodes[j] for j in _path(6)]]), chain)
    torch.testing.assert_close(after, model.forward(toks[:, -2:], chain), atol=tol, rtol=0)


@pytest.mark.parametrize("kv", ["fp16", "bf16"])
def test_eager_and_fused_agree_over_the_same_narrow_cache(llamas: dict[str, sd.Model], kv: str) -> None:
    model = llamas[kv]
    toks = ids(12, 4)
    out, caches = {}, {}
    for path in ("fused", "eager"):
        _on_path(model, path)
        caches[path] = cache = model.new_cache(1, 16)
        model.forward(toks[:, :9], cache)
        out[path] = model.forward(toks[:, 9:], cache)
    tol = 2e-3 if kv == "fp16" else 2e-2
    torch.testing.assert_close(out["fused"], out["eager"], atol=tol, rtol=0)
    assert caches["fused"].v.dtype == caches["eager"].v.dtype == model.kv_dtype


def test_narrow_caches_stay_close_to_fp32(llamas: dict[str, sd.Model]) -> None:
    """What the storage costs in accuracy: within two steps of the format (its eps) of the largest logit
    (measured on this model: fp16 0.014 and bf16 0.085 at most, for logits up to 9.4)."""
    toks = ids(20, 5)
    out = {}
    for name, model in llamas.items():
        _on_path(model, "fused")
        out[name] = model.forward(toks, model.new_cache(1, 32))
    top = out["fp32"].abs().max().item()
    for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        torch.testing.assert_close(out[name], out["fp32"], atol=2 * torch.finfo(dt).eps * top, rtol=0)


# ------------------------------------------------------------------ greedy identity


PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"


@pytest.mark.parametrize("kv", ["fp16", "bf16"])
def test_greedy_speculative_equals_plain_with_a_narrow_cache(tiny_dirs: dict[str, Path], kv: str) -> None:
    target = sd.load_model(tiny_dirs["llama"], kv_dtype=kv)
    draft = sd.load_model(tiny_dirs["draft"], kv_dtype=kv)
    plain = sd.generate(target, PROMPT, max_new_tokens=24, ignore_eos=True)
    drafters: list[sd.Drafter] = [sd.DraftModelDrafter(target, 4), sd.DraftModelDrafter(draft, 3),
                                  sd.PromptLookupDrafter(num_draft_tokens=5), sd.SuffixDrafter(4)]
    if target.kernels.fused is not None:
        drafters.append(sd.QuantDrafter(3))  # the packed copy on the target's own (narrow) cache
    for drafter in drafters:
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=24, ignore_eos=True)
        assert r.token_ids == plain.token_ids, type(drafter).__name__


@pytest.mark.parametrize("arch,dtype", [("llama", "bf16"), ("gpt2", "fp32")])
def test_eager_models_run_on_a_cache_of_another_dtype(tiny_dirs: dict[str, Path], arch: str, dtype: str) -> None:
    """The eager layer (a bf16-compute model, as on CUDA; GPT-2) writes into an fp16 cache and attends over
    it widened to its compute dtype; the greedy speculative output still equals plain decoding's."""
    model = sd.load_model(tiny_dirs[arch], dtype=dtype, kv_dtype="fp16")
    same = sd.load_model(tiny_dirs[arch], dtype=dtype)
    assert model.kv_dtype == torch.float16 and same.kv_dtype == model.dtype
    toks = ids(12, 6)
    got = model.forward(toks, model.new_cache(1, 16))
    torch.testing.assert_close(got, same.forward(toks, same.new_cache(1, 16)), atol=0.1, rtol=0)
    plain = sd.generate(model, PROMPT, max_new_tokens=12, ignore_eos=True)
    r = sd.generate(model, PROMPT, drafter=sd.DraftModelDrafter(model, 3), max_new_tokens=12, ignore_eos=True)
    assert r.token_ids == plain.token_ids
