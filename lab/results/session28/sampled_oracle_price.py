"""Lab script (session 28, issue 29): price `sampled_oracle.py`'s marks with this machine's v(n).

A free drafter that always proposes the target's mode keeps each run of mode tokens; the next token is the
target's own. Oracle sizing drafts exactly the run (a step costs v(run)); a fixed chain drafts γ every step
(costs v(γ), keeps min(run, γ)). Speedup = tokens / Σ step prices: a ceiling for deterministic drafters."""

import json
import sys
from collections import defaultdict

import specdecode as sd
from specdecode.costmodel import load_or_measure_costs

rows = json.load(open(sys.argv[1]))
target = sd.load_model("smollm2-135m-instruct", weight_dtype=sys.argv[2])
costs = load_or_measure_costs(target, None)
print("v(0..8)", [round(costs.v_at(n), 3) for n in range(9)])


def runs(marks: list[int], cap: int = 15) -> list[int]:
    """Mode runs between the steps: each step keeps k ≤ cap mode tokens, then the target writes one."""
    out, t = [], 0
    while t < len(marks):
        k = 0
        while k < cap and t + k < len(marks) and marks[t + k]:
            k += 1
        out.append(k)
        t += k + 1
    return out


by_cat = defaultdict(list)
for r in rows:
    by_cat[r["category"]].append(r)
by_cat["overall"] = rows
print(f"{'category':10s} {'mode rate':>9s} {'tau oracle':>10s} {'oracle x':>8s}  fixed chain x (gamma 1..8)")
for cat, rs in by_cat.items():
    n = sum(r["n"] for r in rs)
    mode = sum(sum(r["is_mode"]) for r in rs) / n
    steps = [k for r in rs for k in runs(r["is_mode"])]
    oracle = n / sum(costs.v_at(k) for k in steps)
    fixed = []
    for g in range(1, 9):
        cost = 0.0
        for r in rs:
            m = r["is_mode"]
            for k in runs(m, g):
                cost += costs.v_at(g)
        fixed.append(n / cost)
    print(f"{cat:10s} {mode:9.3f} {n / len(steps):10.2f} {oracle:8.2f}  " + " ".join(f"{x:.2f}" for x in fixed))
