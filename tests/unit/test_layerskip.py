"""Layer-skip self-speculation: token identity with plain decoding, the shared cache left exactly as the
target's own, calibration files and the registry/CLI plumbing."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Mapping, Optional

import pytest
import torch

import specdecode as sd
from specdecode.config import ConfigError, GenerationConfig
from specdecode.core import DecodeCore
from specdecode.rows import Request
from specdecode.drafters import build_drafter, DrafterOptions
from specdecode.draft import Draft, DraftContext
from specdecode.drafters.base import Acceptance
from specdecode.drafters.layerskip import (CALIBRATION_FILE, DraftLayers, LayerSkipDrafter, load_calibration,
                                           save_calibration)
from tiny import build_model

PROMPTS = ["def fib(n):\n", "class Point:\n    def __init__(self", "def add(a, b):\n    return a"]


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """4-layer checkpoints per family (a draft needs layers to skip)."""
    root = tmp_path_factory.mktemp("deep")
    return {arch: build_model(root / arch, arch, seed=20 + i, layers=4)
            for i, arch in enumerate(("llama", "qwen2", "gpt2"))}


def identity_layers(model: sd.Model, layers: tuple[int, ...]) -> sd.Model:
    """Make ``layers`` of a Llama-family model the identity (their output projections zero), so a draft
    that skips exactly them computes what the target computes: every draft token is accepted."""
    with torch.no_grad():
        for i in layers:
            block = model.module.layers[i]
            block.wo.zero_()
            block.w2.zero_()
    return model


PLANS = {"exit2": dict(exit_layer=2), "skip1": dict(skip_layers=[1]), "skip0,2": dict(skip_layers=[0, 2])}


def test_draft_layers() -> None:
    assert DraftLayers.exit(3, 8).layers == (0, 1, 2) and DraftLayers.exit(3, 8).is_exit
    s = DraftLayers.skip([1, 5], 8)
    assert s.layers == (0, 2, 3, 4, 6, 7) and s.shared == 1 and not s.is_exit and s.skipped == (1, 5)
    assert DraftLayers.skip([0], 8).shared == 0
    assert DraftLayers.default(8).layers == tuple(range(6))
    for bad in (lambda: DraftLayers.exit(8, 8), lambda: DraftLayers.exit(0, 8), lambda: DraftLayers((0, 1, 2), 3),
                lambda: DraftLayers.skip([9], 8), lambda: DraftLayers((2, 1), 8)):
        with pytest.raises(ConfigError):
            bad()
    with pytest.raises(ConfigError, match="not both"):
        LayerSkipDrafter(exit_layer=1, skip_layers=[1])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_subset_forward(deep: dict[str, Path], arch: str) -> None:
    """All layers = the full forward, bit for bit; a subset writes only its own cache layers."""
    m = sd.load_model(deep[arch])
    ids = torch.tensor([m.encode(PROMPTS[0])])
    a, b = m.new_cache(1, 64), m.new_cache(1, 64)
    assert torch.equal(m.forward(ids, a), m.forward(ids, b, layers=(0, 1, 2, 3)))
    c = m.new_cache(1, 64)
    m.forward(ids, c, layers=(0, 2))
    assert c.k[1].abs().sum() == 0 and c.k[3].abs().sum() == 0 and c.k[2].abs().sum() > 0
    with pytest.raises(ValueError):
        m.check_layers((2, 1))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("share", [True, False], ids=["shared", "own-cache"])
def test_greedy_identity_single_row(deep: dict[str, Path], arch: str, plan: str, share: bool) -> None:
    m = sd.load_model(deep[arch])
    drafter = LayerSkipDrafter(gamma=3, share_cache=share, **PLANS[plan])
    for p in PROMPTS:
        ref = sd.generate(m, p, max_new_tokens=40, ignore_eos=True).token_ids
        r = sd.generate(m, p, drafter=drafter, max_new_tokens=40, ignore_eos=True)
        assert r.token_ids == ref
        assert r.stats.drafted > 0


@pytest.mark.slow
def test_greedy_identity_auto_gamma(deep: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    m = sd.load_model(deep["llama"])
    drafter = LayerSkipDrafter(exit_layer=2, gamma="auto")
    drafter.prepare_rows(m, 1, m.max_seq_len)
    costs = drafter.costs_for(m)
    assert costs is not None and 0 < costs.c < 1.5 and costs.draft_s is not None
    for p in PROMPTS:
        assert sd.generate(m, p, drafter=drafter, max_new_tokens=30, ignore_eos=True).token_ids == \
            sd.generate(m, p, max_new_tokens=30, ignore_eos=True).token_ids


def _run_core(m: sd.Model, drafter: Optional[object], budgets: list[int], plain_rows: tuple[int, ...] = ()
              ) -> dict[int, list[int]]:
    """Three rows through one core, added at different steps (one plain row among drafting ones)."""
    core = DecodeCore(m, {"ls": drafter} if drafter is not None else {}, max_rows=3)
    out: dict[int, list[int]] = {}
    pending = list(range(len(PROMPTS)))
    rows = {}
    step = 0
    while pending or core.rows:
        if pending and step % 2 == 0:
            i = pending.pop(0)
            name = None if (drafter is None or i in plain_rows) else "ls"
            req = Request(m.encode(PROMPTS[i]), generation=GenerationConfig(max_new_tokens=budgets[i], ignore_eos=True),
                          drafter=name, gamma=3)
            rows[id(core.add(req))] = i
        for row, ev in core.step():
            if isinstance(ev, sd.FinishEvent):
                out[rows[id(row)]] = ev.token_ids
        step += 1
    return out


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("plan", list(PLANS))
def test_greedy_identity_batched_rows(deep: dict[str, Path], arch: str, plan: str) -> None:
    m = sd.load_model(deep[arch])
    budgets = [37, 21, 29]
    ref = {i: sd.generate(m, p, max_new_tokens=n, ignore_eos=True).token_ids
           for i, (p, n) in enumerate(zip(PROMPTS, budgets))}
    assert _run_core(m, LayerSkipDrafter(gamma=3, **PLANS[plan]), budgets) == ref
    assert _run_core(m, LayerSkipDrafter(gamma=3, **PLANS[plan]), budgets, plain_rows=(1,)) == ref


class Recorder(sd.BatchDrafterBase):
    """A BatchDrafter that delegates to another and records its drafts, or replays recorded drafts."""

    wants_hidden = False

    def __init__(self, inner: Optional[LayerSkipDrafter], drafts: Optional[list[dict[int, Draft]]] = None) -> None:
        self.inner, self.drafts, self.replay = inner, drafts if drafts is not None else [], inner is None
        self.gamma, self.acceptance, self.step = 3, Acceptance(), 0

    def prepare_rows(self, target: sd.Model, rows: int, max_len: int) -> None:
        if self.inner is not None:
            self.inner.prepare_rows(target, rows, max_len)

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        if self.replay:
            got = self.drafts[self.step]
        else:
            assert self.inner is not None
            got = self.inner.propose_rows(contexts)
            self.drafts.append(got)
        self.step += 1
        return got

    def on_verified_row(self, row: int, n_accepted: int) -> None:
        if self.inner is not None:
            self.inner.on_verified_row(row, n_accepted)

    def reset_row(self, row: int) -> None:
        if self.inner is not None:
            self.inner.reset_row(row)

    def move_row(self, src: int, dst: int) -> None:
        if self.inner is not None:
            self.inner.move_row(src, dst)

    def costs_for(self, target: sd.Model) -> None:
        return None


def _snapshots(m: sd.Model, drafter: Recorder) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], int, int]:
    """Every row's live K/V after each step of a 2-row core, and the drafted/accepted totals."""
    core = DecodeCore(m, {"d": drafter}, max_rows=2)
    for i, p in enumerate(PROMPTS[:2]):
        core.add(Request(m.encode(p), generation=GenerationConfig(max_new_tokens=30 + 7 * i, ignore_eos=True),
                         drafter="d", gamma=3))
    snaps, drafted, accepted = [], 0, 0
    while core.rows:
        for row, ev in core.step():
            if isinstance(ev, sd.StepEvent):
                drafted += ev.drafted
                accepted += sum(ev.from_draft)
        snaps.append([(core.cache.k[:, r, :, : n].clone(), core.cache.v[:, r, :, : n].clone())
                      for r, n in enumerate(core.cache.lengths[: len(core.rows)])])
    return snaps, drafted, accepted


@pytest.mark.parametrize("plan,identity", [("exit2", (2, 3)), ("skip1", (1,)), ("skip1", ())],
                         ids=["exit-exact", "skip-exact", "skip-random"])
def test_shared_cache_leaves_target_cache_as_without_drafter(deep: dict[str, Path], plan: str,
                                                             identity: tuple[int, ...]) -> None:
    """The drafter writes into the target's cache (scratch slots past each row's length, and for a skip
    set re-fed verified slots it restores). The target's cache after every step must equal, bit for
    bit, the cache of the same run where the same drafts come from a drafter that touches nothing.
    With identity layers the draft equals the target, so whole drafts are accepted and a skip set's
    catch-up (the save/restore path) runs every step."""
    m = identity_layers(sd.load_model(deep["llama"]), identity)
    live = Recorder(LayerSkipDrafter(gamma=3, **PLANS[plan]))
    got, drafted, accepted = _snapshots(m, live)
    want, _, _ = _snapshots(m, Recorder(None, live.drafts))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for (ka, va), (kb, vb) in zip(a, b):
            assert torch.equal(ka, kb) and torch.equal(va, vb)
    if identity:
        assert accepted >= 0.95 * drafted > 0  # the draft is the target: the sharing reads the right entries


@pytest.mark.parametrize("plan", ["exit2", "skip1", "skip0,2"])
def test_drafter_leaves_entries_below_lengths_untouched(deep: dict[str, Path], plan: str) -> None:
    """Whatever the target's cache holds below a row's length (here: noise), a proposal leaves it so,
    and leaves the length. After whole drafts were accepted a skip set re-feeds verified tokens
    through the shared layers: those slots must come back as they were (recomputing them would give
    the target's values, not these)."""
    m = identity_layers(sd.load_model(deep["llama"]), (2, 3) if plan == "exit2" else (1,) if plan == "skip1" else ())
    drafter = LayerSkipDrafter(gamma=3, **PLANS[plan])
    core = DecodeCore(m, {"d": drafter}, max_rows=1)
    core.add(Request(m.encode(PROMPTS[0]), generation=GenerationConfig(max_new_tokens=60, ignore_eos=True),
                     drafter="d", gamma=3))
    for _ in range(3):
        core.step()
    row, cache = core.rows[0], core.cache
    n = cache.lengths[0]
    assert n == len(row.tokens) - 1
    if plan == "skip1":
        assert drafter._n_cached[0] < n  # the catch-up re-feeds verified tokens (the restore path runs)
    gen = torch.Generator().manual_seed(0)
    for t in (cache.k, cache.v):
        t[:, 0, :, :n] = torch.randn(t[:, 0, :, :n].shape, generator=gen)
    before = cache.k[:, 0, :, :n].clone(), cache.v[:, 0, :, :n].clone()
    drafts = drafter.propose_rows({0: DraftContext(row.tokens, 3, row.sampling, row.gen, target_cache=cache)})
    assert len(drafts[0]) == 3 and cache.lengths[0] == n
    assert torch.equal(cache.k[:, 0, :, :n], before[0]) and torch.equal(cache.v[:, 0, :, :n], before[1])


def test_unsupported_targets(tmp_path: Path) -> None:
    one = sd.load_model(build_model(tmp_path / "one", "llama", layers=1))
    with pytest.raises(ConfigError, match="at least 2 layers"):
        sd.generate(one, "def f", drafter=LayerSkipDrafter(gamma=2), max_new_tokens=4)
    two = sd.load_model(build_model(tmp_path / "two", "llama", layers=2))
    with pytest.raises(ConfigError, match="exit layer must be in 1..1"):
        sd.generate(two, "def f", drafter=LayerSkipDrafter(exit_layer=2, gamma=2), max_new_tokens=4)


def test_calibration_files(deep: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "model"
    d.mkdir()
    for f in deep["llama"].iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    m = sd.load_model(d)
    with caplog.at_level("INFO"):
        drafter = LayerSkipDrafter(gamma=2)
        drafter.prepare_rows(m, 1, 64)
    assert drafter.plan == DraftLayers.default(4) and "uncalibrated" in caplog.text
    path = save_calibration(d, {**DraftLayers.skip([2], 4).to_dict(), "gamma": 2})
    assert path == d / CALIBRATION_FILE
    drafter = LayerSkipDrafter(gamma=2)
    drafter.prepare_rows(m, 1, 64)
    assert drafter.plan == DraftLayers.skip([2], 4) and drafter.calibration is not None
    assert LayerSkipDrafter(exit_layer=1).resolve(m) == DraftLayers.exit(1, 4)  # an explicit choice wins
    # weights changed: the stored choice is stale and ignored
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "weights": "other"}))
    assert load_calibration(d, 4) is None
    # a checkpoint directory that cannot be written: the cache directory
    path.unlink()
    path.mkdir()  # writing the file now fails (even as root)
    cached = save_calibration(d, {**DraftLayers.exit(3, 4).to_dict()})
    assert cached.is_relative_to(tmp_path / "cache")
    found = load_calibration(d, 4)
    assert found is not None and found[0] == DraftLayers.exit(3, 4) and found[2] == cached


def test_registry_and_options(deep: dict[str, Path]) -> None:
    d = build_drafter("layerskip", DrafterOptions(gamma=3, options={"exit_layer": 2}))
    assert isinstance(d, LayerSkipDrafter) and d.exit_layer == 2 and d.gamma == 3
    assert "layerskip" in sd.drafter_names()
    m = sd.load_model(deep["llama"])
    r = sd.generate(m, PROMPTS[0], drafter=d, max_new_tokens=12, ignore_eos=True, temperature=0.9, seed=3)
    assert len(r.token_ids) == 12 and r.stats.drafted > 0  # sampled drafting runs (its law: tests/exactness)


def test_replay_is_greedy_speculation() -> None:
    """The calibration's prediction replays verify steps from acceptance events: with every draft token
    right, γ = 3 covers 8 tokens in 2 passes (4 + 4); with none right, one token a pass."""
    from specdecode.train.calibrate import replay

    v = [1.0, 1.0, 1.0, 1.0]
    assert replay([[True] * 8], 3, 0.0, v) == pytest.approx(8 / 2)
    assert replay([[False] * 8], 3, 0.0, v) == pytest.approx(1.0)
    # near the end a pass drafts only what is left to verify: 5 passes of γ = 3, then γ = 2, 1, 0
    assert replay([[False] * 8], 3, 0.5, v) == pytest.approx(8 / (5 * 2.5 + 2.0 + 1.5 + 1.0))
    # [T, T, F, T]: pass 1 keeps 2 + the target's token, pass 2 has 1 token left (γ = 0): 2 passes
    assert replay([[True, True, False, True]], 3, 0.0, v) == pytest.approx(4 / 2)
    # a prefill of 4 passes counts on both sides; a draft with own layers pays half of it again
    assert replay([[True] * 8], 3, 0.0, v, prefill=[4.0], draft_prefill=0.5) == pytest.approx(12 / (2 + 6))


def test_cli_generate_and_calibrate(deep: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main

    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "model"
    d.mkdir()
    for f in deep["llama"].iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS[0] + "---\n" + PROMPTS[1] + "\n")
    assert main(["calibrate", "--target", str(d), "--prompts", str(prompts), "--minutes", "0.05",
                 "--max-new-tokens", "12", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "chose " in out and "stored in" in out
    rec = json.loads((d / CALIBRATION_FILE).read_text())
    assert rec["prompts"] == 2 and rec["new_tokens"] == 12 and rec["layers"] and rec["gamma"] >= 1
    assert rec["measured_speedup"] > 0 and len(rec["candidates"]) >= 3  # every early exit at least
    assert all(c["identical"] for c in rec["candidates"] if c["identical"] is not None)
    plan = DraftLayers(tuple(rec["layers"]), 4)
    drafter = LayerSkipDrafter(gamma=2)
    drafter.prepare_rows(sd.load_model(d), 1, 64)
    assert drafter.plan == plan
    outs = []
    for flags in (["--drafter", "none"], ["--drafter", "layerskip", "--gamma", "3"],
                  ["--drafter", "layerskip", "--skip-layers", "1,2", "--gamma", "2"]):
        assert main(["generate", "--target", str(d), "--prompt", PROMPTS[2], "--max-new-tokens", "20",
                     "--ignore-eos", "--json", *flags]) == 0
        outs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert outs[0] == outs[1] == outs[2]


def test_bench_methods(deep: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's layerskip families build from the registry and reproduce plain decoding."""
    from specdecode.bench.cli import resolve_settings
    from specdecode.bench.runners import BenchContext, build_methods

    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    m = sd.load_model(deep["llama"])
    ctx = BenchContext(m, None, str(m.path), None)
    methods, skipped = build_methods(ctx, ["plain", "layerskip", "layerskip-auto"], {"gammas": [2, 3]})
    assert not skipped and [x.name for x in methods] == ["plain", "layerskip/g2", "layerskip/g3", "layerskip/auto"]
    prompt = m.encode(PROMPTS[0])
    outs = [x.run(prompt, 24) for x in methods]
    assert all(o.token_ids == outs[0].token_ids for o in outs)
    assert all(o.steps and any(d for d, _ in o.steps) for o in outs[1:3])  # fixed γ: drafts every pass
    args = argparse.Namespace(methods="layerskip", gammas="2,auto", quick=True, lookup_tokens=None, peer_gammas=None,
                              reps=None, per_category=None, max_new_tokens=None, cost_repeats=None, threads=None)
    assert resolve_settings(args).families == ["plain", "layerskip", "layerskip-auto"]


def test_calibrate_a_gguf_target_on_chats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A GGUF target is calibrated on chats in its own template; the choice goes to
    ``TARGET/drafters/layerskip/`` (a file has no folder of its own), stamped with the file, and
    ``--drafter layerskip`` finds it there as it finds every drafter's artifact."""
    from gguf_util import tiny_gguf
    from specdecode.cli import main
    from specdecode.train.calibrate import default_prompts_file, prompt_ids
    from specdecode.drafters.registry import resolve_artifacts

    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    _, gguf = tiny_gguf(tmp_path)
    m = sd.load_model(gguf)
    chat = (("user", "def fib(n):"),)
    rendered = "<|im_start|>user\ndef fib(n):<|im_end|>\n<|im_start|>assistant\n"  # gguf_util's template
    assert prompt_ids(m, [chat, "def f"]) == [m.encode(rendered, add_special_tokens=False), m.encode("def f")]
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"category": c, "messages": [{"role": "user", "content": t}]}) + "\n"
                             for c, t in [("code", PROMPTS[0]), ("code", PROMPTS[1]), ("chat", "hello there")]))
    assert default_prompts_file(tmp_path) is None  # without TARGET/data/prompts.jsonl: the bundled workload
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "prompts.jsonl").write_text(chats.read_text())
    assert default_prompts_file(tmp_path) == tmp_path / "data" / "prompts.jsonl"
    assert main(["calibrate", "--target", str(gguf), "--prompts", str(chats), "--per-category", "1",
                 "--minutes", "0.05", "--max-new-tokens", "8", "--no-progress"]) == 0
    assert "stored in" in capsys.readouterr().out
    folder = tmp_path / "drafters" / "layerskip"
    rec = json.loads((folder / CALIBRATION_FILE).read_text())
    assert rec["prompts"] == 2 and rec["weights"] == f"{gguf.name}:{gguf.stat().st_size}"
    artifacts = resolve_artifacts({}, None, str(gguf))
    assert artifacts["layerskip"] == str(folder)
    drafter = build_drafter("layerskip", DrafterOptions(gamma=2, artifacts=artifacts))
    assert isinstance(drafter, LayerSkipDrafter)
    drafter.prepare_rows(m, 1, 64)
    assert drafter.calibration is not None and drafter.plan == DraftLayers(tuple(rec["layers"]), rec["n_layers"])
    plain = sd.generate(m, PROMPTS[2], max_new_tokens=12, ignore_eos=True)
    assert sd.generate(m, PROMPTS[2], drafter=drafter, max_new_tokens=12, ignore_eos=True).token_ids == plain.token_ids
    # the same file, other weights (another size): the stored choice is stale
    gguf.write_bytes(gguf.read_bytes() + b"\0" * 32)
    assert load_calibration(gguf, rec["n_layers"], folder) is None


def test_auto_takes_layer_skip_only_where_it_was_found_to_pay() -> None:
    from specdecode.drafters.registry import get_spec

    usable = get_spec("layerskip").auto.usable  # type: ignore[union-attr]
    assert usable is not None
    d, o = LayerSkipDrafter(), DrafterOptions()
    assert not usable(d, o)  # uncalibrated
    d.calibration = {"speculation_pays": False}
    assert not usable(d, o)  # calibrated, and it does not pay (SmolLM2's verdict)
    d.calibration = {"speculation_pays": True}
    assert usable(d, o)
    d.calibration = None
    assert usable(d, DrafterOptions(options={"exit_layer": 2}))  # an explicit choice is the user's
