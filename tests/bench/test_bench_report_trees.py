"""The bench table's c, v(nodes) and predicted speedup for drafts without a fixed γ (Medusa trees and
chains, EAGLE, γ auto), on hand-built traces: the arithmetic the table prints, checked by hand."""

from __future__ import annotations

import pytest

from specdecode.bench.report import format_table, summarize
from specdecode.bench.runners import PreparedPrompt, RunOutput, RunRecord
from specdecode.bench.workloads import Workload
from specdecode.sizing.costs import Costs

from test_bench_report import Fake

PROMPTS = [PreparedPrompt(Workload("a", "completion", "x", 8), [1], 8, 0, 8)]
# one-token pass 2 ms; v(k) = T(k + 1) / T(1): v(1) = 1.1, v(2) = 1.2, v(3) = 1.5, ..., v(6) = 2.0
COSTS = Costs.from_times([0.002, 0.0022, 0.0024, 0.003, 0.0032, 0.0036, 0.004], draft_s=None, context_len=10,
                         repeats=1)


def _summary(steps: list[tuple[int, int]], draft_s: float, generated: int, seconds: float) -> dict[str, object]:
    plain = RunRecord("plain", "a", "completion", 0, RunOutput(list(range(generated)), 1.0, [(0, 0)] * generated))
    tree = RunRecord("medusa", "a", "completion", 0, RunOutput(list(range(generated)), seconds, steps, draft_s))
    return summarize([plain, tree], [Fake("plain", "plain", None), Fake("medusa", "medusa", None)], [], [], PROMPTS,
                     COSTS)


def test_tree_row_gets_c_per_draft_mean_v_of_nodes_and_cost_model_prediction() -> None:
    # three passes: a 6-node tree accepting a path of 2, no draft (the policy declined), a 3-node tree
    # accepting 3: 3 + 1 + 4 = 8 tokens in 3 passes
    steps = [(6, 2), (0, 0), (3, 3)]
    draft_s = 0.0008  # the engine's drafting time over the run: 0.4 of a one-token pass, 2 drafts
    s = _summary(steps, draft_s, generated=8, seconds=0.5)
    o = next(m for m in s["methods"] if m["name"] == "medusa")["categories"]["overall"]
    assert o["tau"] == pytest.approx(8 / 3)
    assert o["c"] == pytest.approx(0.4 / 2) and o["c_per"] == "draft"  # per drafting pass, not per node
    assert o["v"] == pytest.approx((2.0 + 1.5) / 2) and o["mean_nodes"] == pytest.approx(4.5)
    assert o["max_nodes"] == 6
    cost_per_pass = (0.4 + 2.0 + 1.0 + 1.5) / 3  # drafting + v(6) + v(0) + v(3), over all passes
    assert o["predicted_speedup"] == pytest.approx((8 / 3) / cost_per_pass)
    assert o["prediction"] == "cost-model"
    assert o["speedup"]["mean"] == pytest.approx(2.0)  # 16 tok/s against plain's 8
    assert o["efficiency"] == pytest.approx(2.0 / o["predicted_speedup"])
    table = format_table(s)
    row = next(line for line in table.splitlines() if line.startswith("medusa"))
    assert "0.200*" in row and "1.75*" in row and f"{o['predicted_speedup']:.2f}*" in row
    assert "c = drafting time per draft" in table


def test_fixed_gamma_rows_keep_leviathans_prediction() -> None:
    plain = RunRecord("plain", "a", "completion", 0, RunOutput(list(range(8)), 1.0, [(0, 0)] * 8))
    chain = RunRecord("lookup/k3", "a", "completion", 0, RunOutput(list(range(8)), 0.5, [(3, 3), (3, 3)], 0.0004))
    s = summarize([plain, chain], [Fake("plain", "plain", None), Fake("lookup/k3", "lookup", 3)], [], [], PROMPTS,
                  COSTS)
    o = next(m for m in s["methods"] if m["name"] == "lookup/k3")["categories"]["overall"]
    assert o["c_per"] == "token" and o["prediction"] == "leviathan"
    assert o["c"] == pytest.approx(0.0004 / 2 / 0.002 / 3) and o["v"] == pytest.approx(1.5)
    assert "*" not in format_table(s)


def test_no_draft_no_costs() -> None:
    s = _summary([(0, 0)] * 8, 0.0, generated=8, seconds=1.0)
    o = next(m for m in s["methods"] if m["name"] == "medusa")["categories"]["overall"]
    assert "c" not in o and "predicted_speedup" not in o
