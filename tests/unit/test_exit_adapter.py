"""Exit adapters (``drafters/exit_adapter.py``): token identity with plain decoding on every family, the
adapter really on the draft's path with its cache layer in step, its directory's errors, and the
registry/CLI/bench plumbing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest
import torch

import specdecode as sd
from specdecode.cache import KVCache
from specdecode.config import ConfigError, GenerationConfig
from specdecode.core import DecodeCore
from specdecode.rows import Request
from specdecode.drafters.exit_adapter import (CONFIG_FILE, WEIGHTS_FILE, ExitAdapter, ExitAdapterConfig,
                                              ExitAdapterDrafter, ExitAdapterError, load_adapter, save_adapter)
from specdecode.drafters.layerskip import LayerSkipDrafter
from specdecode.drafters.medusa_heads import describe_target
from tiny import build_model

PROMPTS = ["def fib(n):\n", "class Point:\n    def __init__(self", "def add(a, b):\n    return a"]


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """4-layer checkpoints per family (the draft exits after 2)."""
    root = tmp_path_factory.mktemp("deep")
    return {arch: build_model(root / arch, arch, seed=40 + i, layers=4)
            for i, arch in enumerate(("llama", "qwen2", "gpt2"))}


def random_adapter(m: sd.Model, exit_layer: int = 2, width: int = 24, scale: float = 0.5, seed: int = 0,
                   vocab: Optional[int] = None) -> ExitAdapter:
    """An adapter whose output projections are not zero (``scale`` 0: the identity, i.e. the plain exit),
    proposing from the first ``vocab`` token ids (None: all)."""
    g = torch.Generator().manual_seed(seed)
    n = vocab or m.vocab_size
    a = ExitAdapter(ExitAdapterConfig.for_target(m, exit_layer, width, n), torch.arange(n), m.max_seq_len)
    with torch.no_grad():
        for name in ("wo", "w2"):
            p = getattr(a.block, name)
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    a.cfg.target = describe_target(m)
    return a.eval().requires_grad_(False)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("share", [True, False], ids=["shared", "own-cache"])
@pytest.mark.parametrize("quant", ["int4", "int8", None], ids=["int4", "int8", "dense"])
def test_greedy_identity_single_row(deep: dict[str, Path], arch: str, share: bool, quant: Optional[str]) -> None:
    m = sd.load_model(deep[arch])
    drafter = ExitAdapterDrafter(random_adapter(m, vocab=m.vocab_size // 2), gamma=3, share_cache=share, quant=quant)
    for p in PROMPTS:
        ref = sd.generate(m, p, max_new_tokens=40, ignore_eos=True).token_ids
        r = sd.generate(m, p, drafter=drafter, max_new_tokens=40, ignore_eos=True)
        assert r.token_ids == ref
        assert r.stats.drafted > 0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_identity_batched_rows(deep: dict[str, Path], arch: str) -> None:
    """Three rows through one core, added at different steps, one of them plain (the batched draft path)."""
    m = sd.load_model(deep[arch])
    budgets = [37, 21, 29]
    ref = {i: sd.generate(m, p, max_new_tokens=n, ignore_eos=True).token_ids
           for i, (p, n) in enumerate(zip(PROMPTS, budgets))}
    core = DecodeCore(m, {"ea": ExitAdapterDrafter(random_adapter(m), gamma=3)}, max_rows=3)
    out: dict[int, list[int]] = {}
    rows: dict[int, int] = {}
    pending, step = list(range(len(PROMPTS))), 0
    while pending or core.rows:
        if pending and step % 2 == 0:
            i = pending.pop(0)
            req = Request(m.encode(PROMPTS[i]), generation=GenerationConfig(max_new_tokens=budgets[i], ignore_eos=True),
                          drafter=None if i == 1 else "ea", gamma=3)
            rows[id(core.add(req))] = i
        for row, ev in core.step():
            if isinstance(ev, sd.FinishEvent):
                out[rows[id(row)]] = ev.token_ids
        step += 1
    assert out == ref


def test_adapter_is_on_the_draft_path(deep: dict[str, Path]) -> None:
    """An identity adapter (zero W_o, W_2) drafts exactly what the plain early exit drafts (same
    acceptances); a random one drafts otherwise; and with the layers after the exit made the identity,
    an identity adapter's draft is the target itself, so nearly every draft token is accepted."""
    from specdecode.rows import StepEvent

    m = sd.load_model(deep["llama"])
    proposals = {}  # what each drafter proposed at every pass (counts alone can coincide: both may miss)
    for name, d in (("exit", LayerSkipDrafter(exit_layer=2, gamma=3)),
                    ("zero", ExitAdapterDrafter(random_adapter(m, scale=0.0), gamma=3, quant=None)),
                    ("random", ExitAdapterDrafter(random_adapter(m, scale=2.0), gamma=3, quant=None))):
        gen = GenerationConfig(max_new_tokens=40, ignore_eos=True)
        proposals[name] = [ev.proposed for p in PROMPTS for ev in sd.stream(m, p, d, generation=gen)
                           if isinstance(ev, StepEvent)]
    assert proposals["zero"] == proposals["exit"]
    assert proposals["random"] != proposals["exit"]
    with torch.no_grad():
        for i in (2, 3):
            m.module.layers[i].wo.zero_()
            m.module.layers[i].w2.zero_()
    drafted = accepted = 0
    for p in PROMPTS:
        s = sd.generate(m, p, drafter=ExitAdapterDrafter(random_adapter(m, scale=0.0), gamma=3, quant=None),
                        max_new_tokens=40, ignore_eos=True).stats
        drafted, accepted = drafted + s.drafted, accepted + s.accepted
    assert accepted >= 0.95 * drafted > 0


@pytest.mark.parametrize("share", [True, False], ids=["shared", "own-cache"])
def test_adapter_cache_layer_matches_full_attention(deep: dict[str, Path], share: bool) -> None:
    """Decoding a sequence through the core, every draft's first-token logits (the adapter layer
    caught up over the verified tokens by its own cache) equal the adapter run with causal attention
    over the whole sequence, as training computes it."""
    from specdecode.train.early_exit import adapter_train_logits

    m = sd.load_model(deep["qwen2"])
    half = m.vocab_size // 2
    adapter = random_adapter(m, scale=1.0, vocab=half)
    drafter = ExitAdapterDrafter(adapter, gamma=3, share_cache=share, quant=None)  # dense: training's numbers
    seen: list[tuple[int, torch.Tensor]] = []
    inner, propose = drafter._partial_logits, drafter.propose_rows
    first = [False]  # the next forward is a draft's first: it runs on verified tokens only

    def spy(ids: torch.Tensor, view: object, rows: slice, last_only: bool) -> torch.Tensor:
        out = inner(ids, view, rows, last_only)
        if first[0]:  # later forwards of a draft run on its own tokens, which the sequence may not hold
            seen.append((view.lengths[rows.start], out[0, -1].clone()))  # logits after this many tokens
        first[0] = False
        return out

    def spy_propose(contexts: object) -> object:
        first[0] = True
        return propose(contexts)

    drafter._partial_logits = spy  # type: ignore[method-assign]
    drafter.propose_rows = spy_propose  # type: ignore[method-assign]
    r = sd.generate(m, PROMPTS[1], drafter=drafter, max_new_tokens=30, ignore_eos=True)
    seq = m.encode(PROMPTS[1]) + r.token_ids
    with torch.inference_mode():
        h = m.run(torch.tensor([seq]), m.new_cache(1, len(seq)), hidden_layers=(1,)).layers[1]
        want = adapter_train_logits(m, adapter, h, m.output_matrix()[:half].float())[0]
    checked = 0
    for n, logits in seen:
        if n <= len(seq):
            torch.testing.assert_close(logits[:half], want[n - 1], rtol=1e-4, atol=1e-4)
            assert torch.isinf(logits[half:]).all()  # outside the proposal vocabulary: probability 0
            checked += 1
    assert checked > 10


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_packed_draft_is_one_call_close_to_the_dense_draft(deep: dict[str, Path], arch: str, quant: str) -> None:
    """On a dense CPU target the draft runs as one module call over packed copies of the exit layers,
    the adapter's layer and the proposal head (the target's own weights untouched); its logits follow
    the dense draft's (same adapter) within the format's rounding, and its first choices mostly agree."""
    m = sd.load_model(deep[arch])
    before = {n: p.clone() for n, p in m.module.named_parameters()}
    adapter = random_adapter(m, scale=1.0)
    packed, dense = (ExitAdapterDrafter(adapter, gamma=3, quant=q) for q in (quant, None))
    for d in (packed, dense):
        d.prepare_rows(m, 1, m.max_seq_len)
        d._prepared(m)
    assert packed.runtime == f"{quant}-draft" and dense.runtime == "dense"
    seq = m.encode(PROMPTS[1]) + list(range(5, 40))
    cfg = adapter.cfg
    logits = {}
    with torch.inference_mode():
        for name, d in (("packed", packed), ("dense", dense)):
            view = KVCache(cfg.n_layers + 1, 1, cfg.n_kv_heads, len(seq), cfg.head_dim, m.dtype, m.device)
            d._target, d.plan = m, d.resolve(m)
            logits[name] = d._partial_logits(torch.tensor([seq]), view, slice(0, 1), False)[0]
            assert int(view.lengths[0]) == len(seq)
    rel = (logits["packed"] - logits["dense"]).norm() / logits["dense"].norm()
    agree = (logits["packed"].argmax(-1) == logits["dense"].argmax(-1)).float().mean().item()
    # int8 rounds weights by <0.4% of a block's peak: the draft's logits barely move. int4 rounds by up to
    # 6%, which on a 4-layer random model moves them a lot (0.53 here; the bundled target's int4 draft
    # keeps its held-out acceptance) but far from what a wrong layout gives (rel ~1.4, chance agreement)
    assert rel < (0.8 if quant == "int4" else 0.08), rel
    assert agree >= (0.3 if quant == "int4" else 0.85), agree
    for n, p in m.module.named_parameters():
        assert torch.equal(p, before[n]), n


def test_costs_include_the_adapter(deep: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    m = sd.load_model(deep["llama"])
    d = ExitAdapterDrafter(random_adapter(m, width=256), gamma="auto")
    d.prepare_rows(m, 1, m.max_seq_len)
    plain = LayerSkipDrafter(exit_layer=2, gamma="auto")
    plain.prepare_rows(m, 1, m.max_seq_len)
    c_adapter, c_exit = d.costs_for(m), plain.costs_for(m)
    assert c_adapter is not None and c_exit is not None
    assert c_adapter.c != c_exit.c and c_adapter.v == c_exit.v
    for p in PROMPTS[:2]:
        assert sd.generate(m, p, drafter=d, max_new_tokens=30, ignore_eos=True).token_ids == \
            sd.generate(m, p, max_new_tokens=30, ignore_eos=True).token_ids


# -- the directory --------------------------------------------------------------------------------------
def test_save_load_round_trip(deep: dict[str, Path], tmp_path: Path) -> None:
    m = sd.load_model(deep["qwen2"])
    a = random_adapter(m, vocab=100)
    save_adapter(tmp_path / "ad", a, torch.float32)
    b = load_adapter(tmp_path / "ad")
    assert b.cfg == a.cfg and torch.equal(b.vocab_ids, a.vocab_ids)
    for (name, p), (_, q) in zip(a.block.named_parameters(), b.block.named_parameters()):
        assert torch.equal(p, q), name


def test_bad_adapter_directories_name_the_fix(deep: dict[str, Path], tmp_path: Path) -> None:
    m = sd.load_model(deep["llama"])
    with pytest.raises(ExitAdapterError, match="does not exist.*distill --method early-exit"):
        ExitAdapterDrafter.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExitAdapterError,
                       match=f"not an exit adapter directory.*{CONFIG_FILE}.*distill --method early-exit"):
        ExitAdapterDrafter.load(tmp_path / "empty")
    a = random_adapter(m)
    good = save_adapter(tmp_path / "good", a)
    bad_json = save_adapter(tmp_path / "badjson", a)
    (bad_json / CONFIG_FILE).write_text("{not json")
    with pytest.raises(ExitAdapterError, match="malformed.*retrain"):
        ExitAdapterDrafter.load(bad_json)
    raw = json.loads((good / CONFIG_FILE).read_text())
    bad_cfg = save_adapter(tmp_path / "badcfg", a)
    (bad_cfg / CONFIG_FILE).write_text(json.dumps({**raw, "width": 7}))
    with pytest.raises(ExitAdapterError, match="tensor 'w13' is .* expected"):
        ExitAdapterDrafter.load(bad_cfg)
    old = save_adapter(tmp_path / "old", a)
    (old / CONFIG_FILE).write_text(json.dumps({**raw, "format_version": 1}))
    with pytest.raises(ExitAdapterError, match="format version 1.*retrain"):
        ExitAdapterDrafter.load(old)
    torn = save_adapter(tmp_path / "torn", a)
    (torn / WEIGHTS_FILE).write_bytes(b"\x00" * 16)
    with pytest.raises(ExitAdapterError, match="unreadable.*retrain"):
        ExitAdapterDrafter.load(torn)
    other = sd.load_model(build_model(tmp_path / "wide", "llama", hidden=32, layers=4, seed=3))
    # a drafter that cannot serve the target fails at its first proposal (the server loads every drafter)
    with pytest.raises(ConfigError, match="hidden size 64.*has 32.*distill --method early-exit --target"):
        sd.generate(other, "def f", drafter=ExitAdapterDrafter.load(good, gamma=2), max_new_tokens=4)
    shallow = sd.load_model(build_model(tmp_path / "shallow", "llama", layers=2, seed=3))
    with pytest.raises(ConfigError, match="layers 4.*has 2"):
        sd.generate(shallow, "def f", drafter=ExitAdapterDrafter.load(good, gamma=2), max_new_tokens=4)
    assert sd.generate(m, "def f", drafter=ExitAdapterDrafter.load(good, gamma=2), max_new_tokens=4).token_ids


# -- registry, CLI, bench ------------------------------------------------------------------------------
def test_cli_generate_and_bench_methods(deep: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from specdecode.bench.cli import resolve_settings
    from specdecode.bench.runners import BenchContext, build_methods
    from specdecode.cli import main

    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    m = sd.load_model(deep["llama"])
    d = save_adapter(tmp_path / "ad", random_adapter(m))
    outs = []
    for flags in (["--drafter", "none"], ["--drafter", "layerskip-adapter", "--heads", str(d), "--gamma", "3"]):
        assert main(["generate", "--target", str(deep["llama"]), "--prompt", PROMPTS[2], "--max-new-tokens", "20",
                     "--ignore-eos", "--json", *flags]) == 0
        outs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert outs[0] == outs[1]
    ctx = BenchContext(m, None, str(m.path), None, artifacts={"exit-adapter": str(d)})
    methods, skipped = build_methods(ctx, ["plain", "layerskip-adapter", "layerskip-adapter-auto"], {"gammas": [2]})
    assert not skipped and [x.name for x in methods] == ["plain", "layerskip-adapter/g2", "layerskip-adapter/auto"]
    prompt = m.encode(PROMPTS[0])
    runs = [x.run(prompt, 24) for x in methods]
    assert all(o.token_ids == runs[0].token_ids for o in runs)
    _, skipped = build_methods(BenchContext(m, None, str(m.path), None), ["layerskip-adapter"], {"gammas": [2]})
    assert skipped and "exit adapter" in str(skipped)
    args = argparse.Namespace(methods="layerskip-adapter", gammas="2,auto", quick=True, lookup_tokens=None,
                              peer_gammas=None, reps=None, per_category=None, max_new_tokens=None, cost_repeats=None,
                              threads=None)
    assert resolve_settings(args).families == ["plain", "layerskip-adapter", "layerskip-adapter-auto"]



@pytest.mark.slow  # writes a GGUF file and packs it
def test_a_target_with_no_dense_matrix_prepares(tmp_path: Path) -> None:
    """A GGUF target packed as stored (Q8_0 tables too) has no float matrix to take a dtype from: the draft's
    unquantized matrices take the target's compute dtype (``next`` over its parameters raised StopIteration)."""
    from gguf_util import tiny_gguf

    _, path = tiny_gguf(tmp_path, "Q8_0")
    m = sd.load_model(path)
    assert not any(p.dim() == 2 and p.dtype.is_floating_point for p in m.module.parameters())
    drafter = ExitAdapterDrafter(random_adapter(m, exit_layer=1, vocab=m.vocab_size // 2), gamma=3, quant=None)
    ref = sd.generate(m, PROMPTS[0], max_new_tokens=24, ignore_eos=True).token_ids
    assert sd.generate(m, PROMPTS[0], drafter=drafter, max_new_tokens=24, ignore_eos=True).token_ids == ref
