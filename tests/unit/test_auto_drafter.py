"""AutoDrafter's choice: cheap deterministic drafts by their own value, costly members by predicted rate,
plain when nothing pays, sampled drafts never chosen by content, and attribution by source."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

import specdecode as sd
from specdecode.config import SamplingConfig
from specdecode.sizing.costs import Costs
from specdecode.drafters.auto import AutoDrafter
from specdecode.drafters.auto_members import PROBE_FIRST
from specdecode.draft import Draft, DraftContext
from specdecode.drafters.base import Acceptance


class Fake(sd.BatchDrafterBase):
    """A member that returns fixed drafts and counts its calls."""

    wants_hidden = False

    def __init__(self, tokens: list[int], expected: float | None = None, costs: Costs | None = None,
                 sampled: bool = False) -> None:
        self.tokens, self.expected, self.costs, self.sampled = tokens, expected, costs, sampled
        self.gamma = 15
        self.acceptance = Acceptance()
        self.calls: list[list[int]] = []
        self.verified: list[tuple[int, int]] = []

    def prepare_rows(self, target, rows, max_len):  # type: ignore[no-untyped-def]
        pass

    def costs_for(self, target):  # type: ignore[no-untyped-def]
        return self.costs

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        self.calls.append(sorted(contexts))
        out = {}
        for r, c in contexts.items():
            toks = self.tokens[: c.max_tokens]
            probs = torch.full((len(toks), 8), 1 / 8) if self.sampled and toks else None
            out[r] = Draft(list(toks), probs, None, expected=self.expected)
        return out

    def on_verified_row(self, row: int, n: int) -> None:
        self.verified.append((row, n))

    def reset_row(self, row: int) -> None:
        pass

    def move_row(self, src: int, dst: int) -> None:
        pass


def _ctx(k: int = 8) -> DraftContext:
    return DraftContext([1, 2, 3], k, SamplingConfig(), None)


def _auto(tiny_dirs: dict[str, Path], members: dict) -> AutoDrafter:  # type: ignore[type-arg]
    auto = AutoDrafter(members)
    auto.prepare_rows(sd.load_model(tiny_dirs["llama"]), 4, 64)
    auto._t1 = 1.0  # a tiny model's pass takes microseconds: the fakes' Python overhead would read as dear
    _fixed_base(auto)  # not this machine's v(n): a steep one (seen under load) lets no draft pay
    return auto


def test_plain_when_nothing_pays(tiny_dirs: dict[str, Path]) -> None:
    weak = Fake([5, 6], expected=1.0)  # predicts no gain
    auto = _auto(tiny_dirs, {"weak": weak})
    out = auto.propose_rows({0: _ctx(), 1: _ctx()})
    assert all(not d.tokens for d in out.values())
    auto.on_verified_row(0, 0)
    assert not weak.verified  # nothing was drafted, nothing is reported to the member


def test_cheap_draft_wins_per_row_and_costly_member_fills_the_rest(tiny_dirs: dict[str, Path]) -> None:
    good_model = Costs(c=0.05, v=tuple(1.0 + 0.02 * k for k in range(16)))
    model = Fake([7, 7, 7, 7], costs=good_model)
    strong = Fake([5, 6, 7, 8], expected=4.5)  # a long, confident match
    auto = _auto(tiny_dirs, {"model": model, "suffix": strong})
    out = auto.propose_rows({0: _ctx(), 1: _ctx()})
    assert out[0].source == out[1].source == "suffix" and out[0].tokens == [5, 6, 7, 8]
    assert model.calls == []  # the model's predicted rate does not beat those drafts: it is not run
    auto.on_verified_row(0, 3)
    assert strong.verified == [(0, 3)] and auto.contributions()["suffix"] == 3
    strong.expected = 1.0  # no match worth drafting now: the model drafts, batched for both rows
    out = auto.propose_rows({0: _ctx(), 1: _ctx()})
    assert model.calls == [[0, 1]] and {d.source for d in out.values()} == {"model"}


def test_sampled_cheap_drafts_are_never_chosen_by_content(tiny_dirs: dict[str, Path]) -> None:
    sampler = Fake([1, 2, 3], expected=9.0, sampled=True)
    auto = _auto(tiny_dirs, {"sampler": sampler})
    out = auto.propose_rows({0: _ctx()})
    assert not out[0].tokens  # discarded whatever it drew
    assert auto.members[0].sampled and not auto.members[0].cheap


def test_unavailable_member_is_dropped(tiny_dirs: dict[str, Path]) -> None:
    ok = Fake([1], expected=3.0)
    auto = AutoDrafter({"ok": ok, "needs_calibration": Fake([2])}, usable={"needs_calibration": lambda d: False})
    auto.prepare_rows(sd.load_model(tiny_dirs["llama"]), 1, 64)
    assert auto.names == ["ok"]


def test_a_weak_draft_from_a_dear_member_gives_way_to_the_next(tiny_dirs: dict[str, Path]) -> None:
    model = Fake([7, 7, 7, 7], costs=Costs(c=0.05, v=tuple(1.0 + 0.02 * k for k in range(16))))
    suffix = Fake([5], expected=2.0)  # pays over plain decoding, but less than the model is predicted to
    auto = _auto(tiny_dirs, {"model": model, "suffix": suffix})
    for _ in range(9):
        auto.members[1].timings.add(0.12)  # measured dear: it is ranked by its realised rate
    auto.members[1].c = 0.12
    auto.members[1].rates.set_mean(6.0)  # ... which is high (it was good on earlier text)
    out = auto.propose_rows({0: _ctx()})
    assert suffix.calls and model.calls  # suffix first; its weak draft lets the model try
    assert out[0].source == "model"
    model.tokens = []  # the model proposes nothing after all: the weak draft still beats plain decoding
    out = auto.propose_rows({0: _ctx()})
    assert out[0].source == "suffix" and out[0].tokens == [5]


def _fixed_base(auto: AutoDrafter) -> None:
    """v(k) written by hand, so realised rates do not hang on the tiny model's timing."""
    auto._base = Costs(c=0.0, v=tuple(1.0 + 0.02 * k for k in range(16)))


def test_a_losing_cheap_member_proposes_every_step_and_its_first_good_draft_is_taken(tiny_dirs: dict[str, Path]
                                                                                    ) -> None:
    """A repeat starts without warning: a cheap member that lost 40 steps in a row still proposes on every
    row at the next, and its good draft is used at once (a sit-out after lost steps cost auto 19% on the
    real workload)."""
    model = Fake([7, 7, 7, 7], costs=Costs(c=0.05, v=tuple(1.0 + 0.02 * k for k in range(16))))
    lookup = Fake([5], expected=1.0)  # proposes a draft predicted to gain nothing: it loses to the model
    auto = _auto(tiny_dirs, {"model": model, "lookup": lookup})
    for _ in range(40):
        out = auto.propose_rows({0: _ctx(), 1: _ctx()})
        assert out[0].source == out[1].source == "model"
        auto.on_verified_row(0, 1)
        auto.on_verified_row(1, 1)
    assert lookup.calls == [[0, 1]] * 40
    lookup.expected = 9.0  # its drafts turn good
    out = auto.propose_rows({0: _ctx(), 1: _ctx()})
    assert out[0].source == out[1].source == "lookup" and out[0].tokens == [5]


def _timed(auto: AutoDrafter, member: Fake, cost: float) -> None:
    """Auto's timer made a counter on which only ``member``'s proposals take time: ``cost`` a row."""
    clock = [0.0]
    auto._clock = lambda: clock[0]
    propose = member.propose_rows

    def timed(contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        clock[0] += cost * len(contexts)
        return propose(contexts)

    member.propose_rows = timed  # type: ignore[method-assign]


def test_losing_dear_member_is_probed_at_doubling_intervals_and_adopted_when_good(tiny_dirs: dict[str, Path]) -> None:
    model = Fake([7, 7, 7, 7], costs=Costs(c=0.05, v=tuple(1.0 + 0.02 * k for k in range(16))))
    heads = Fake([4, 4, 4])  # a self-sizing member costing half a target pass: judged by its realised rate
    auto = _auto(tiny_dirs, {"model": model, "heads": heads})
    _fixed_base(auto)
    _timed(auto, heads, 0.5)
    m = auto.members[1]
    for _ in range(9):
        m.timings.add(0.5)
    m.c, m.steps = 0.5, 5  # it drafted before and did poorly
    m.rates.set_mean(1.2)
    probes = []
    for step in range(600):
        out = auto.propose_rows({0: _ctx()})
        if out[0].source == "heads":
            probes.append(step)
        auto.on_verified_row(0, 0 if out[0].source == "heads" else 2)
    # tried once as the request starts (no request inherits another's verdict), then idle 32 steps, 64, 128,
    # 256 (each losing probe doubles the wait): a few steps in 600
    assert probes == [0, 32, 96, 224, 480]
    assert m.rates.mean < 1.2  # the probes confirmed it
    heads.tokens = list(range(1, 16))  # now its drafts are all accepted: the next probe finds it
    for _ in range(600):
        out = auto.propose_rows({0: _ctx(k=15)})
        auto.on_verified_row(0, len(out[0].tokens) if out[0].source == "heads" else 2)
    assert auto.propose_rows({0: _ctx(k=15)})[0].source == "heads"  # adopted: chosen on its own merit
    assert m.probes.gap == PROBE_FIRST


def test_a_dear_member_that_declines_loses_its_rate_and_is_no_longer_asked(tiny_dirs: dict[str, Path]) -> None:
    """A self-sizing member asked to draft and drafting nothing (its own planner saw nothing worth it) cost
    the step its c for nothing: its rate falls below plain decoding, so auto stops paying for the asking
    (on SmolLM2's AVX2 path EAGLE, ranked by its drafting steps only, was asked every step and declined most)."""
    heads = Fake([])  # declines every call
    auto = _auto(tiny_dirs, {"heads": heads})
    _timed(auto, heads, 0.3)
    m = auto.members[0]
    for _ in range(9):
        m.timings.add(0.3)
    m.c, m.steps = 0.3, 5  # it drafted well on earlier text
    m.rates.set_mean(2.0)
    for _ in range(40):
        assert not auto.propose_rows({0: _ctx()})[0].tokens
    assert m.rate_at(0) < 1.0  # in this request (it starts it optimistic) ...
    assert m.rates.mean < 2.0  # ... and across requests
    assert len(heads.calls) < 15  # asked until its rate fell, then only probed


def test_hidden_state_members_get_their_layers_from_the_core(tiny_dirs: dict[str, Path]) -> None:
    """An EAGLE-like member inside auto receives the intermediate layers it names (the decode core
    captures what auto's ``hidden_layers`` asks for)."""

    class LayersFake(Fake):
        wants_hidden = True
        hidden_layers = (0, 1)

        def __init__(self) -> None:
            super().__init__([], expected=None)
            self.seen: list[set[int]] = []

        def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
            self.seen += [set(c.layers or {}) for c in contexts.values()]
            return super().propose_rows(contexts)

    feats = LayersFake()
    auto = AutoDrafter({"feats": feats, "lookup": Fake([1], expected=1.0)})
    target = sd.load_model(tiny_dirs["llama"])
    sd.generate(target, [1, 2, 3, 4], drafter=auto, max_new_tokens=4)
    assert auto.wants_hidden and auto.hidden_layers == (0, 1)
    assert feats.seen and all(s == {0, 1} for s in feats.seen)
    plain = AutoDrafter({"lookup": Fake([1], expected=1.0)})
    plain.prepare_rows(target, 1, 64)
    assert not plain.wants_hidden and plain.hidden_layers == ()


@pytest.mark.slow
def test_one_checkpoint_auto_includes_the_int4_copy_and_a_draft_model_replaces_it(tiny_dirs: dict[str, Path]) -> None:
    from specdecode.drafters import DrafterOptions, build_drafter

    alone = build_drafter("auto", DrafterOptions())
    assert "quant" in alone.names and "model" not in alone.names  # type: ignore[union-attr]
    draft = sd.load_model(tiny_dirs["llama"])
    paired = build_drafter("auto", DrafterOptions(draft=draft))
    assert "model" in paired.names and "quant" not in paired.names  # type: ignore[union-attr]
    # and with the copy among its members auto stays exact: greedy output equals plain decoding's
    target = sd.load_model(tiny_dirs["llama"])
    prompt = [1, 5, 9, 2, 7, 3]
    plain = sd.generate(target, prompt, max_new_tokens=24, ignore_eos=True).token_ids
    got = sd.generate(target, prompt, drafter=alone, max_new_tokens=24, ignore_eos=True)
    assert got.token_ids == plain
    assert "quant" in alone.names  # type: ignore[union-attr]  # it could run here (CPU, fp32 activations)


@pytest.mark.parametrize("weight_dtype", ["int8", "int4"])
def test_a_quantized_target_leaves_its_int4_copy_out_of_auto(tiny_dirs: dict[str, Path], weight_dtype: str) -> None:
    """The copy of an int4 or int8 target costs about what the target does, so auto never chose it; it is
    left out before being prepared (quantizing the copy cost ~3 s of SmolLM2's first request)."""
    from specdecode.drafters import DrafterOptions, build_drafter

    auto = build_drafter("auto", DrafterOptions())
    assert isinstance(auto, AutoDrafter) and "quant" in auto.names
    target = sd.load_model(tiny_dirs["llama"], weight_dtype=weight_dtype)
    prompt = [1, 5, 9, 2, 7, 3]
    plain = sd.generate(target, prompt, max_new_tokens=16, ignore_eos=True).token_ids
    assert sd.generate(target, prompt, drafter=auto, max_new_tokens=16, ignore_eos=True).token_ids == plain
    assert "quant" not in auto.names and "suffix" in auto.names


def test_a_chain_without_its_own_prediction_is_cut_to_its_best_paying_prefix(tiny_dirs: dict[str, Path]) -> None:
    """Prompt lookup proposes fixed-length copies. Where a verified token costs 0.3 of a pass (AVX2 int4) a
    10-token copy at α 0.75 is worth E / v(10) = 3.83 / 4.0 < 1, so it was never chosen, even where it would
    have been accepted whole; its 2-token prefix is worth 2.31 / 1.6 = 1.45 (3 tokens: 2.73 / 1.9 = 1.44)."""
    lookup = Fake(list(range(10, 20)))
    sure = Fake([5, 6, 7], expected=1.0)  # a member with its own prediction is taken as it is (and loses here)
    auto = _auto(tiny_dirs, {"lookup": lookup, "sure": sure})
    auto._base = Costs(c=0.0, v=tuple(1.0 + 0.3 * k for k in range(16)))
    out = auto.propose_rows({0: _ctx(k=10)})
    assert out[0].tokens == [10, 11] and out[0].source == "lookup"
    auto.on_verified_row(0, 2)
    assert lookup.verified == [(0, 2)] and lookup.acceptance.evaluated == 2  # the evidence is the cut draft's


def test_junk_before_a_request_sets_neither_how_it_values_drafts_nor_which_members_it_tries(
        tiny_dirs: dict[str, Path]) -> None:
    """Issue 49: junk requests (every draft rejected) before a request are history, a bounded prior: the new
    request values a chain member's drafts and tries a dear member as on a fresh server."""
    def build() -> AutoDrafter:
        auto = _auto(tiny_dirs, {"lookup": Fake([5, 6, 7, 8]), "heads": Fake([4, 4, 4])})
        heads = auto.members[1]
        _timed(auto, heads.drafter, 0.5)  # type: ignore[arg-type]
        for _ in range(9):
            heads.timings.add(0.5)
        heads.c = 0.5  # dear: judged by its realised rate
        return auto

    fresh, auto = build(), build()
    for _ in range(50):  # the junk request: whatever is drafted is rejected
        auto.propose_rows({0: _ctx()})
        auto.on_verified_row(0, 0)
    auto.reset_row(0)
    lookup, heads = auto.members
    assert lookup.alpha < 0.3 and heads.rates.mean < auto.pricer.margin  # the shared record says neither pays
    assert lookup.row_evidence(0).alpha >= 0.9 * fresh.members[0].row_evidence(0).alpha  # what its drafts are valued at
    assert auto.propose_rows({0: _ctx()})[0].source == fresh.propose_rows({0: _ctx()})[0].source == "heads"
