"""Report arithmetic on constructed run records: Spec-Bench speedup per repetition, exact match, prediction."""

from __future__ import annotations

import math
from typing import Optional

import pytest

from specdecode.bench.report import format_table, summarize
from specdecode.bench.runners import MethodFailure, PreparedPrompt, RunOutput, RunRecord, Skipped
from specdecode.bench.theory import expected_tokens
from specdecode.sizing.costs import Costs
from specdecode.bench.workloads import Workload


class Fake:
    runtime = "specdecode"

    def __init__(self, name: str, family: str, setting: Optional[int]) -> None:
        self.name, self.family, self.setting = name, family, setting

    def run(self, prompt: list[int], max_new_tokens: int) -> RunOutput:  # pragma: no cover - never run
        raise NotImplementedError


PROMPTS = [PreparedPrompt(Workload("a", "completion", "x", 4), [1], 4, 0, 4),
           PreparedPrompt(Workload("b", "editing", "y", 4), [1], 4, 0, 4)]


def rec(method: str, workload: str, cat: str, rep: int, seconds: float, tokens: list[int],
        steps: Optional[list[tuple[int, int]]] = None) -> RunRecord:
    return RunRecord(method, workload, cat, rep, RunOutput(tokens, seconds, steps))


def test_speedup_is_ratio_of_mean_per_prompt_throughputs_per_rep() -> None:
    ids = [5, 6, 7, 8]
    plain_steps = [(0, 0)] * 4
    spec_steps = [(3, 3)]  # one pass: 3 accepted + bonus = 4 tokens
    records = [
        # rep 0: plain 4 tok/s on a, 8 tok/s on b; spec twice as fast on both -> speedup 2
        rec("plain", "a", "completion", 0, 1.0, ids, plain_steps),
        rec("plain", "b", "editing", 0, 0.5, ids, plain_steps),
        rec("spec", "a", "completion", 0, 0.5, ids, spec_steps), rec("spec", "b", "editing", 0, 0.25, ids, spec_steps),
        # rep 1: spec 4x faster on both -> speedup 4
        rec("plain", "a", "completion", 1, 1.0, ids, plain_steps),
        rec("plain", "b", "editing", 1, 0.5, ids, plain_steps),
        rec("spec", "a", "completion", 1, 0.25, ids, spec_steps),
        rec("spec", "b", "editing", 1, 0.125, ids, spec_steps),
        # a wrong method: one token differs on prompt b
        rec("bad", "a", "completion", 0, 1.0, ids), rec("bad", "b", "editing", 0, 1.0, [5, 6, 0, 8]),
    ]
    costs = Costs.from_times([1.0, 1.1, 1.2, 1.5], draft_s=0.1, context_len=10, repeats=1)
    methods = [Fake("plain", "plain", None), Fake("spec", "draft", 3), Fake("bad", "bad", None)]
    s = summarize(records, methods, [Skipped("hf-x", "hf-x", "transformers", "not installed")],
                  [MethodFailure("bad", "b", "boom")], PROMPTS, costs)
    by = {m["name"]: m for m in s["methods"]}
    spec = by["spec"]["categories"]
    assert spec["overall"]["speedup"]["mean"] == pytest.approx(3.0)
    assert spec["overall"]["speedup"]["std"] == pytest.approx(math.sqrt(2))
    # mean over reps of mean(8,16), mean(16,32)
    assert spec["overall"]["tokens_per_s"]["mean"] == pytest.approx((12 + 24) / 2)
    assert spec["completion"]["speedup"]["mean"] == pytest.approx(3.0) and spec["completion"]["n_prompts"] == 1
    assert spec["overall"]["tau"] == 4.0 and spec["overall"]["alpha_hat"] == 1.0
    assert spec["overall"]["acceptance_by_position"] == [1.0, 1.0, 1.0]
    # Leviathan: α_iid = 1 -> E = γ + 1; c = 0.1, v(3) = T(4)/T(1) = 1.5
    assert spec["overall"]["c"] == pytest.approx(0.1) and spec["overall"]["v"] == pytest.approx(1.5)
    assert spec["overall"]["predicted_speedup"] == pytest.approx(expected_tokens(1.0, 3) / (3 * 0.1 + 1.5))
    assert spec["overall"]["efficiency"] == pytest.approx(3.0 / spec["overall"]["predicted_speedup"])
    assert by["plain"]["categories"]["overall"]["exact_match"] == 1.0
    assert by["bad"]["categories"]["overall"]["exact_match"] == 0.5 and by["bad"]["status"] == "failed"
    assert s["mismatches"] == [{"method": "bad", "workload": "b", "rep": 0, "index": 2,
                                "expected": [7, 8], "got": [0, 8]}]
    assert by["hf-x"]["status"] == "skipped"
    table = format_table(s)
    assert "skipped: hf-x: not installed" in table and "first difference at token 2" in table


def test_prefill_share_per_category_and_its_line_under_the_table() -> None:
    """The prompt's prefill is inside each run's time and no drafter shortens it: the report gives its share of
    plain decoding's time per category (time-weighted), and none for a runtime that hides it."""
    ids = [5, 6, 7, 8]
    records = [RunRecord("plain", "a", "completion", 0, RunOutput(ids, 1.0, [(0, 0)] * 4, 0.0, 0.25)),
               RunRecord("plain", "b", "editing", 0, RunOutput(ids, 3.0, [(0, 0)] * 4, 0.0, 0.25)),
               RunRecord("hf", "a", "completion", 0, RunOutput(ids, 1.0, None)),
               RunRecord("hf", "b", "editing", 0, RunOutput(ids, 1.0, None))]
    s = summarize(records, [Fake("plain", "plain", None), Fake("hf", "hf", None)], [], [], PROMPTS, None)
    by = {m["name"]: m["categories"] for m in s["methods"]}
    assert by["plain"]["completion"]["prefill_share"] == pytest.approx(0.25)
    assert by["plain"]["editing"]["prefill_share"] == pytest.approx(0.25 / 3)
    assert by["plain"]["overall"]["prefill_share"] == pytest.approx(0.5 / 4)
    assert "prefill_share" not in by["hf"]["overall"]
    assert "prefill's share of plain decoding's time (no drafter shortens it): completion 0.25, editing 0.08, " \
           "overall 0.12" in format_table(s)
