"""`specdecode theory`: Leviathan's expected tokens per pass, speedup and optimal γ, no model needed."""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

from ..config import ConfigError
from .theory import expected_tokens, linear_v, optimal_gamma, speedup, tabulated_v


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    t = sub.add_parser("theory", help="expected speedup of speculative decoding (Leviathan et al.'s model)",
                       description="E = (1-α^(γ+1))/(1-α) tokens per target pass; speedup = E/(γc + v), with "
                                   "c = draft/target pass cost and v = T_target(γ+1 tokens)/T_target(1 token).")
    t.add_argument("--alpha", type=float, required=True, help="acceptance rate α in [0, 1]")
    t.add_argument("--gamma", type=int, default=4, help="draft tokens per pass γ (default: 4)")
    t.add_argument("--c", type=float, default=0.0, help="cost of a draft pass relative to a target pass (default: 0)")
    t.add_argument("--v", default="1",
                   help="cost of verifying γ+1 tokens relative to 1 (default: 1, free as on a GPU). One number: "
                        "v(γ), interpolated linearly through v(0)=1 for the optimal-γ search. A list "
                        "v(1),v(2),...: measured values (e.g. from `specdecode bench`); the search stays within them")
    t.add_argument("--max-gamma", type=int, default=32, help="search γ in 1..this for the optimum (default: 32)")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=cmd_theory)


def theory_report(alpha: float, gamma: int, c: float, v: Sequence[float], max_gamma: int = 32) -> dict[str, Any]:
    """``v``: one value (v at ``gamma``, linear through v(0)=1) or measured v(1), v(2), ..."""
    if gamma < 1:
        raise ConfigError(f"--gamma must be >= 1, got {gamma}")
    if not v or min(v) <= 0:
        raise ConfigError(f"--v must be positive, got {list(v)}")
    if len(v) == 1:
        vf, v_shape = linear_v(v[0], gamma), f"linear through v(0)=1 and v({gamma})={v[0]:g}"
    else:
        vf, v_shape, max_gamma = tabulated_v(v), f"measured v(1..{len(v)})", min(max_gamma, len(v))
    opt = optimal_gamma(alpha, c, vf, max_gamma)
    return {"alpha": alpha, "gamma": gamma, "c": c, "v": vf(gamma), "v_shape": v_shape, "max_gamma": max_gamma,
            "expected_tokens_per_pass": expected_tokens(alpha, gamma), "speedup": speedup(alpha, gamma, c, vf(gamma)),
            "optimal_gamma": opt.gamma, "optimal_speedup": opt.speedup, "speculation_helps": opt.helps,
            "table": [{"gamma": g, "expected_tokens": expected_tokens(alpha, g), "v": vf(g),
                       "speedup": speedup(alpha, g, c, vf(g))} for g in range(1, max(gamma, 8) + 1)]}


def cmd_theory(args: argparse.Namespace) -> int:
    try:
        v = [float(x) for x in str(args.v).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--v must be a number or a comma-separated list, got {args.v!r}") from None
    r = theory_report(args.alpha, args.gamma, args.c, v, args.max_gamma)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"α = {r['alpha']:g}, γ = {r['gamma']}, c = {r['c']:g}, v(γ) = {r['v']:g}")
    print(f"expected tokens per target pass  E = (1-α^(γ+1))/(1-α) = {r['expected_tokens_per_pass']:.2f}")
    print(f"expected speedup  E/(γc + v)                      = {r['speedup']:.2f}x")
    verdict = "speculation pays" if r["speculation_helps"] else "no γ beats plain decoding"
    print(f"optimal γ in 1..{r['max_gamma']} = {r['optimal_gamma']} (speedup {r['optimal_speedup']:.2f}x; {verdict})")
    if r["v"] != 1.0:
        print(f"  (v(γ): {r['v_shape']})")
    print("\n  γ     E   v(γ)  speedup")
    for row in r["table"]:
        print(f"{row['gamma']:3d}  {row['expected_tokens']:4.2f}  {row['v']:5.2f}  {row['speedup']:6.2f}x")
    return 0
