"""The cost model's arithmetic, and the γ policy driven by it as the decode core drives it for one row."""

from __future__ import annotations

from pathlib import Path

import pytest

import specdecode as sd
from specdecode.sizing.book import chain_spec, get_costs
from specdecode.sizing.costs import Costs, expected_tokens, predicted_speedup
from specdecode.drafters.base import Acceptance
from specdecode.sizing.policy import GammaPolicy, RowPlan
from specdecode.sizing.pricer import Pricer
from pricing import fixed


class OneRow:
    """``GammaPolicy`` with offline costs and a drafter's ``Acceptance``, stepped as ``DecodeCore`` steps
    a single row (fade, choose, mark)."""

    def __init__(self, costs: Costs, margin: float = 1.0, **acceptance: float) -> None:
        self.policy = GammaPolicy(Pricer(margin))
        self.policy.set_offline("d", costs)
        self.acc = Acceptance(**acceptance)

    def choose(self) -> int:
        self.acc.fade()
        g = self.policy.choose([RowPlan("d", 15, True, self.acc.alpha)])[0]
        self.acc.mark(g)
        return g

    def update(self, drafted: int, accepted: int) -> None:
        self.acc.update(drafted, accepted)


@pytest.mark.parametrize("alpha, gamma, speedup", [
    (0.6, 2, 1.96), (0.7, 3, 2.53), (0.8, 2, 2.44), (0.8, 5, 3.69), (0.9, 2, 2.71), (0.9, 10, 6.86),
])
def test_leviathan_table1(alpha: float, gamma: int, speedup: float) -> None:
    assert round(predicted_speedup(alpha, gamma, c=0.0, v=1.0), 2) == speedup


def test_expected_tokens_edges() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0


def test_best_gamma_follows_alpha_and_costs() -> None:
    flat = Costs(c=0.05, v=tuple([1.0] * 16))
    assert flat.best_gamma(0.9) > flat.best_gamma(0.6) > 0
    assert flat.best_gamma(0.04) == 0  # alpha <= c: no gamma pays
    steep = Costs(c=0.05, v=tuple(1.0 + 0.5 * k for k in range(16)))
    assert steep.best_gamma(0.9) < flat.best_gamma(0.9)


def test_adaptive_gamma_turns_off_and_probes_as_evidence_fades() -> None:
    policy = OneRow(Costs(c=0.2, v=tuple(1.0 + 0.3 * k for k in range(16))), half_life=16)
    assert policy.choose() > 0  # optimistic prior
    for _ in range(20):
        policy.update(3, 0)  # everything rejected
    # (the evidence lives with the drafter: a new request does not make a useless drafter draft again)
    picks = [policy.choose() for _ in range(200)]
    first = next(i for i, g in enumerate(picks) if g)
    # threshold α = 0.5 here, i.e. evidence weight 0.8; it fades from 20 to that in 16 * log2(25) = 74 passes
    assert 70 <= first <= 80 and picks[first] == 1
    for _ in range(200):
        policy.update(4, 4)
    assert policy.choose() >= 4
    assert policy.acc.evaluated <= policy.acc.memory  # a window over the recent judged tokens


def test_adaptive_gamma_follows_a_change_of_workload_quickly() -> None:
    policy = OneRow(Costs(c=0.2, v=tuple(1.0 + 0.1 * k for k in range(16))))
    for _ in range(500):  # 2000 accepted tokens
        policy.update(4, 4)
    assert policy.choose() >= 4
    steps = 0
    while policy.choose() > 0:
        policy.update(4, 0)
        steps += 1
    assert steps < 150  # the estimate spans ~100 judged tokens, not all 2000


def test_auto_gamma_is_exact_and_drafts_when_it_pays(tiny_dirs: dict[str, Path]) -> None:
    # a cheap draft with flat verification cost: with draft == target (alpha = 1) auto must draft
    cheap = fixed(Costs(c=0.05, v=tuple([1.0] * 16)))
    target = sd.load_model(tiny_dirs["llama"])
    plain = sd.generate(target, "def fib(n):", max_new_tokens=20, ignore_eos=True)
    auto = sd.generate(target, "def fib(n):", drafter=sd.DraftModelDrafter(target), max_new_tokens=20, ignore_eos=True,
                       pricer=cheap)
    assert auto.token_ids == plain.token_ids
    assert auto.stats.tau > 3.0
    # the same pair priced as it really is (draft = target costs c = 1): speculation never pays, so the
    # request only probes on its schedule (one token at its first pass, one after 8 plain passes)
    off = sd.generate(target, "def fib(n):", drafter=sd.DraftModelDrafter(target), max_new_tokens=20, ignore_eos=True,
                      pricer=fixed(Costs(c=1.0, v=tuple([1.0] * 16))))
    assert off.token_ids == plain.token_ids and off.stats.drafted <= 2


def test_costs_are_measured_once_and_cached(tiny_dirs: dict[str, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import specdecode.sizing.book as cm

    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path))
    monkeypatch.setattr(cm, "_MEMO", {})
    target, draft = sd.load_model(tiny_dirs["llama"]), sd.load_model(tiny_dirs["draft"])
    costs = get_costs(target, chain_spec(target, draft))
    assert costs.v[0] == 1.0 and len(costs.v) == 16 and costs.c > 0
    assert all(x >= 1.0 for x in costs.v)
    files = list((tmp_path / "costs").glob("*.json"))
    assert len(files) == 1
    monkeypatch.setattr(cm, "_MEMO", {})
    monkeypatch.setattr(cm, "measure_steps", lambda *a: pytest.fail("measured again despite the cache file"))
    assert get_costs(target, chain_spec(target, draft)) == costs


def test_a_probe_after_plain_steps_feeds_the_draft_a_window(tiny_dirs: dict[str, Path]) -> None:
    import specdecode.drafters.model as drafter_module
    from specdecode.config import SamplingConfig

    cheap = fixed(Costs(c=0.05, v=tuple([1.0] * 16)))
    target = sd.load_model(tiny_dirs["llama"])
    drafter = sd.DraftModelDrafter(target)  # self-speculation: everything it proposes is accepted
    drafter.pricer = cheap
    drafter.prepare(target)
    tokens = target.encode("def fib(n):\n    return n\n" * 24)
    assert len(tokens) > 2 * drafter_module.PROBE_WINDOW
    d = drafter.propose(sd.DraftContext(tokens, 4, SamplingConfig(), None, probe=True))
    assert len(d) > 0
    assert drafter._cache is not None and drafter._cache.length() == drafter_module.PROBE_WINDOW + len(d) - 1
    drafter.on_verified(len(d))
    # and whole generations that start off, probe with a window, then draft: still exact
    from specdecode.config import GenerationConfig
    from specdecode.core import DecodeCore
    from specdecode.rows import FinishEvent, Request

    plain = sd.generate(target, tokens, max_new_tokens=40, ignore_eos=True)
    drafter.reset()
    core = DecodeCore(target, {"d": drafter}, policy=GammaPolicy(cheap))
    row = core.add(Request(tokens, generation=GenerationConfig(max_new_tokens=40, ignore_eos=True), drafter="d"))
    assert row.evidence is not None
    row.evidence.started, row.evidence.evaluated = True, 40.0  # α̂ ≈ 0.03 < c: plain until its next probe
    done = [ev for _ in range(40) for _, ev in core.step() if isinstance(ev, FinishEvent)]
    r = done[0]
    assert r.token_ids == plain.token_ids  # the draft saw a 64-token window; the output does not change
    assert r.stats.drafted > 0 and r.stats.target_passes > r.stats.drafted_by_position[0]  # some steps were plain
