"""The forward that draft trees and heads use: tree masks, explicit positions, ``KVCache.keep``, hidden states.

Each check runs on every path a model can take: the eager layer, the fused C++ stack (one call)
and the fused ops in a Python layer loop (a linear only Python can call). A tree node's logits must
equal those of its root-to-node path fed alone as a chain after the same prefix; on the fused path
that holds bit for bit (a tree query gathers exactly the keys the chain's query reads, in the same
order), and a chain-shaped tree equals the causal pass bit for bit everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
import transformers
from tiny import build_model

import specdecode as sd
from specdecode.cache import KVCache
from specdecode.models.model import Model

PARENTS = [-1, 0, 0, 1, 1, 2, 5]  # 7 nodes: depths 0, 1, 1, 2, 2, 2, 3
PREFIX = 6


def ancestor_mask(parents: Sequence[int]) -> torch.Tensor:
    """[T, T] bool: [i, j] True iff j is i or an ancestor of i (parents precede children)."""
    t = len(parents)
    mask = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def path_to(parents: Sequence[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def set_path(model: Model, path: str) -> None:
    """Run ``model`` on one of its paths: "eager", "fused" (the one-call C++ stack) or "loop"."""
    base = model.__dict__.setdefault("_base_kernels", model.kernels)
    if path != "eager" and base.fused is None:
        pytest.skip("fused ops unavailable here")
    if path == "eager":
        model.kernels = dataclasses.replace(base, fused=None)
    elif path == "fused":
        model.kernels = base
    else:
        model.kernels = dataclasses.replace(base, native=None)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    root = tmp_path_factory.mktemp("tree")
    # an fp32 cache: the eager cases compare to 1e-5 (narrow caches: tests/unit/test_kv_dtype.py)
    return {
        "llama": sd.load_model(build_model(root / "llama", "llama", seed=0), kv_dtype="fp32"),  # GQA, head_dim 16
        "llama-hd18": sd.load_model(build_model(root / "hd18", "llama", seed=1, hidden=72),
                                    kv_dtype="fp32"),  # one-query kernel
        "qwen2": sd.load_model(build_model(root / "qwen2", "qwen2", seed=2), kv_dtype="fp32"),  # qkv bias
        "gpt2": sd.load_model(build_model(root / "gpt2", "gpt2", seed=3)),
    }


CASES = [("llama", "eager"), ("llama", "fused"), ("llama", "loop"), ("llama-hd18", "eager"),
         ("llama-hd18", "fused"), ("qwen2", "fused"), ("gpt2", "eager")]


def ids(n: int, seed: int, rows: int = 1) -> torch.Tensor:
    return torch.randint(1, 290, (rows, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name,path", CASES)
def test_chain_shaped_tree_equals_causal_bit_for_bit(models: dict[str, Model], name: str, path: str) -> None:
    model = models[name]
    set_path(model, path)
    toks = ids(PREFIX + 5, 0)
    out = {}
    for masked in (False, True):
        cache = model.new_cache(1, 32)
        model.forward(toks[:, :PREFIX], cache)
        mask = torch.ones(5, 5, dtype=torch.bool).tril() if masked else None
        out[masked] = model.forward(toks[:, PREFIX:], cache, tree_mask=mask)
    assert torch.equal(out[True], out[False])
    # rows at different offsets (6 and 3), one [B, T, T] mask per row
    toks = ids(PREFIX + 4, 1, rows=2)
    for masked in (False, True):
        cache = model.new_cache(2, 32)
        model.forward(toks[:1, :PREFIX], cache, rows=slice(0, 1))
        model.forward(toks[1:, :3], cache, rows=slice(1, 2))
        mask = torch.ones(2, 4, 4, dtype=torch.bool).tril() if masked else None
        out[masked] = model.forward(torch.cat([toks[:1, PREFIX:], toks[1:, 3:7]]), cache, tree_mask=mask)
    assert torch.equal(out[True], out[False])


def chain_logits(model: Model, prefix: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The last token's logits when ``tokens`` follow ``prefix`` [1, P] as a plain chain, [V]."""
    cache = model.new_cache(1, 32)
    model.forward(prefix, cache)
    return model.forward(torch.tensor([tokens]), cache)[0, -1]


@pytest.mark.parametrize("name,path", CASES)
def test_tree_node_logits_equal_their_path_fed_as_a_chain(models: dict[str, Model], name: str, path: str) -> None:
    model = models[name]
    set_path(model, path)
    toks = ids(PREFIX + len(PARENTS), 2)
    prefix, nodes = toks[:, :PREFIX], toks[0, PREFIX:].tolist()
    cache = model.new_cache(1, 32)
    model.forward(prefix, cache)
    tree = model.forward(torch.tensor([nodes]), cache, tree_mask=ancestor_mask(PARENTS))
    assert cache.length() == PREFIX + len(PARENTS)  # every node written, at slots start..start+T-1
    for i in range(len(PARENTS)):
        ref = chain_logits(model, prefix, [nodes[j] for j in path_to(PARENTS, i)])
        torch.testing.assert_close(tree[0, i], ref, atol=1e-5, rtol=0)
        if path != "eager":  # the fused kernel reads the path's keys in the chain's order
            assert torch.equal(tree[0, i], ref), f"node {i}"


@pytest.mark.parametrize("name,path", [c for c in CASES if c[0] in ("llama", "gpt2")])
def test_batched_trees_with_padding_rows(models: dict[str, Model], name: str, path: str) -> None:
    """Two rows at different offsets, each with its own tree; row 1 has 5 real nodes padded with 2
    dummy tokens (which see only themselves) to the pass's width."""
    model = models[name]
    set_path(model, path)
    other = [-1, 0, 1, 0, 3]
    toks = ids(PREFIX + 7, 3, rows=2)
    mask = torch.zeros(2, 7, 7, dtype=torch.bool)
    mask[0] = ancestor_mask(PARENTS)
    mask[1, :5, :5] = ancestor_mask(other)
    mask[1, 5, 5] = mask[1, 6, 6] = True
    cache = model.new_cache(2, 32)
    model.forward(toks[:1, :PREFIX], cache, rows=slice(0, 1))
    model.forward(toks[1:, :3], cache, rows=slice(1, 2))
    new = torch.cat([toks[:1, PREFIX:], toks[1:, 3:10]])
    out = model.forward(new, cache, tree_mask=mask)
    for row, parents, start in ((0, PARENTS, PREFIX), (1, other, 3)):
        nodes = new[row].tolist()
        for i in range(len(parents)):
            ref = chain_logits(model, toks[row : row + 1, :start], [nodes[j] for j in path_to(parents, i)])
            torch.testing.assert_close(out[row, i], ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name,path", CASES)
def test_keep_after_a_tree_pass_equals_feeding_the_accepted_path(models: dict[str, Model], name: str,
                                                                  path: str) -> None:
    model = models[name]
    set_path(model, path)
    toks = ids(PREFIX + len(PARENTS) + 1, 4)
    prefix, nodes, nxt = toks[:, :PREFIX], toks[0, PREFIX:-1].tolist(), toks[:, -1:]
    accepted = path_to(PARENTS, 6)  # [0, 2, 5, 6]: moves three entries
    cache = model.new_cache(1, 32)
    model.forward(prefix, cache)
    model.forward(torch.tensor([nodes]), cache, tree_mask=ancestor_mask(PARENTS))
    assert cache.keep(accepted) == PREFIX + len(accepted) == cache.length()
    ref = model.new_cache(1, 32)
    model.forward(prefix, ref)
    model.forward(torch.tensor([[nodes[j] for j in accepted]]), ref)
    n = ref.length()
    exact = path != "eager"
    for mine, theirs in ((cache.k, ref.k), (cache.v, ref.v)):  # every layer, up to the new length
        if exact:
            assert torch.equal(mine[:, :, :, :n], theirs[:, :, :, :n])
        torch.testing.assert_close(mine[:, :, :, :n], theirs[:, :, :, :n], atol=1e-5, rtol=0)
    a, b = model.forward(nxt, cache), model.forward(nxt, ref)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    if exact:
        assert torch.equal(a, b)


def test_keep_bookkeeping() -> None:
    """Offsets are relative to the row's last forward; a kept prefix copies nothing; other rows and
    slots are untouched; bad indices raise."""
    c = KVCache(2, 2, 1, 16, 2, torch.float32, "cpu")
    c.commit(c.prepare(3))  # both rows at 3
    c.commit(c.prepare(4, rows=slice(1, 2)))  # row 1 writes slots 3..6
    c.k[:, 1, :, :, 0] = torch.arange(16.0)
    c.v[:, 1, :, :, 0] = -torch.arange(16.0)
    before_row0 = c.k[:, 0].clone()
    assert c.keep([0, 1], row=1) == 5  # a prefix: lengths only
    assert c.k[:, 1, 0, :8, 0].tolist() == [list(range(8))] * 2
    c.commit(c.prepare(4, rows=slice(1, 2)))  # rewrite slots 5..8 (values stay the ramp)
    assert c.keep([1, 3], row=1) == 7  # slots 6 and 8 -> 5 and 6
    assert c.k[:, 1, 0, :8, 0].tolist() == [[0, 1, 2, 3, 4, 6, 8, 7]] * 2  # every layer
    assert c.v[:, 1, 0, :8, 0].tolist() == [[0, -1, -2, -3, -4, -6, -8, -7]] * 2
    assert torch.equal(c.k[:, 0], before_row0) and c.lengths == [3, 7]
    for bad in ([1, 1], [2, 0], [0, 2]):  # not increasing / beyond the 2 tokens now kept
        with pytest.raises(ValueError, match="strictly increasing"):
            c.keep(bad, row=1)
    assert c.keep([], row=1) == 5


def hf_hidden(path: Path, toks: torch.Tensor) -> tuple[torch.Tensor, ...]:
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(toks, output_hidden_states=True).hidden_states


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_hidden_states_equal_transformers(tmp_path: Path, arch: str) -> None:
    """``hidden`` = transformers' last hidden state (after the final norm), ``layers[i]`` =
    ``hidden_states[i + 1]``, for a prefill and a cached step, on every path; fp32 products.
    The residual stream of these wide-initialised models reaches ~30, hence rtol beside atol."""
    path = build_model(tmp_path / arch, arch, seed=7, layers=3)
    model = sd.load_model(path, matmul="fp32", kv_dtype="fp32")  # transformers' fp32 numbers
    toks = ids(11, 5)
    ref = hf_hidden(path, toks)
    n = model.config.n_layers
    for kpath in (("eager",) if arch == "gpt2" else ("eager", "fused", "loop")):
        set_path(model, kpath)
        cache = model.new_cache(1, 32)
        for lo, hi in ((0, 8), (8, 11)):  # prefill, then a cached 3-token step
            out = model.run(toks[:, lo:hi], cache, return_hidden=True, hidden_layers=range(n))
            torch.testing.assert_close(out.hidden, ref[-1][:, lo:hi], atol=1e-4, rtol=0)
            for i in range(n - 1):  # transformers' entry n is the normed one
                torch.testing.assert_close(out.layers[i], ref[i + 1][:, lo:hi], atol=1e-4, rtol=1e-5)
            assert set(out.layers) == set(range(n))
            torch.testing.assert_close(out.logits, model.kernels.linear(out.hidden, model.output_matrix()),
                                       atol=1e-5, rtol=0)
        cache.trim(3)
        last = model.run(toks[:, 8:11], cache, last_only=True, return_hidden=True, hidden_layers=[0])
        assert last.hidden.shape == (1, 1, model.config.dim) and last.layers[0].shape == (1, 1, model.config.dim)
        torch.testing.assert_close(last.hidden, ref[-1][:, 10:11], atol=1e-4, rtol=0)
        torch.testing.assert_close(last.layers[0], ref[1][:, 10:11], atol=1e-4, rtol=1e-5)
        plain = model.run(toks[:, :2], model.new_cache(1, 8))
        assert plain.hidden is None and plain.layers == {}


def test_explicit_positions_and_errors(models: dict[str, Model]) -> None:
    """Default positions under a tree are start + depth; passing them explicitly changes nothing;
    shifting them changes the logits; bad shapes, layers and oversized fused trees raise."""
    model = models["llama"]
    toks = ids(PREFIX + len(PARENTS), 6)
    mask = ancestor_mask(PARENTS)
    depth = mask.sum(-1) - 1
    for kpath in ("eager", "fused"):
        set_path(model, kpath)
        out = {}
        for name, pos in (("derived", None), ("explicit", PREFIX + depth), ("shifted", PREFIX + 1 + depth)):
            cache = model.new_cache(1, 32)
            model.forward(toks[:, :PREFIX], cache)
            out[name] = model.forward(toks[:, PREFIX:], cache, tree_mask=mask,
                                      positions=None if pos is None else pos.unsqueeze(0))
        assert torch.equal(out["derived"], out["explicit"])
        assert not torch.allclose(out["derived"], out["shifted"], atol=1e-3)
    cache = model.new_cache(1, 128)
    with pytest.raises(ValueError, match="tree_mask must be"):
        model.forward(toks[:, :3], cache, tree_mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="positions must be"):
        model.forward(toks[:, :3], cache, positions=torch.arange(4).unsqueeze(0))
    with pytest.raises(ValueError, match="hidden_layers"):
        model.run(toks[:, :3], cache, hidden_layers=[model.config.n_layers])
    set_path(model, "fused")
    big = torch.ones(65, 65, dtype=torch.bool).tril()
    with pytest.raises(RuntimeError, match="at most 64"):
        model.forward(torch.randint(1, 290, (1, 65)), model.new_cache(1, 128), tree_mask=big)
    set_path(model, "eager")  # the eager path takes any width
    assert model.forward(torch.randint(1, 290, (1, 65)), model.new_cache(1, 128), tree_mask=big).shape[1] == 65


@pytest.mark.parametrize("d", [16, 18])  # the grouped kernel and the one-query kernel
def test_fused_attention_op_with_tree_and_positions(d: int) -> None:
    """``decode_ops.attention`` with a per-row uint8 tree mask and explicit positions against SDPA over an
    explicitly built mask: prefix keys of the row plus the new keys the tree allows."""
    import math

    import torch.nn.functional as F

    from specdecode.kernels.fused import load_fused_extension
    from specdecode.models.config import ModelConfig
    from specdecode.models.llama import apply_rope, rope_tables

    ext = load_fused_extension()
    if ext is None:
        pytest.skip("fused ops unavailable here")
    h, kv, t, length, starts, row0 = 4, 2, 7, 40, [9, 3], 1
    cfg = ModelConfig(architecture="LlamaForCausalLM", family="llama", vocab_size=10, dim=h * d, n_layers=1,
                      n_heads=h, n_kv_heads=kv, head_dim=d, intermediate_size=8, max_position_embeddings=64,
                      norm_eps=1e-5, tie_embeddings=True)
    cos, sin = rope_tables(cfg, 64)
    g = torch.Generator().manual_seed(d)
    kc0, vc0 = torch.randn(3, kv, length, d, generator=g), torch.randn(3, kv, length, d, generator=g)
    qkv = torch.randn(2, t, (h + 2 * kv) * d, generator=g)
    tree = torch.stack([ancestor_mask(PARENTS), ancestor_mask([-1, 0, 0, 2, -1, 4, 4])]).to(torch.uint8)
    pos = torch.tensor(starts).unsqueeze(1) + tree.sum(-1) - 1 + torch.tensor([[0], [5]])  # row 1 shifted
    kc, vc = kc0.clone(), vc0.clone()
    out = ext.attention(qkv, cos, sin, kc, vc, row0, starts, h, kv, d, 1 / math.sqrt(d), pos, tree)
    x = qkv.view(2, t, h + 2 * kv, d).transpose(1, 2)
    c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
    q, k, v = apply_rope(x[:, :h], c, s), apply_rope(x[:, h : h + kv], c, s), x[:, h + kv :]
    kr, vr = kc0.clone(), vc0.clone()
    end = max(starts) + t
    mask = torch.zeros(2, 1, t, end, dtype=torch.bool)
    for b, st in enumerate(starts):
        kr[row0 + b, :, st : st + t], vr[row0 + b, :, st : st + t] = k[b], v[b]
        mask[b, 0, :, :st] = True
        mask[b, 0, :, st : st + t] = tree[b].bool()
    ref = F.scaled_dot_product_attention(q, kr[row0 : row0 + 2, :, :end], vr[row0 : row0 + 2, :, :end],
                                         attn_mask=mask, enable_gqa=True).transpose(1, 2).reshape(2, t, h * d)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(kc, kr, rtol=1e-6, atol=1e-6)
    assert torch.equal(vc, vr)
