"""The cached eager pass (``models/eager_pass.py``): the training layer's numbers in fewer operators."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specdecode as sd
from specdecode.bench import ops
from tests.tiny import build_model


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_cached_passes_equal_the_uncached_forward(tmp_path: Path, arch: str) -> None:
    """Prefill, rows at different offsets (the per-row write), a batched chain and a tree pass over a cache
    agree with one causal forward of each whole sequence (the training layer, no cache)."""
    extra = {"sliding_window": 6} if arch == "gemma3" else {}  # windows the passes below outgrow
    model = sd.load_model(build_model(tmp_path / arch, arch, seed=1, **extra), fast=False)
    ids = torch.randint(1, model.vocab_size, (2, 14), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = model.module(ids).float()  # no cache: the training layer
    cache = model.new_cache(2, 32)
    first = model.forward(ids[:1, :8], cache, rows=slice(0, 1))
    second = model.forward(ids[1:, :5], cache, rows=slice(1, 2))
    torch.testing.assert_close(first, full[:1, :8], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(second, full[1:, :5], atol=2e-5, rtol=1e-5)
    cache.trim(2, row=0)  # row 0 at offset 6, row 1 at 5: each row's keys written at its own slots
    ragged = model.forward(torch.stack([ids[0, 6:9], ids[1, 5:8]]), cache)
    torch.testing.assert_close(ragged[0], full[0, 6:9], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ragged[1], full[1, 5:8], atol=2e-5, rtol=1e-5)
    # a tree over row 0 at offset 9: root, two children of the root, a grandchild under the second child
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    nodes = torch.tensor([[ids[0, 9], ids[0, 10], 7, ids[0, 11]]])
    with torch.inference_mode():
        branch = model.module(torch.cat([ids[:1, :9], nodes[:, [0, 2, 3]]], 1)).float()
    got = model.forward(nodes, cache, rows=slice(0, 1), tree_mask=tree)
    torch.testing.assert_close(got[0, [0, 1]], full[0, 9:11], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got[0, [2, 3]], branch[0, 10:12], atol=2e-5, rtol=1e-5)


def test_bf16_fixed_rows_are_invariant_and_close_to_fp32(tmp_path: Path) -> None:
    """bf16 under fixed rows: a 4-token pass equals four 1-token passes bit for bit, and stays near fp32."""
    path = build_model(tmp_path / "m", "llama", seed=2, hidden=128)
    bf16 = sd.load_model(path, dtype="bf16", fast=False)
    fp32 = sd.load_model(path, fast=False)
    ids = torch.randint(1, bf16.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    cache = bf16.new_cache(1, 32)
    bf16.forward(ids[:, :8], cache)
    steps = torch.cat([bf16.forward(ids[:, i : i + 1], cache) for i in range(8, 12)], 1)
    cache.trim(4)
    assert torch.equal(bf16.forward(ids[:, 8:12], cache), steps)
    ref_cache = fp32.new_cache(1, 32)
    ref = fp32.forward(ids, ref_cache)[:, 8:]
    assert (steps - ref).abs().max() < 0.05 * ref.abs().max()


def test_a_decode_step_stays_within_its_operator_budget(tiny_dirs: dict[str, Path]) -> None:
    """``bench ops``'s figure on a tiny model: each layer's step is about 80 ``aten::`` events (was ~180: the
    count that a GPU step pays in launches and dispatch); more than 90 a layer means an op crept back in."""
    target = sd.load_model(tiny_dirs["llama"], dtype="bf16", fast=False)
    got = ops.per_step(target, 4)
    layers = target.config.n_layers
    assert got["aten_per_step"] <= 90 * layers + 170, got["top"]
    assert got["gemm_per_step"] >= 4 * layers + 1  # qkv, o, gate|up, down and the head: the count is of real passes


def test_replaced_weights_are_used_on_the_next_pass(tmp_path: Path) -> None:
    """The transposed views follow a weight whose storage was replaced (``param.data = ...``)."""
    model = sd.load_model(build_model(tmp_path / "m", "llama", seed=4), fast=False)
    ids = torch.randint(1, model.vocab_size, (1, 6), generator=torch.Generator().manual_seed(5))
    before = model.forward(ids, model.new_cache(1, 16))
    block = model.module.layers[0]
    block.w2.data = block.w2.data * 2.0  # a new tensor behind the same parameter
    after = model.forward(ids, model.new_cache(1, 16))
    with torch.inference_mode():
        want = model.module(ids).float()
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, want, atol=2e-5, rtol=1e-5)
