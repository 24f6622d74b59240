"""Per-source stats add up: for every request, the draft tokens judged and accepted per source sum to the
request's totals, under every kind of constraint (JSON schema, regex, Lark grammar, JSON object, none), with
and without ``logit_bias``, greedy and sampled, for plain drafters and for ``auto``. Tokens a grammar forces
are drafted by the grammar (source ``"grammar"``), not by the row's drafter; ``auto`` is the chooser
(``GenerationStats.chooser``), never a source beside the members it chose among.

First in the decode core (rows joining as others finish, as the server runs them), then through the server:
``usage.speculative``, whole or streamed, and ``/metrics``. Two servers: every registered drafter as
``make_state`` builds them (on the tiny target ``auto`` finds nothing that pays and decodes plainly), and one
whose ``auto`` chooses between suffix drafting and a draft model cheap enough to be tried."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Optional

import httpx
import pytest

pytest.importorskip("llguidance")

import specdecode as sd
from server_helpers import MODEL_NAME, Models, RunningServer, start_server
from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.constraint_spec import ConstraintSpec, json_schema_spec
from specdecode.constraints import bind
from specdecode.core import DecodeCore
from specdecode.rows import FinishEvent, Request
from specdecode.sizing.costs import Costs
from specdecode.draft import Draft, DraftContext
from specdecode.drafters import DrafterOptions, build_drafter
from specdecode.drafters.auto import AutoDrafter
from specdecode.drafters.suffix import SuffixDrafter
from specdecode.metrics import FORCED_SOURCE, GenerationStats
from specdecode.server.config import ServerConfig
from specdecode.server.scheduler import Scheduler
from specdecode.server.state import make_state

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
FORMATS: dict[str, Optional[dict[str, Any]]] = {  # the server's: response_format
    "json_schema": {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}},
    "json_object": {"type": "json_object"},
    "text": None,
}
# text the cheap members can copy from: repeats, and the shapes the constraints ask for
PROMPTS = ['{"name": "fib", "n": 12}\n{"name": "fib", "n": 12}\n{"name": "fib", "n": 1',
           "fib(12) = 144\nadd(fib) = 12\nfib(12) = 144\nfib(1",
           "x = 12 + 34\nx = 12 + 34\nx = 1"]


# -- the decode core ---------------------------------------------------------------------------------
CORE_DRAFTERS = ("model", "suffix", "loose", "auto")


class IgnoresGrammar(sd.DraftModelDrafter):
    """Self-speculation blind to the row's grammar and bias: drafts the core must cut partway (a sampled one
    just after its first forbidden token, a greedy one before it), so a cut draft's source is exercised."""

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        return super().propose_rows({r: dataclasses.replace(c, constraint=None) for r, c in contexts.items()})


def make_core(target: sd.Model, draft: sd.Model, loose_member: bool) -> DecodeCore:
    """The drafters of ``CORE_DRAFTERS``; ``auto`` chooses among suffix, prompt lookup, the draft model and, with
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
def core(models: Models) -> DecodeCore:
    return make_core(models.target, models.draft, loose_member=True)


def requests(core: DecodeCore, spec: Optional[ConstraintSpec], sampled: bool, bias: bool) -> list[Request]:
    """One request per (drafter, prompt): greedy or sampled, biased or not, under ``spec``."""
    target = core.target
    constraint = bind(spec, target) if spec is not None else None
    logit_bias = {target.encode("1")[-1]: 3.0, target.encode(" ")[-1]: -2.0} if bias else None
    out = []
    for k, (name, prompt) in enumerate((n, p) for n in CORE_DRAFTERS for p in PROMPTS):
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


def check_stats(drafter: str, s: GenerationStats, members: set[str]) -> None:
    """The per-source counts sum to the totals; ``auto``'s tokens are its members' and it is the chooser."""
    shown = f"{drafter}: {s.drafted_by} {s.accepted_by} chooser={s.chooser} totals {s.drafted}/{s.accepted}"
    assert sum(s.drafted_by.values()) == s.drafted, shown
    assert sum(s.accepted_by.values()) == s.accepted, shown
    assert set(s.accepted_by) == set(s.drafted_by), shown
    assert all(s.accepted_by[k] <= s.drafted_by[k] for k in s.drafted_by), shown
    drafters = set(s.drafted_by) - {FORCED_SOURCE}
    if drafter == "auto":
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
        check_stats(drafter, s, set(auto.names))
    if SPECS[kind] is not None:  # the grammar forced something somewhere (schemas' keys, the regex's "(")
        assert any(s.drafted_by.get(FORCED_SOURCE, 0) > 0 for _, s in results), results


def test_a_grammar_forced_draft_is_the_grammars_and_auto_is_the_chooser(core: DecodeCore) -> None:
    """The fast tier's case: JSON-schema rows (keys forced by the grammar) beside unconstrained ones."""
    auto = core.drafters["auto"]
    assert isinstance(auto, AutoDrafter)
    results = run(core, requests(core, SPECS["json_schema"], False, False) + requests(core, None, False, False))
    for drafter, s in results:
        check_stats(drafter, s, set(auto.names))
    assert any(s.drafted_by.get(FORCED_SOURCE, 0) > 0 for _, s in results)
    assert any(d == "auto" and s.chooser == "auto" for d, s in results)


def test_a_member_draft_the_grammar_cuts_stays_the_members(models: Models) -> None:
    core = make_core(models.target, models.draft, loose_member=True)  # its own: the members' evidence starts afresh
    auto = core.drafters["auto"]
    assert isinstance(auto, AutoDrafter)
    results = run(core, requests(core, SPECS["json_schema"], False, False))
    for drafter, s in results:
        check_stats(drafter, s, set(auto.names))
    assert any(s.drafted_by.get("loose", 0) > 0 and s.chooser == "auto" for _, s in results)


def test_record_source_keeps_the_chooser_apart() -> None:
    s = GenerationStats()
    s.record_source("suffix", 4, 3, chooser="auto")
    s.record_source("ngram", 2, 0, chooser="auto")
    s.record_source(FORCED_SOURCE, 3, 3)
    assert s.drafted_by == {"suffix": 4, "ngram": 2, FORCED_SOURCE: 3}
    assert s.accepted_by == {"suffix": 3, "ngram": 0, FORCED_SOURCE: 3}
    assert s.chooser == "auto" and s.to_dict()["chooser"] == "auto"


# -- the server -------------------------------------------------------------------------------------
SERVER_DRAFTERS = ("auto", "model", "ngram", "suffix")


@pytest.fixture(scope="module")
def chooser_server(models: Models) -> Iterator[RunningServer]:
    """``auto`` over suffix drafting and the random tiny draft, which its optimistic prior tries first."""
    target, draft = models.target, models.draft
    state = make_state(target, draft, ServerConfig(max_batch_size=8, request_timeout=60), model_name=MODEL_NAME)
    ngram = state.scheduler.drafters["ngram"]
    auto = AutoDrafter({"suffix": SuffixDrafter(costs=CHEAP), "model": sd.DraftModelDrafter(draft, gamma=3)})
    drafters = {"model": sd.DraftModelDrafter(draft, gamma=3), "ngram": ngram, "suffix": SuffixDrafter(costs=CHEAP),
                "auto": auto}
    state = dataclasses.replace(state, scheduler=Scheduler(target, drafters, max_batch_size=8, metrics=state.metrics))
    running = start_server(state)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(params=["registry", "chooser"])
def any_server(request: pytest.FixtureRequest) -> RunningServer:
    return request.getfixturevalue("server" if request.param == "registry" else "chooser_server")


def body(drafter: str, fmt: Optional[dict[str, Any]], sampled: bool, bias: Optional[dict[str, float]],
         stream: bool = False) -> dict[str, Any]:
    b: dict[str, Any] = {"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 16, "drafter": drafter,
                         "temperature": 1.0 if sampled else 0.0}
    if sampled:
        b["seed"] = 3
    if fmt is not None:
        b["response_format"] = fmt
    if bias is not None:
        b["logit_bias"] = bias
    if stream:
        b.update(stream=True, stream_options={"include_usage": True})
    return b


def speculative(server: RunningServer, b: dict[str, Any]) -> dict[str, Any]:
    """``usage.speculative`` of one request, from the response or from a stream's usage chunk."""
    if not b.get("stream"):
        r = server.post("/v1/completions", b)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["speculative"]
    usage = None
    with httpx.stream("POST", server.url + "/v1/completions", json=b, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: "):])
                if not chunk["choices"]:
                    usage = chunk["usage"]
    assert usage is not None
    return usage["speculative"]


def check_usage(drafter: str, spec: dict[str, Any]) -> None:
    shown = f"{drafter}: {spec}"
    assert sum(spec["drafted_by"].values()) == spec["drafted"], shown
    assert sum(spec["accepted_by"].values()) == spec["accepted"], shown
    assert set(spec["drafted_by"]) == set(spec["accepted_by"]), shown
    if drafter != "auto":
        assert set(spec["drafted_by"]) <= {drafter, "grammar"} and spec["chooser"] is None, shown


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus series over the label sets that include ``labels``."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(ln.split()[-1]) for ln in text.splitlines()
               if (ln.startswith(name + " ") or ln.startswith(name + "{")) and all(w in ln for w in want))


def test_usage_per_source_sums_to_the_totals(any_server: RunningServer, models: Models) -> None:
    server = any_server
    bias = {str(models.target.encode("1")[-1]): 4.0, str(models.target.encode(" ")[-1]): -3.0}
    cases = [(d, f, s, b, st) for d in SERVER_DRAFTERS for f in FORMATS for s in (False, True) for b in (None, bias)
             for st in (False, True) if not st or (s and b is not None)]  # streams: a few, the usage path differs
    before = server.get("/metrics").text
    with ThreadPoolExecutor(8) as pool:  # batched rows, as under load
        specs = list(pool.map(lambda c: speculative(server, body(c[0], FORMATS[c[1]], c[2], c[3], c[4])), cases))
    after = server.get("/metrics").text
    for (drafter, fmt, *_), spec in zip(cases, specs):
        check_usage(drafter, spec)
    forced = [spec["drafted_by"].get("grammar", 0) for (_, fmt, *_), spec in zip(cases, specs) if fmt != "text"]
    assert sum(forced) > 0  # the schema's keys are forced: some draft tokens are the grammar's
    assert all("grammar" not in spec["drafted_by"] for (_, fmt, *_), spec in zip(cases, specs) if fmt == "text")

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    sources = {k for spec in specs for k in spec["drafted_by"]}
    for source in sources:  # /metrics: the same per-source counts as the responses, summed
        assert delta("specdecode_draft_tokens_by_source_total", source=source) == \
            sum(spec["drafted_by"].get(source, 0) for spec in specs), source
        assert delta("specdecode_accepted_tokens_by_source_total", source=source) == \
            sum(spec["accepted_by"].get(source, 0) for spec in specs), source
    assert delta("specdecode_draft_tokens_by_source_total") == delta("specdecode_draft_tokens_total") == \
        sum(spec["drafted"] for spec in specs)


def test_auto_is_the_chooser_in_usage(chooser_server: RunningServer) -> None:
    specs = [speculative(chooser_server, body("auto", None, s, None)) for s in (False, True)]
    assert all("auto" not in spec["drafted_by"] for spec in specs), specs
    assert any(spec["drafted_by"] for spec in specs), specs  # the draft model, tried on its optimistic prior
    assert all(spec["chooser"] == ("auto" if spec["drafted_by"] else None) for spec in specs), specs
