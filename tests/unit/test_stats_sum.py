"""Per-source stats add up: for every request, the draft tokens judged and accepted per source sum to the
request's totals, under every kind of constraint, with and without ``logit_bias``, greedy and sampled, for
plain drafters and for ``auto``. Tokens a grammar forces are drafted by the grammar (source ``"grammar"``),
not by the row's drafter; ``auto`` is the chooser (``GenerationStats.chooser``), never a source beside the
members it chose among."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import pytest

pytest.importorskip("llguidance")

import specdecode as sd
from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.constraint_spec import ConstraintSpec, json_schema_spec
from specdecode.constraints import bind
from specdecode.core import DecodeCore, FinishEvent, Request
from specdecode.costmodel import Costs
from specdecode.drafters import Draft, DraftContext, DrafterOptions, build_drafter
from specdecode.drafters.auto import AutoDrafter
from specdecode.drafters.suffix import SuffixDrafter
from specdecode.metrics import FORCED_SOURCE, GenerationStats

CHEAP = Costs(c=0.0, v=tuple(1.0 + 0.05 * k for k in range(64)))
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["name", "n"], "additionalProperties": False}
SPECS: dict[str, Optional[ConstraintSpec]] = {
    "json_schema": json_schema_spec(SCHEMA),
    "regex": ConstraintSpec("regex", r"(add|fib)\((add|fib|[0-9]{1,2})\) = [0-9]{1,3}"),
    "grammar": ConstraintSpec("grammar", 'start: "x = " NUM " + " NUM\nNUM: /[0-9]{1,3}/'),
    "json_object": ConstraintSpec("json_object"),
    "none": None,
}
# text the cheap members can copy from: repeats, and the shapes the constraints ask for
PROMPTS = ['{"name": "fib", "n": 12}\n{"name": "fib", "n": 12}\n{"name": "fib", "n": 1',
           "fib(12) = 144\nadd(fib) = 12\nfib(12) = 144\nfib(1",
           "x = 12 + 34\nx = 12 + 34\nx = 1"]
DRAFTERS = ("model", "suffix", "loose", "auto")


class IgnoresGrammar(sd.DraftModelDrafter):
    """Self-speculation blind to the row's grammar and bias: drafts the core must cut partway (a sampled one
    just after its first forbidden token, a greedy one before it), so a cut draft's source is exercised."""

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        return super().propose_rows({r: dataclasses.replace(c, constraint=None) for r, c in contexts.items()})


def make_core(target: sd.Model, draft: sd.Model, loose_member: bool) -> DecodeCore:
    """The drafters of ``DRAFTERS``; ``auto`` chooses among suffix, prompt lookup, the draft model and, with
    ``loose_member``, self-speculation blind to the grammar (whose drafts the core cuts)."""
    ngram = build_drafter("ngram", DrafterOptions(gamma=4))
    assert ngram is not None
    members = {"suffix": SuffixDrafter(costs=CHEAP), "ngram": ngram, "model": sd.DraftModelDrafter(draft, gamma=3)}
    if loose_member:
        members["loose"] = IgnoresGrammar(target, gamma=4)
    return DecodeCore(target, {"model": sd.DraftModelDrafter(draft, gamma=3), "suffix": SuffixDrafter(costs=CHEAP),
                               "loose": IgnoresGrammar(target, gamma=4), "auto": AutoDrafter(members)},
                      max_rows=8, context_len=256)


@pytest.fixture(scope="module")
def models(tiny_dirs: dict[str, Path]) -> tuple[sd.Model, sd.Model]:
    return sd.load_model(tiny_dirs["llama"]), sd.load_model(tiny_dirs["draft"])


@pytest.fixture(scope="module")
def core(models: tuple[sd.Model, sd.Model]) -> DecodeCore:
    return make_core(*models, loose_member=True)


def requests(core: DecodeCore, spec: Optional[ConstraintSpec], sampled: bool, bias: bool) -> list[Request]:
    """One request per (drafter, prompt): greedy or sampled, biased or not, under ``spec``."""
    target = core.target
    constraint = bind(spec, target) if spec is not None else None
    logit_bias = {target.encode("1")[-1]: 3.0, target.encode(" ")[-1]: -2.0} if bias else None
    out = []
    for k, (name, prompt) in enumerate((n, p) for n in DRAFTERS for p in PROMPTS):
        sampling = SamplingConfig(temperature=1.0, seed=k) if sampled else SamplingConfig()
        out.append(Request(target.encode(prompt), sampling, GenerationConfig(max_new_tokens=20), name,
                           constraint=constraint, logit_bias=logit_bias))
    return out


def run(core: DecodeCore, reqs: list[Request]) -> list[tuple[str, GenerationStats]]:
    """(drafter, final stats) per request, rows joining as others finish (the server's pattern)."""
    pending, out = list(reqs), []
    rows: dict[int, str] = {}
    while pending or core.rows:
        while pending and len(core.rows) < core.max_rows:
            req = pending.pop(0)
            rows[id(core.add(req))] = req.drafter or "none"
        for row, ev in core.step():
            if isinstance(ev, FinishEvent):
                out.append((rows[id(row)], ev.stats))
    assert len(out) == len(reqs)
    return out


def check(drafter: str, s: GenerationStats, members: set[str], named: bool = True) -> None:
    """The per-source counts sum to the totals; ``auto``'s tokens are its members' and it is the chooser.
    ``named=False``: a member's draft the grammar cut may have lost its name (see the xfail below)."""
    shown = f"{drafter}: {s.drafted_by} {s.accepted_by} chooser={s.chooser} totals {s.drafted}/{s.accepted}"
    assert sum(s.drafted_by.values()) == s.drafted, shown
    assert sum(s.accepted_by.values()) == s.accepted, shown
    assert set(s.accepted_by) == set(s.drafted_by), shown
    assert all(s.accepted_by[k] <= s.drafted_by[k] for k in s.drafted_by), shown
    drafters = set(s.drafted_by) - {FORCED_SOURCE}
    if drafter == "auto":
        if named:
            assert "auto" not in s.drafted_by, shown  # the chooser is never a source
        assert drafters - {"auto"} <= members, shown
        assert s.chooser == ("auto" if drafters - {"auto"} else None), shown
    else:
        assert drafters <= {drafter} and s.chooser is None, shown


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "logit_bias"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", list(SPECS))
def test_per_source_counts_sum_to_the_totals(core: DecodeCore, kind: str, sampled: bool, bias: bool) -> None:
    auto = core.drafters["auto"]
    assert isinstance(auto, AutoDrafter)
    results = run(core, requests(core, SPECS[kind], sampled, bias))
    for drafter, s in results:
        check(drafter, s, set(auto.names), named=False)
    if SPECS[kind] is not None:  # the grammar forced something somewhere (schemas' keys, the regex's "(")
        assert any(s.drafted_by.get(FORCED_SOURCE, 0) > 0 for _, s in results), results


def test_a_grammar_forced_draft_is_the_grammars_and_auto_is_the_chooser(core: DecodeCore) -> None:
    """The fast tier's case: JSON-schema rows (keys forced by the grammar) beside unconstrained ones."""
    auto = core.drafters["auto"]
    assert isinstance(auto, AutoDrafter)
    results = run(core, requests(core, SPECS["json_schema"], False, False) + requests(core, None, False, False))
    for drafter, s in results:
        check(drafter, s, set(auto.names), named=False)
    assert any(s.drafted_by.get(FORCED_SOURCE, 0) > 0 for _, s in results)
    assert any(d == "auto" and s.chooser == "auto" for d, s in results)


@pytest.mark.xfail(strict=True, reason="constraints.ConstraintState.check_draft builds a new Draft when it cuts one "
                   "and drops Draft.source, so the core can only name the chooser; passes once the cut keeps source")
def test_a_member_draft_the_grammar_cuts_stays_the_members(models: tuple[sd.Model, sd.Model]) -> None:
    core = make_core(*models, loose_member=True)  # its own: the members' evidence starts afresh
    auto = core.drafters["auto"]
    assert isinstance(auto, AutoDrafter)
    results = run(core, requests(core, SPECS["json_schema"], False, False))
    for drafter, s in results:
        check(drafter, s, set(auto.names))
    assert any(s.drafted_by.get("loose", 0) > 0 and s.chooser == "auto" for _, s in results)


def test_record_source_keeps_the_chooser_apart() -> None:
    s = GenerationStats()
    s.record_source("suffix", 4, 3, chooser="auto")
    s.record_source("ngram", 2, 0, chooser="auto")
    s.record_source(FORCED_SOURCE, 3, 3)
    assert s.drafted_by == {"suffix": 4, "ngram": 2, FORCED_SOURCE: 3}
    assert s.accepted_by == {"suffix": 3, "ngram": 0, FORCED_SOURCE: 3}
    assert s.chooser == "auto" and s.to_dict()["chooser"] == "auto"
