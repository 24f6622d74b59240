"""Issue #30 item 1 at the library level: neither junk requests nor a pessimistic cost cache switch
speculation off for the requests after them (the sequence an outside probe ran against a server)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Optional, Sequence, Union

import pytest

import specdecode.sizing.book as cm
import specdecode.drafters.model as drafter_module
from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.core import DecodeCore
from specdecode.rows import FinishEvent, Request
from specdecode.sizing.book import cached_costs
from specdecode.sizing.costs import Costs
from specdecode.sizing.gamma import Gamma
from specdecode.metrics import GenerationStats
from specdecode.models import Model, load_model
from specdecode.sizing.policy import GammaPolicy
from pricing import fixed

MODELS = Path(__file__).resolve().parents[2] / "models"
PROMPT = "def fib(n):"
# the bundled pair as measured on a quiet 2-core EPYC: a cheap draft, verification nearly flat to 8 tokens
FIXED = Costs(c=0.06, v=(1.0,) * 8 + tuple(1.0 + 0.08 * k for k in range(1, 9)))

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (MODELS / "code-draft" / "config.json").is_file(), reason="bundled models absent")]


class FrozenCosts(GammaPolicy):
    """Live timings ignored: choices then depend on the evidence alone, so two runs compare exactly."""

    def record_target(self, batch: int, width: int, seconds: float) -> None:
        pass

    def record_draft(self, drafter: str, rows: int, depth: int, seconds: float) -> None:
        pass


@pytest.fixture(scope="module")
def pair() -> tuple[Model, Model]:
    return load_model(MODELS / "code-target"), load_model(MODELS / "code-draft")


def new_core(pair: tuple[Model, Model], policy: Union[GammaPolicy, None] = None) -> DecodeCore:
    return DecodeCore(pair[0], {"model": drafter_module.DraftModelDrafter(pair[1])}, max_rows=4, policy=policy)


def run(core: DecodeCore, prompt: Union[str, Sequence[int]], max_tokens: int, gamma: Optional[Gamma] = None,
        drafter: str = "model") -> GenerationStats:
    """One greedy request through the core, as the server runs it; its stats."""
    ids = core.target.encode(prompt) if isinstance(prompt, str) else list(prompt)
    core.add(Request(ids, SamplingConfig(temperature=0.0), GenerationConfig(max_new_tokens=max_tokens), drafter,
                     gamma=gamma))
    while core.rows:
        for _, ev in core.step():
            if isinstance(ev, FinishEvent):
                return ev.stats
    raise AssertionError("no finish event")


def near(got: int, want: int, tol: float = 0.10) -> bool:
    return abs(got - want) <= tol * want


def test_three_junk_requests_leave_the_next_request_as_a_fresh_one(pair: tuple[Model, Model]) -> None:
    fresh = run(new_core(pair, FrozenCosts(fixed(FIXED))), PROMPT, 64)
    core = new_core(pair, FrozenCosts(fixed(FIXED)))
    junk = [run(core, "x", 2) for _ in range(3)]
    assert all(j.drafted == 1 and j.accepted == 0 for j in junk)  # the junk: one draft token, rejected
    after = run(core, PROMPT, 64)
    assert fresh.drafted > 40 and fresh.accepted > 30
    assert near(after.accepted, fresh.accepted) and near(after.drafted, fresh.drafted), (after, fresh)


def test_a_hundred_random_junk_requests_leave_the_next_request_as_a_fresh_one(pair: tuple[Model, Model]) -> None:
    fresh = run(new_core(pair, FrozenCosts(fixed(FIXED))), PROMPT, 64)
    core = new_core(pair, FrozenCosts(fixed(FIXED)))
    rng = random.Random(0)
    for _ in range(100):
        run(core, [rng.randrange(pair[0].vocab_size) for _ in range(rng.randint(1, 6))], rng.randint(1, 3))
    history = core.drafters["model"].acceptance
    assert history.accepted / history.evaluated < 0.4  # the drafter's record is bad ...
    after = run(core, PROMPT, 64)
    # ... a prior only
    assert near(after.accepted, fresh.accepted) and near(after.drafted, fresh.drafted), (after, fresh)


def test_an_explicit_gamma_is_honoured(pair: tuple[Model, Model]) -> None:
    core = new_core(pair, FrozenCosts(fixed(FIXED)))
    for _ in range(30):
        run(core, "x", 2)
    s = run(core, PROMPT, 40, gamma=4)
    assert s.drafted >= 4 * (s.target_passes - 2)  # every pass with room drafts the 4 tokens asked for


def test_a_pessimistic_cost_cache_is_corrected_by_the_live_passes(pair: tuple[Model, Model], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cached file says c = 1.5 (no γ pays); by the 8th request the live timings have taken over
    (it speculates about as much as a core with a sound cache), and the file the live passes contradicted
    is rewritten."""
    monkeypatch.setattr(cm, "_MEMO", {})
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "good"))
    fresh = run(new_core(pair), PROMPT, 64)

    monkeypatch.setattr(cm, "_MEMO", {})
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "bad"))
    new_core(pair).drafters["model"].costs_for(pair[0])  # writes the cache file ...
    files = list((tmp_path / "bad" / "costs").glob("*.json"))
    assert len(files) == 1
    for f in files:  # ... which a measurement under load then spoils
        d = json.loads(f.read_text())
        f.write_text(json.dumps(dict(d, c=1.5)))
    monkeypatch.setattr(cm, "_MEMO", {})
    core = new_core(pair)
    key = files[0].stem
    assert core.policy.offline("model") is not None and core.policy.offline("model").c == 1.5  # type: ignore[union-attr]
    stats = [run(core, PROMPT, 64) for _ in range(8)]
    # level with a fresh core within 10% (issue 49): γ follows each machine's timings, so the 8th request may
    # draft more than the fresh one did (48 accepted against 42 on CI's machine) or a little less (49-52 against
    # 49-51 on a loaded 2-core EPYC, from the 1st or 2nd request on)
    assert stats[7].accepted >= 0.9 * fresh.accepted, (stats[7], fresh)
    assert stats[0].drafted > 0  # the first request already probes, and the probe's timing counts at once
    monkeypatch.setattr(cm, "_MEMO", {})
    rewritten = cached_costs(key)
    assert rewritten is not None and rewritten.c < 0.5  # the live figure replaced the spoiled one on disk


def test_a_cache_with_its_wider_passes_timed_under_load_is_corrected_by_the_narrow_ones(
        pair: tuple[Model, Model], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every width from 2 tokens cached 3x too dear: only γ = 1 looks worth drafting, and a width never run is
    never measured. The narrow widths' live timings show the overstatement, the untried widths are scaled alike
    (``sizing.live.overstated``) and so tried: by the 3rd request the core accepts within 10% of a fresh one's
    (before: 30 against 51 for every request), and the file is rewritten. Two requests a side: live timings move
    one request's accepted tokens by up to ~10% on their own (44 against a fresh core's 49 was seen once)."""
    monkeypatch.setattr(cm, "_MEMO", {})
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "good"))
    fresh_core = new_core(pair)
    fresh = [run(fresh_core, PROMPT, 64) for _ in range(2)]

    monkeypatch.setattr(cm, "_MEMO", {})
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "bad"))
    new_core(pair).drafters["model"].costs_for(pair[0])
    (f,) = list((tmp_path / "bad" / "costs").glob("*.json"))
    d = json.loads(f.read_text())
    v = [1.0] + [3.0 * x for x in d["v"][1:]]
    f.write_text(json.dumps(dict(d, v=v, target_s=[d["target_s"][0] * x for x in v])))
    monkeypatch.setattr(cm, "_MEMO", {})
    core = new_core(pair)
    stats = [run(core, PROMPT, 64) for _ in range(4)]
    got, want = sum(s.accepted for s in stats[2:]), sum(s.accepted for s in fresh)
    assert got >= 0.9 * want, ([s.accepted for s in stats], [s.accepted for s in fresh])
    monkeypatch.setattr(cm, "_MEMO", {})
    rewritten = cached_costs(f.stem)
    assert rewritten is not None and rewritten.v[4] < 2.0  # the untried widths no longer 3x on disk


def test_auto_on_a_target_whose_wider_passes_were_cached_3x_too_dear(pair: tuple[Model, Model], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` sizes its members' drafts with the target's v(n) itself, so the policy's correction of a
    pessimistic cache must reach it too: the widths its members have run show the overstatement, and the ones
    not run are scaled alike (``sizing.live.live_v``), and a row where nothing pays drafts a token on a probe
    schedule so that wider passes get run at all. From the 2nd request it accepts at least 3/4 of what a fresh core
    accepts (before: 0 drafted, request after request; then from the 3rd, until the drafters heard a width as soon
    as its timings were trusted, not at the 1st request's end; both sides size from live timings, which move
    acceptance by 15-20% between runs on a shared 2-core machine: 41 against 50 was seen once)."""
    from specdecode.drafters.auto import AutoDrafter
    from specdecode.drafters.base import as_batch_drafter
    from specdecode.drafters.ngram import PromptLookupDrafter

    def auto_core() -> DecodeCore:
        members = {"model": drafter_module.DraftModelDrafter(pair[1]), "ngram": as_batch_drafter(PromptLookupDrafter())}
        return DecodeCore(pair[0], {"auto": AutoDrafter(members)}, max_rows=4, prepare=["auto"])

    monkeypatch.setattr(cm, "_MEMO", {})
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "good"))
    fresh = run(auto_core(), PROMPT, 64, gamma="auto", drafter="auto")
    monkeypatch.setattr(cm, "_MEMO", {})
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "bad"))
    auto_core()  # writes the cache files ...
    for f in (tmp_path / "bad" / "costs").glob("*.json"):  # ... which a measurement under load then spoils
        d = json.loads(f.read_text())
        v = [1.0] + [3.0 * x for x in d["v"][1:]]
        f.write_text(json.dumps(dict(d, v=v, target_s=[d["target_s"][0] * x for x in v])))
    monkeypatch.setattr(cm, "_MEMO", {})
    core = auto_core()
    stats = [run(core, PROMPT, 64, gamma="auto", drafter="auto") for _ in range(4)]
    assert min(s.accepted for s in stats[1:]) >= 0.75 * fresh.accepted, ([s.accepted for s in stats], fresh.accepted)
    assert stats[0].drafted > 0  # rows where nothing pays probe one token now and then: so the passes get timed
