"""Block verification (Sun et al., arXiv:2403.10444): the emitted law is the target's, the single-step
law is Algorithm 2's, and it accepts at least as many tokens as token-by-token verification.

Each law test also shows power: the same samples are rejected against a wrong law."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from typing import Callable, Optional

import pytest
import torch

from specdecode.config import CHAIN_RULES as RULE_NAMES
from specdecode.config import SamplingConfig
from specdecode.sampling import draw
from specdecode.verify import CHAIN_RULES, VerifyResult, block_verify, rejection_sample

from .chi2 import gof_pvalue
from .test_rejection_law import SETTINGS
from .toylm import PrefixLaws

V, LENGTH, N = 5, 3, 12000
Rule = Callable[..., VerifyResult]
SETTING_IDS = [f"T{s.temperature}-k{s.top_k}-p{s.top_p}-m{s.min_p}" for s in SETTINGS]


def draft_chain(q: Optional[PrefixLaws], context: tuple[int, ...], n: int, g: torch.Generator) -> list[int]:
    """n draft tokens drawn from q along the chain (q None: a deterministic drafter proposing token 0)."""
    tokens: list[int] = []
    for _ in range(n):
        tokens.append(0 if q is None else int(draw(q(context + tuple(tokens)).unsqueeze(0), g)[0]))
    return tokens


def step(rule: Rule, p: PrefixLaws, q: Optional[PrefixLaws], context: tuple[int, ...], n: int,
         g: torch.Generator) -> tuple[int, ...]:
    """One verification step at ``context``: the accepted tokens and the next token."""
    tokens = draft_chain(q, context, n, g)
    probs = q.along(context, tokens, extra=0) if q is not None else None
    r = rule(p.along(context, tokens), torch.tensor(tokens, dtype=torch.long), probs, g)
    return tuple(tokens[: r.n_accepted]) + (r.next_token,)


def simulate(rule: Rule, p: PrefixLaws, q: Optional[PrefixLaws], gamma: int, g: torch.Generator) -> tuple[int, ...]:
    """Emit LENGTH tokens by repeated steps (the last one drafts only what is still needed)."""
    out: tuple[int, ...] = ()
    while len(out) < LENGTH:
        out += step(rule, p, q, out, min(gamma, LENGTH - len(out)), g)
    return out[:LENGTH]


# -- the single-step laws, enumerated in float64 straight from the papers' formulas -----------------
def block_step_law(p: PrefixLaws, q: PrefixLaws, gamma: int) -> dict[tuple[int, ...], float]:
    """Law of (X_1..X_τ, Y) from one block-verification step at the empty prefix (Algorithm 2)."""
    P = lambda c: p(c).double()  # noqa: E731
    Q = lambda c: q(c).double()  # noqa: E731
    law: dict[tuple[int, ...], float] = defaultdict(float)
    for xs in itertools.product(range(V), repeat=gamma):
        px = math.prod(float(Q(xs[:i])[xs[i]]) for i in range(gamma))
        if px == 0.0:
            continue
        w = [1.0]
        for i in range(gamma):
            w.append(min(1.0, w[-1] * float(P(xs[:i])[xs[i]]) / float(Q(xs[:i])[xs[i]])))
        h = [1.0]  # h_0 is never used: τ = 0 is what is left
        for i in range(1, gamma):
            s = float((w[i] * P(xs[:i]) - Q(xs[:i])).clamp_min(0).sum())
            h.append(s / (s + 1.0 - w[i]) if s > 0 else 0.0)
        h.append(w[gamma])
        for tau in range(gamma + 1):
            pr = (h[tau] if tau else 1.0) * math.prod(1.0 - h[j] for j in range(tau + 1, gamma + 1))
            if pr == 0.0:
                continue
            if tau == gamma:
                nxt = P(xs)
            else:
                nxt = (w[tau] * P(xs[:tau]) - Q(xs[:tau])).clamp_min(0)
                nxt = nxt / nxt.sum()
            for y in range(V):
                law[xs[:tau] + (y,)] += px * pr * float(nxt[y])
    return dict(law)


def token_step_law(p: PrefixLaws, q: PrefixLaws, gamma: int) -> dict[tuple[int, ...], float]:
    """Law of (accepted prefix, next token) from one token-by-token step (Leviathan et al.)."""
    P = lambda c: p(c).double()  # noqa: E731
    Q = lambda c: q(c).double()  # noqa: E731
    law: dict[tuple[int, ...], float] = defaultdict(float)
    for xs in itertools.product(range(V), repeat=gamma):
        px = math.prod(float(Q(xs[:i])[xs[i]]) for i in range(gamma))
        if px == 0.0:
            continue
        alive = 1.0
        for n in range(gamma + 1):
            c = xs[:n]
            if n == gamma:
                stop, nxt = alive, P(c)
            else:
                a = min(1.0, float(P(c)[xs[n]]) / float(Q(c)[xs[n]]))
                stop, alive = alive * (1.0 - a), alive * a
                nxt = (P(c) - Q(c)).clamp_min(0)
                nxt = nxt / nxt.sum() if float(nxt.sum()) > 0 else P(c)
            for y in range(V):
                law[c + (y,)] += px * stop * float(nxt[y])
    return dict(law)


def expected_accepted(law: dict[tuple[int, ...], float]) -> float:
    return sum(pr * (len(k) - 1) for k, pr in law.items())


def pair(setting: SamplingConfig, seed: int, noise: float = 1.0) -> tuple[PrefixLaws, PrefixLaws]:
    """A target and a draft that resembles it (acceptance well inside (0, 1)); the first seed from
    ``seed`` on whose laws at the root keep at least 3 tokens (a one-token law tests nothing)."""
    while True:
        p = PrefixLaws(V, LENGTH + 3, setting, seed)
        q = PrefixLaws(V, LENGTH + 3, setting, seed + 1, like=p, noise=noise)
        if min(int((p(()) > 0).sum()), int((q(()) > 0).sum())) >= 3:
            return p, q
        seed += 2


# -- tests -----------------------------------------------------------------------------------------
def test_rule_names_match_the_config() -> None:
    assert tuple(CHAIN_RULES) == RULE_NAMES and CHAIN_RULES["block"] is block_verify


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("gamma", [2, 3])
def test_block_output_law_is_target_law(setting: SamplingConfig, gamma: int) -> None:
    """The first LENGTH tokens of repeated block steps follow the target's law (prefix-dependent laws)."""
    p, q = pair(setting, 100 + gamma)
    g = torch.Generator().manual_seed(42)
    samples = [simulate(block_verify, p, q, gamma, g) for _ in range(N)]
    assert gof_pvalue(samples, p.sequence_law(LENGTH)) > 1e-3
    assert gof_pvalue(samples, q.sequence_law(LENGTH)) < 1e-6  # power: not the draft's law


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
def test_block_step_law_is_algorithm_2(setting: SamplingConfig) -> None:
    """One step: the first emitted token follows p; the accepted prefix and next token follow
    Algorithm 2's law, which the same test tells apart from token-by-token's."""
    p, q = pair(setting, 7)
    g = torch.Generator().manual_seed(11)
    samples = [step(block_verify, p, q, (), 3, g) for _ in range(N)]
    first = [s[0] for s in samples]
    assert gof_pvalue(first, {t: float(p(())[t]) for t in range(V)}) > 1e-3
    assert gof_pvalue(first, {t: float(q(())[t]) for t in range(V)}) < 1e-6
    block, token = block_step_law(p, q, 3), token_step_law(p, q, 3)
    assert abs(sum(block.values()) - 1.0) < 1e-6  # float32 laws, summed in float64
    assert gof_pvalue(samples, block) > 1e-3
    assert gof_pvalue(samples, token) < 1e-6  # power: token-by-token's step law is a different one


@pytest.mark.slow
def test_block_deterministic_drafter_law() -> None:
    """q one-hot (a drafter without probabilities): still the target's law."""
    p = PrefixLaws(V, LENGTH + 3, SETTINGS[0], 5)
    g = torch.Generator().manual_seed(3)
    samples = []
    for _ in range(N):
        out: tuple[int, ...] = ()
        while len(out) < LENGTH:
            out += step(block_verify, p, None, out, min(2, LENGTH - len(out)), g)
        samples.append(out[:LENGTH])
    law = p.sequence_law(LENGTH)
    assert gof_pvalue(samples, law) > 1e-3
    biased = {k: v * (1.5 if k[0] == 0 else 1.0) for k, v in law.items()}  # token 0 (the proposal) favoured
    total = sum(biased.values())
    assert gof_pvalue(samples, {k: v / total for k, v in biased.items()}) < 1e-6


@pytest.mark.slow
def test_block_accepts_at_least_as_many_tokens_as_token_by_token() -> None:
    """Exact expectations on many random pairs, then the same p, q sampled many times with each rule."""
    cases = []
    for seed in range(12):
        p, q = pair(SETTINGS[seed % 4], 300 + seed, noise=0.5 + 0.1 * seed)
        b, t = expected_accepted(block_step_law(p, q, 3)), expected_accepted(token_step_law(p, q, 3))
        assert b >= t - 1e-12, (seed, b, t)
        cases.append((b - t, b, t, p, q))
    gain, b, t, p, q = max(cases, key=lambda c: c[0])
    assert gain > 0.02  # strictly better somewhere, not only equal
    exact = {"block": b, "token": t}
    n = 15000
    means, sds = {}, {}
    for name, rule in (("block", block_verify), ("token", rejection_sample)):
        g = torch.Generator().manual_seed(9)
        acc = [len(step(rule, p, q, (), 3, g)) - 1 for _ in range(n)]
        means[name] = sum(acc) / n
        sds[name] = math.sqrt(sum((a - means[name]) ** 2 for a in acc) / (n - 1) / n)
        assert abs(means[name] - exact[name]) < 4 * sds[name], (name, means[name], exact[name])
    z = (means["block"] - means["token"]) / math.hypot(sds["block"], sds["token"])
    assert z > 3, (means, z)


@pytest.mark.slow
def test_deterministic_drafter_accepts_the_same_as_token_by_token() -> None:
    """With q one-hot the accepted length has the same law under both rules: P(τ >= i) = Π p(X_j)."""
    p = PrefixLaws(V, LENGTH + 3, SETTINGS[0], 21)
    counts = {}
    for name, rule in (("block", block_verify), ("token", rejection_sample)):
        g = torch.Generator().manual_seed(4)
        acc = [len(step(rule, p, None, (), 3, g)) - 1 for _ in range(N)]
        counts[name] = [acc.count(k) for k in range(4)]
    w = [1.0]
    for i in range(3):
        w.append(w[-1] * float(p((0,) * i)[0]))
    law = {k: w[k] - (w[k + 1] if k < 3 else 0.0) for k in range(4)}
    for name in counts:
        samples = [k for k in range(4) for _ in range(counts[name][k])]
        assert gof_pvalue(samples, law) > 1e-3, name
