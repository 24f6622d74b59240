"""Structured output: speculative constrained decoding vs constrained plain decoding (same runtime).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_structured.py --repeats 3 --out /tmp/bench_structured.json

For each JSON schema and prompt (a code-flavoured task for the bundled code-target/code-draft pair),
runs greedy and T=1 (seeded): plain constrained decoding (one token per target pass), then the
model drafter (γ fixed or auto) under the same constraint. Reports decode tokens/s, the ratio
(goal: >= 1.5x), tokens per target pass, how many tokens the grammar forced, that every output is
valid JSON for its schema, and the grammar's cost per token (mask + bookkeeping, timed apart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import specdecode as sd
from specdecode.constraints import ConstraintSpec, bind

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = {
    "function": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24},
        "args": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "returns": {"enum": ["int", "str", "list", "None"]}},
        "required": ["name", "args", "returns"], "additionalProperties": False},
    "point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"},
              "label": {"type": "string", "maxLength": 16}}, "required": ["x", "y", "label"],
              "additionalProperties": False},
    "code": {"type": "object", "properties": {"language": {"const": "python"},
             "source": {"type": "string", "maxLength": 400}}, "required": ["language", "source"],
             "additionalProperties": False},
}
PROMPTS = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n# fib as JSON:\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n# describe it as JSON:\n",
]


def run(target: sd.Model, prompt: str, drafter: object, schema: dict, temperature: float, seed: int,
        max_new: int) -> sd.GenerationResult:
    return sd.generate(target, prompt, drafter=drafter, max_new_tokens=max_new, temperature=temperature, seed=seed,
                       json_schema=schema)


def mask_cost_us(target: sd.Model, schema: dict, tokens: list[int]) -> float:
    """Per token: one mask, one commit (what the core pays per emitted token for a constrained row)."""
    c = bind(ConstraintSpec("json_schema", json.dumps(schema)), target)
    state = c.start()
    t0 = time.perf_counter()
    n = 0
    for t in tokens:
        state.allowed()
        if t in target.eos_token_ids:
            break
        state.commit([t])
        n += 1
    return (time.perf_counter() - t0) / max(1, n) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(ROOT / "models" / "code-target"))
    ap.add_argument("--draft", default=str(ROOT / "models" / "code-draft"))
    ap.add_argument("--gamma", default="4", help="draft length or 'auto'")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    target = sd.load_model(args.target)
    draft = sd.load_model(args.draft)
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    drafter = sd.DraftModelDrafter(draft, gamma=gamma)
    rows = []
    for temperature in (0.0, 1.0):
        for name, schema in SCHEMAS.items():
            for p, prompt in enumerate(PROMPTS):
                run(target, prompt, drafter, schema, temperature, 0, 16)  # warm-up (kernels, tokenizer cache)
                res: dict[str, list[sd.GenerationResult]] = {"plain": [], "spec": []}
                for rep in range(args.repeats):
                    for kind, d in (("plain", None), ("spec", drafter)):
                        res[kind].append(run(target, prompt, d, schema, temperature, rep, args.max_new_tokens))
                valid = all(r.finish_reason == "length" or _valid(r.text) for rs in res.values() for r in rs)
                tps = {k: statistics.median(r.stats.decode_tokens_per_s for r in rs) for k, rs in res.items()}
                tau = statistics.median(r.stats.tau for r in res["spec"])
                rows.append({"T": temperature, "schema": name, "prompt": p, "plain_tok_s": tps["plain"],
                             "spec_tok_s": tps["spec"], "speedup": tps["spec"] / tps["plain"], "tau": tau,
                             "tokens": statistics.median(len(r.token_ids) for r in res["spec"]),
                             "length_cut": sum(r.finish_reason == "length" for rs in res.values() for r in rs),
                             "valid_json": valid,
                             "mask_us_per_token": mask_cost_us(target, schema, res["plain"][0].token_ids)})
    print(f"{'T':>3} {'schema':<9} {'p':>1} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>7} {'tau':>5} "
          f"{'tokens':>6} {'cut':>3} {'valid':>5} {'mask us/tok':>11}")
    for r in rows:
        print(f"{r['T']:>3} {r['schema']:<9} {r['prompt']:>1} {r['plain_tok_s']:>11.1f} {r['spec_tok_s']:>10.1f} "
              f"{r['speedup']:>6.2f}x {r['tau']:>5.2f} {r['tokens']:>6} {r['length_cut']:>3} {str(r['valid_json']):>5} "
              f"{r['mask_us_per_token']:>11.1f}")
    geo = statistics.geometric_mean([r["speedup"] for r in rows])
    print(f"geometric-mean speedup: {geo:.2f}x (goal >= 1.5x); all valid: {all(r['valid_json'] for r in rows)}")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "geomean_speedup": geo, "gamma": args.gamma}, indent=1))
    return 0


def _valid(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


if __name__ == "__main__":
    sys.exit(main())
