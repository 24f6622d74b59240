"""Chi-square goodness of fit against an exact law, with small expected cells merged."""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Mapping

from scipy.stats import chisquare


def gof_pvalue(samples: list[Hashable], law: Mapping[Hashable, float], min_expected: float = 5.0) -> float:
    """p-value of 'samples were drawn from law'; 0.0 if a sample has zero probability under law."""
    n = len(samples)
    counts = Counter(samples)
    if any(law.get(k, 0.0) <= 0.0 for k in counts):
        return 0.0
    obs, exp = [], []
    rest_obs, rest_exp = 0.0, 0.0
    for k, p in law.items():
        if p * n >= min_expected:
            obs.append(counts.get(k, 0))
            exp.append(p * n)
        else:
            rest_obs += counts.get(k, 0)
            rest_exp += p * n
    if rest_exp > 0:
        obs.append(rest_obs)
        exp.append(rest_exp)
    total = sum(exp)
    exp = [e * n / total for e in exp]  # guard float drift in the law's normalisation
    return float(chisquare(obs, exp).pvalue)
