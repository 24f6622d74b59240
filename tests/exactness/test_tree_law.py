"""Sampled tree verification (``rejection_sample_tree``): the emitted law is the target's.

Two rules, one function: deterministic candidates (top-k children, no draft law: accept x with
probability r(x) under the current residual r, else zero it and renormalise) and sampled children
(SpecInfer's multi-draft rule / recursive rejection sampling: accept with min(1, r(x)/q(x)), else
r = norm(max(0, r - q))). Unit level on a toy prefix-dependent model: the law of the first tokens
of repeated steps, and one step's law of (accepted path, next token) against an exact enumeration,
each with a wrong law the same test rejects."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from functools import lru_cache
from typing import Callable, Optional

import pytest
import torch

from specdecode.config import SamplingConfig
from specdecode.sampling import draw
from specdecode.verify import VerifyResult, rejection_sample_tree

from .chi2 import gof_pvalue
from .test_rejection_law import SETTINGS
from .toylm import PrefixLaws

V, LENGTH, N = 5, 3, 12000
WIDTHS = (3, 2)  # root: 3 children; each of them: 2 children (9 nodes)
KINDS = ("topk", "iid", "norepl", "mixed")
SETTING_IDS = [f"T{s.temperature}-k{s.top_k}-p{s.top_p}-m{s.min_p}" for s in SETTINGS]
Tree = tuple[list[int], list[int], Optional[torch.Tensor]]


def topk(law: torch.Tensor, k: int) -> list[int]:
    return torch.topk(law, k).indices.tolist()


def children(law: torch.Tensor, width: int, kind: str, g: torch.Generator) -> list[tuple[int, Optional[torch.Tensor]]]:
    """(token, the law it was drawn from given its earlier siblings) for one node's children."""
    if kind == "topk":  # deterministic candidates (Medusa-style): no law
        return [(t, None) for t in topk(law, width)]
    if kind == "mixed":  # the draft's argmax as a deterministic (one-hot) sibling, then i.i.d. draws
        first = topk(law, 1)[0]
        return [(first, torch.nn.functional.one_hot(torch.tensor(first), V).float())] + \
            children(law, width - 1, "iid", g)
    if kind == "iid":  # one draw call for all the siblings
        return [(t, law) for t in draw(law.unsqueeze(0).expand(width, -1).contiguous(), g).tolist()]
    out: list[tuple[int, Optional[torch.Tensor]]] = []
    left = law.clone()
    for _ in range(width):  # without replacement: each from the law over the tokens not yet drawn
        if float(left.sum()) <= 0:
            break
        row = left / left.sum()
        t = int(draw(row.unsqueeze(0), g)[0])
        out.append((t, row))
        left[t] = 0.0
    return out


def build_tree(q: PrefixLaws, context: tuple[int, ...], kind: str, g: torch.Generator) -> Tree:
    """Breadth first, parents before children, widths ``WIDTHS``."""
    tokens: list[int] = []
    parents: list[int] = []
    rows: list[Optional[torch.Tensor]] = []
    frontier: list[tuple[int, tuple[int, ...]]] = [(-1, ())]
    for width in WIDTHS:
        nxt = []
        for parent, path in frontier:
            for tok, row in children(q(context + path), width, kind, g):
                tokens.append(tok)
                parents.append(parent)
                rows.append(row)
                nxt.append((len(tokens) - 1, path + (tok,)))
        frontier = nxt
    probs = None if kind == "topk" else torch.stack([r for r in rows if r is not None])
    return tokens, parents, probs


def paths(tokens: list[int], parents: list[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for t, par in zip(tokens, parents):
        out.append((out[par] if par >= 0 else ()) + (t,))
    return out


def tree_step(p: PrefixLaws, q: PrefixLaws, context: tuple[int, ...], kind: str, g: torch.Generator,
              verify: Callable[..., VerifyResult] = rejection_sample_tree) -> tuple[int, ...]:
    """One sampled tree verification at ``context`` (by ``verify``, the reference's call shape): the accepted
    path's tokens and the next token."""
    tokens, parents, probs = build_tree(q, context, kind, g)
    target = torch.stack([p(context)] + [p(context + path) for path in paths(tokens, parents)])
    r = verify(target, tokens, parents, probs, g)
    assert r.path is not None and r.n_accepted == len(r.path)
    for a, b in zip(r.path, r.path[1:]):
        assert parents[b] == a  # the accepted nodes form a root-to-node path
    return tuple(tokens[k] for k in r.path) + (r.next_token,)


def simulate(p: PrefixLaws, q: PrefixLaws, kind: str, g: torch.Generator) -> tuple[int, ...]:
    out: tuple[int, ...] = ()
    while len(out) < LENGTH:
        out += tree_step(p, q, out, kind, g)
    return out[:LENGTH]


def pair(setting: SamplingConfig, seed: int) -> tuple[PrefixLaws, PrefixLaws]:
    """A target and a draft that resembles it; the first seed from ``seed`` on whose laws at the root
    keep at least 3 tokens (a filter can leave one, and a one-token law tests nothing)."""
    while True:
        p = PrefixLaws(V, LENGTH + len(WIDTHS), setting, seed)
        q = PrefixLaws(V, LENGTH + len(WIDTHS), setting, seed + 1, like=p, noise=1.0)
        if min(int((p(()) > 0).sum()), int((q(()) > 0).sum())) >= 3:
            return p, q
        seed += 2


# -- one step's law, enumerated in float64 ---------------------------------------------------------
def candidates_step_law(p: PrefixLaws, q: PrefixLaws, renormalise: bool = True) -> dict[tuple[int, ...], float]:
    """Deterministic candidates: try the top-k children in order, child x accepted with probability
    r(x) / Σr, then r(x) = 0; if none is accepted, draw from r. ``renormalise=False`` is a plausible
    bug (accept with the target's own p(x)), kept to show the test's power."""

    @lru_cache(maxsize=None)
    def law_at(ctx: tuple[int, ...], depth: int) -> tuple[tuple[tuple[int, ...], float], ...]:
        P = p(ctx).double()
        out: dict[tuple[int, ...], float] = defaultdict(float)
        r, alive = P.clone(), 1.0
        if depth < len(WIDTHS):
            for x in topk(q(ctx), WIDTHS[depth]):
                mass = float(r.sum())
                acc = (float(r[x]) / mass if mass > 0 else 0.0) if renormalise else float(P[x])
                if acc > 0:
                    for seq, pr in law_at(ctx + (x,), depth + 1):
                        out[(x,) + seq] += alive * acc * pr
                alive *= 1.0 - acc
                r[x] = 0.0
        if float(r.sum()) <= 1e-12:
            r = P
        for y in range(V):
            out[(y,)] += alive * float(r[y] / r.sum())
        return tuple(out.items())

    return dict(law_at((), 0))


def sampled_step_law(p: PrefixLaws, q: PrefixLaws, use_q: bool = True,
                     update: bool = True) -> dict[tuple[int, ...], float]:
    """Children drawn i.i.d. from q: child x accepted with min(1, r(x)/q(x)), else r = norm(max(0, r - q)).
    ``update=False`` is a plausible bug (the residual is not updated after a rejection: inexact).
    ``use_q=False`` verifies the sampled children as deterministic candidates: also exact (that rule
    holds for any candidates drawn independently of the verifier's coins) but a different step law."""

    @lru_cache(maxsize=None)
    def law_at(ctx: tuple[int, ...], depth: int) -> tuple[tuple[tuple[int, ...], float], ...]:
        P, Q = p(ctx).double(), q(ctx).double()
        out: dict[tuple[int, ...], float] = defaultdict(float)
        if depth == len(WIDTHS):
            return tuple(((y,), float(P[y])) for y in range(V))
        for xs in itertools.product(range(V), repeat=WIDTHS[depth]):
            px = math.prod(float(Q[x]) for x in xs)
            if px == 0.0:
                continue
            r, alive = P.clone(), 1.0
            for x in xs:
                acc = min(1.0, float(r[x] / Q[x])) if use_q else float(r[x] / r.sum())  # r: normalised
                if acc > 0:
                    for seq, pr in law_at(ctx + (x,), depth + 1):
                        out[(x,) + seq] += px * alive * acc * pr
                alive *= 1.0 - acc
                if not update:
                    continue
                if use_q:
                    nr = (r - Q).clamp_min(0)
                    if float(nr.sum()) > 1e-12:
                        r = nr / nr.sum()
                else:
                    r[x] = 0.0
                    r = r / r.sum() if float(r.sum()) > 1e-12 else P.clone()
            for y in range(V):
                out[(y,)] += px * alive * float(r[y])
        return tuple(out.items())

    return dict(law_at((), 0))


# -- tests -----------------------------------------------------------------------------------------
# the two rules under every filter setting; their generalisations (children drawn without replacement,
# a deterministic sibling among sampled ones) under the plain one
CASES = [(k, s) for k in ("topk", "iid") for s in SETTINGS] + [(k, SETTINGS[0]) for k in ("norepl", "mixed")]


@pytest.mark.parametrize("kind, setting", CASES,
                         ids=[f"{k}-{SETTING_IDS[SETTINGS.index(s)]}" for k, s in CASES])
def test_tree_output_law_is_target_law(kind: str, setting: SamplingConfig) -> None:
    """Repeated tree steps emit the target's law: top-k candidates, i.i.d. children, children drawn
    without replacement (recursive rejection sampling) and a deterministic sibling beside sampled ones."""
    p, q = pair(setting, 500 + KINDS.index(kind))
    g = torch.Generator().manual_seed(17)
    samples = [simulate(p, q, kind, g) for _ in range(N)]
    assert gof_pvalue(samples, p.sequence_law(LENGTH)) > 1e-3
    assert gof_pvalue(samples, q.sequence_law(LENGTH)) < 1e-6  # power: not the draft's law


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
def test_candidates_step_law(setting: SamplingConfig) -> None:
    """Deterministic candidates, one step: the first emitted token follows p; (accepted path, next token)
    follows the enumerated rule, and not the same rule without renormalisation."""
    p, q = pair(setting, 40)
    g = torch.Generator().manual_seed(8)
    samples = [tree_step(p, q, (), "topk", g) for _ in range(N)]
    first = [s[0] for s in samples]
    assert gof_pvalue(first, {t: float(p(())[t]) for t in range(V)}) > 1e-3
    law = candidates_step_law(p, q)
    assert abs(sum(law.values()) - 1.0) < 1e-6
    assert gof_pvalue(samples, law) > 1e-3
    assert gof_pvalue(samples, candidates_step_law(p, q, renormalise=False)) < 1e-6


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
def test_sampled_children_step_law(setting: SamplingConfig) -> None:
    """I.i.d. sampled children, one step: first token ~ p; (accepted path, next token) follows the
    enumerated multi-draft rule, not the same rule without the residual update (a bug), and not the
    candidates' rule applied to sampled children (exact too, but it is not the rule implemented)."""
    p, q = pair(setting, 60)
    g = torch.Generator().manual_seed(9)
    samples = [tree_step(p, q, (), "iid", g) for _ in range(N)]
    first = [s[0] for s in samples]
    assert gof_pvalue(first, {t: float(p(())[t]) for t in range(V)}) > 1e-3
    law = sampled_step_law(p, q)
    assert abs(sum(law.values()) - 1.0) < 1e-6
    assert gof_pvalue(samples, law) > 1e-3
    assert gof_pvalue(samples, sampled_step_law(p, q, update=False)) < 1e-6
    assert gof_pvalue(samples, sampled_step_law(p, q, use_q=False)) < 1e-6
