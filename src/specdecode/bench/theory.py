"""Leviathan et al.'s cost model, with the CPU's verification cost v(γ) added.

Kept apart from the measurements so `specdecode theory` answers "is it worth
speculating with this drafter?" without loading a model, and so the benchmark
can print the prediction beside what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..config import ConfigError
from ..sizing.costs import expected_tokens, predicted_speedup

VFunction = Callable[[int], float]


def speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
    """Expected walltime speedup E(α, γ) / (γc + v): c = draft/target pass cost, v = T(γ+1 tokens)/T(1)."""
    if c < 0 or v <= 0:
        raise ConfigError(f"need c >= 0 and v > 0, got c={c}, v={v}")
    return predicted_speedup(alpha, gamma, c, v)  # checks α and γ


def linear_v(v_at: float, gamma_at: int) -> VFunction:
    """v(γ) interpolated linearly through v(0) = 1 and the one measured point (γ_at, v_at)."""
    slope = (v_at - 1.0) / gamma_at
    return lambda g: 1.0 + slope * g


def tabulated_v(values: Sequence[float]) -> VFunction:
    """v(γ) from measured values v(1), v(2), ... (as `specdecode bench` prints them); v(0) = 1."""
    table = [1.0] + [float(x) for x in values]
    return lambda g: table[g] if g < len(table) else table[-1] + (table[-1] - table[-2]) * (g - len(table) + 1)


@dataclass(frozen=True)
class Optimum:
    gamma: int
    speedup: float
    helps: bool  # some γ beats plain decoding (speedup > 1)


def optimal_gamma(alpha: float, c: float, v: Optional[VFunction] = None, max_gamma: int = 64) -> Optimum:
    """The γ in 1..max_gamma with the highest predicted speedup (v(γ) = 1 when not given)."""
    best_g, best_s = 1, -1.0
    for g in range(1, max_gamma + 1):
        s = speedup(alpha, g, c, v(g) if v is not None else 1.0)
        if s > best_s + 1e-12:
            best_g, best_s = g, s
    return Optimum(best_g, best_s, best_s > 1.0)


def alpha_from_tau(tau: float, gamma: int, tol: float = 1e-10) -> float:
    """Invert E(α, γ) = τ by bisection (E is increasing in α): the α a measured τ implies."""
    if not 1.0 <= tau <= gamma + 1:
        raise ConfigError(f"tau must lie in [1, gamma + 1] = [1, {gamma + 1}], got {tau}")
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if expected_tokens(mid, gamma) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


__all__ = ["Optimum", "alpha_from_tau", "expected_tokens", "linear_v", "optimal_gamma", "speedup",
           "tabulated_v"]
