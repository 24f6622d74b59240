"""Batch-invariant decode passes (``load_model(fixed_rows=)``): a token's logits must not depend on how many
tokens its pass held, or greedy speculative output would differ from plain decoding's at near-ties.
(On CUDA this is what keeps verification exact: cuBLAS rounds a 5-row pass unlike a 1-row one;
scripts/gpu_check.py checks it there. Here the CPU's bf16 eager path stands in: it is not invariant either.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specdecode as sd
from core_rows import run_rows
from tiny import build_model
from specdecode.config import ConfigError
from specdecode.drafters import DrafterOptions
from specdecode.drafters.registry import build_drafter
from specdecode.models.loading import FIXED_ROWS_AUTO, resolve_fixed_rows

PROMPT = "def total(xs):\n    s = 0\n    for x in xs:\n"


def _one_by_one_and_together(model: sd.Model, tree: bool, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of 6 tokens after ``n`` random ones: fed one pass each, and fed in one pass (a chain, or
    the same chain as a tree mask)."""
    ids = torch.randint(0, 290, (1, n + 6), generator=torch.Generator().manual_seed(n))
    a = model.new_cache()
    model.forward(ids[:, :n], a)
    one = torch.cat([model.forward(ids[:, n + i:n + i + 1], a) for i in range(6)], 1)
    b = model.new_cache()
    model.forward(ids[:, :n], b)
    mask = torch.tril(torch.ones(6, 6, dtype=torch.bool)) if tree else None
    return one, model.forward(ids[:, n:], b, tree_mask=mask)


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_fixed_rows_make_passes_batch_invariant(tmp_path: Path, arch: str, tree: bool) -> None:
    """On this project's CPUs the bf16 eager pass differs bit-wise without fixed rows at a 60-token context
    (llama, hidden 128; gpt2): the attention kernel splits a long key range by the number of queries."""
    model = sd.load_model(build_model(tmp_path / arch, arch, seed=0, hidden=128), dtype="bf16")
    assert model.fixed_rows == FIXED_ROWS_AUTO  # auto: bf16 activations on the CPU run eager kernels
    assert not model.exact_trees  # whose attention sums keys in blocks: trees are verified as chains
    for n in (20, 60, 120, 200):
        one, together = _one_by_one_and_together(model, tree, n)
        assert torch.equal(one, together), n  # bit for bit, not close


def test_fixed_rows_leave_the_numbers_of_a_pass(tiny_dirs: dict[str, Path]) -> None:
    """Padding changes which kernel runs, not what a row means: fp32 logits agree with the plain pass."""
    fixed = sd.load_model(tiny_dirs["llama"], fast=False, fixed_rows=16)
    plain = sd.load_model(tiny_dirs["llama"], fast=False, fixed_rows="off")
    assert fixed.fixed_rows == 16 and plain.fixed_rows is None
    fc, pc = fixed.new_cache(), plain.new_cache()
    ids = torch.tensor([fixed.encode(PROMPT)])
    torch.testing.assert_close(fixed.forward(ids[:, :-3], fc), plain.forward(ids[:, :-3], pc))
    torch.testing.assert_close(fixed.forward(ids[:, -3:], fc), plain.forward(ids[:, -3:], pc), rtol=1e-4, atol=1e-4)
    assert fc.length() == pc.length() == ids.shape[1]


def test_greedy_identity_with_fixed_rows(tiny_dirs: dict[str, Path]) -> None:
    target = sd.load_model(tiny_dirs["llama"], dtype="bf16")
    draft = sd.load_model(tiny_dirs["draft"], dtype="bf16")
    drafter = build_drafter("model", DrafterOptions(draft=draft, gamma=4))
    for prompt in ["def fib(n):\n", "class Point:\n    def __init__(self"]:
        plain = sd.generate(target, prompt, max_new_tokens=40, ignore_eos=True)
        out = sd.generate(target, prompt, drafter=drafter, max_new_tokens=40, ignore_eos=True)
        assert out.token_ids == plain.token_ids
        assert out.stats.drafted > 0


def test_resolve_fixed_rows(tiny_dirs: dict[str, Path]) -> None:
    fp32 = sd.load_model(tiny_dirs["llama"])
    assert fp32.fixed_rows is None  # the CPU's fp32 path: our kernels are batch-invariant row by row
    assert fp32.exact_trees  # and sum a row's keys in order, wherever a tree puts them
    assert resolve_fixed_rows("auto", fp32) is None
    assert resolve_fixed_rows("8", fp32) == 8 and resolve_fixed_rows(8, fp32) == 8
    assert resolve_fixed_rows("off", fp32) is None
    for bad in ("0", "many", -1):
        with pytest.raises(ConfigError, match="fixed_rows"):
            resolve_fixed_rows(bad, fp32)
    with pytest.raises(ConfigError, match="fixed_rows"):
        sd.load_model(tiny_dirs["llama"], fixed_rows="wide")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_replayed_passes_equal_eager_fixed_passes(tmp_path: Path, device: str) -> None:
    """models/graphs.py's body: every output of plain and drafted decoding equals the eager fixed-shape
    passes' bit for bit, passes too near the cache's end included. On the CPU the body runs without a graph;
    on CUDA (scripts/gpu_check.py) it is captured and replayed."""
    from specdecode.models.graphs import PassGraphs

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    path = build_model(tmp_path / "t", "llama", seed=0, hidden=128)
    eager = sd.load_model(path, device=device, dtype="bf16", fixed_rows=16)
    replayed = sd.load_model(path, device=device, dtype="bf16", fixed_rows=16, cuda_graphs=device == "cuda")
    if device == "cpu":
        replayed.graphs = PassGraphs(capture=False)
    from specdecode.drafters.suffix_store import save_store

    g = torch.Generator().manual_seed(5)
    store = save_store(tmp_path / "store", [torch.randint(0, 290, (40,), generator=g).tolist() for _ in range(20)],
                       eager.vocab_size, {"source": "random (tests)"})
    for name, opts in (("none", DrafterOptions()), ("ngram", DrafterOptions(gamma=4)),
                       ("suffix", DrafterOptions(gamma="auto", artifacts={"suffix": str(store)}))):
        for prompt in ("def fib(n):\n", "class Point:\n    def __init__(self"):
            a = sd.generate(eager, prompt, drafter=build_drafter(name, opts), max_new_tokens=48, ignore_eos=True)
            b = sd.generate(replayed, prompt, drafter=build_drafter(name, opts), max_new_tokens=48, ignore_eos=True)
            assert a.token_ids == b.token_ids, (name, prompt)
    assert replayed.graphs._passes  # the replayed body ran
    # near the end of the cache the padding does not fit: the pass runs eagerly, with the same numbers
    cache_a, cache_b = eager.new_cache(max_len=40), replayed.new_cache(max_len=40)
    ids = torch.randint(0, 290, (1, 36), generator=torch.Generator().manual_seed(1)).to(device)
    for c, m in ((cache_a, eager), (cache_b, replayed)):
        m.forward(ids[:, :30], c)
    assert torch.equal(eager.forward(ids[:, 30:], cache_a), replayed.forward(ids[:, 30:], cache_b))


def test_requests_replay_the_passes_an_earlier_request_captured(tmp_path: Path) -> None:
    """Captured passes are keyed by the cache's storage, and a new cache takes the storage a finished one let go
    of (zeroed): the second request of the same shape captures nothing new and writes the same tokens."""
    from specdecode.models.graphs import PassGraphs

    model = sd.load_model(build_model(tmp_path / "t", "llama", seed=0, hidden=128), dtype="bf16", fixed_rows=16)
    model.graphs = PassGraphs(capture=False)  # the body a CUDA graph captures, run eagerly (what the CPU can check)
    first = sd.generate(model, "def fib(n):\n", max_new_tokens=24, ignore_eos=True)
    captured = dict(model.graphs._passes)
    again = sd.generate(model, "def fib(n):\n", max_new_tokens=24, ignore_eos=True)
    assert again.token_ids == first.token_ids
    assert captured and model.graphs._passes.keys() == captured.keys()  # no new captures
    held = model.new_cache(1, 64)
    other = model.new_cache(1, 64)  # one is held: the other gets storage of its own
    assert held.storage is not None and other.storage is not None
    assert held.storage.data_ptr() != other.storage.data_ptr()
    held.k.fill_(1.0)
    ptr = held.storage.data_ptr()
    del held
    reused = model.new_cache(1, 64)
    assert reused.storage is not None and reused.storage.data_ptr() == ptr and not reused.k.any()


def test_cuda_graphs_need_cuda_and_fixed_rows(tiny_dirs: dict[str, Path]) -> None:
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="cuda_graphs needs a CUDA device"):
            sd.load_model(tiny_dirs["llama"], cuda_graphs=True)
        return
    with pytest.raises(ConfigError, match="fixed-shape passes"):
        sd.load_model(tiny_dirs["llama"], device="cuda", fixed_rows="off", cuda_graphs=True)


def test_fixed_mask_matches_the_live_mask(tiny_dirs: dict[str, Path]) -> None:
    """A fixed-shape pass's mask is the ordinary one over the live keys, nothing beyond them, and the padding
    rows see key 0 alone; for a chain and for a tree, rows at different offsets."""
    model = sd.load_model(tiny_dirs["llama"])
    for tree in (None, torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)):
        cache = model.new_cache(batch_size=2, max_len=32)
        cache.lengths = [5, 9]
        live = cache.prepare(3, tree_mask=tree)
        fixed = cache.prepare(3, tree_mask=tree)
        fixed.fixed = 8
        want = live.mask if live.mask is not None else torch.ones(2, 1, 3, live.kv_len, dtype=torch.bool)
        got = fixed.mask
        assert got is not None and got.shape == (2, 1, 8, 32)
        assert torch.equal(got[:, :, :3, : live.kv_len], want)
        assert not got[:, :, :3, live.kv_len:].any()
        assert torch.equal(got[:, :, 3:], (torch.arange(32) == 0).expand(2, 1, 5, 32))
        assert fixed.positions.shape == (2, 8) and torch.equal(fixed.positions[:, :3], live.positions)


def test_batched_rows_with_fixed_rows_equal_plain_decoding(tiny_dirs: dict[str, Path]) -> None:
    """The decode core's batched passes (rows at different offsets, joining and leaving) under fixed rows:
    each row's greedy tokens equal its own plain decoding's (the server's path on CUDA)."""
    from specdecode.core import DecodeCore

    target = sd.load_model(tiny_dirs["llama"], dtype="bf16")
    draft = sd.load_model(tiny_dirs["draft"], dtype="bf16")
    assert target.fixed_rows == FIXED_ROWS_AUTO
    prompts, budgets = ["def fib(n):\n", "class Point:\n    def __init__(self", "import os\n"], [30, 12, 22]
    ref = [sd.generate(target, p, max_new_tokens=n, ignore_eos=True).token_ids for p, n in zip(prompts, budgets)]
    core = DecodeCore(target, {"model": build_drafter("model", DrafterOptions(draft=draft, gamma=3))}, max_rows=3)
    assert run_rows(core, target, prompts, budgets, "model") == ref
