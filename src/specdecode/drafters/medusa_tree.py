"""Medusa's tree planning: the running acceptance table p[d][r] (``RankAcceptance``) and the tree that
maximises predicted speed under the measured costs (``plan_tree``; ``fixed_plan`` for a given tree).
The drafter (``medusa.py``) proposes the planned tree's candidates."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional, Sequence

from ..config import ConfigError
from ..sizing.costs import Costs
from ..sizing.estimate import Estimate

MAX_NODES = 63  # the pending token plus 63 nodes = 64 new tokens, the fused path's tree-mask limit
RANKS = 10  # candidates per head whose acceptance is tracked (trees use at most these)
PRIOR_WEIGHT = 50.0  # observations the held-out table is worth
MEMORY = 2000.0  # observations per depth the running estimate remembers


# -- acceptance by depth and rank ---------------------------------------------------------------
class RankAcceptance:
    """p[d][r]: the chance that head d + 1's rank-r candidate is the target's token, given every
    earlier head had the target's token among its top ``ranks``. A prior worth ``prior_weight``
    observations, then counts over about the last ``memory`` observations per depth. The held-out
    table is a starting guess the live counts replace (a forgotten prior); every rank at a depth sees
    every observation there, so their trials, and so their rescaling, stay equal."""

    def __init__(self, depth: int, ranks: int = RANKS, prior: Optional[Sequence[Sequence[float]]] = None,
                 prior_weight: float = PRIOR_WEIGHT, memory: float = MEMORY) -> None:
        self.depth, self.ranks, self.memory = depth, ranks, memory
        base = [list(prior[d][:ranks]) + [0.0] * (ranks - len(prior[d][:ranks])) if prior is not None and d < len(prior)
                else [0.4 * 0.5 ** r for r in range(ranks)] for d in range(depth)]  # a modest guess without a table
        self.p = [[Estimate(q, prior_weight, memory, forgets_prior=True) for q in row] for row in base]
        self.version = 0

    def observe(self, ranks: Sequence[int]) -> None:
        """One position: the rank of the true token in each head's list (``self.ranks`` = not listed)."""
        for d, r in enumerate(ranks[: self.depth]):
            for k, est in enumerate(self.p[d]):
                est.add(1.0 if k == r else 0.0)
            if r >= self.ranks:
                break  # deeper heads only count while the path was coverable
        self.version += 1

    @property
    def counts(self) -> list[list[float]]:
        return [[e.hits for e in row] for row in self.p]

    @property
    def totals(self) -> list[float]:
        return [row[0].trials if row else 0.0 for row in self.p]

    def table(self) -> list[list[float]]:
        """p[d][r], made non-increasing in r (a lower-ranked candidate is never counted as likelier)."""
        out = []
        for row in self.p:
            p, best = [], 1.0
            for est in row:
                best = min(best, est.mean)
                p.append(best)
            out.append(p)
        return out


# -- the tree ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreePlan:
    """Nodes as rank paths, parents before children (best-first), and the prediction behind them."""

    paths: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    expected_tokens: float  # E[accepted path length + 1] under the rank table
    speedup: float  # predicted tokens per second over plain decoding

    @property
    def depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    @property
    def is_chain(self) -> bool:
        """Rank 0 at every depth: each node's parent is the one before, so it is drafted as a chain."""
        return all(r == 0 for p in self.paths for r in p)


NO_TREE = TreePlan((), (), 1.0, 1.0)


def best_first(table: Sequence[Sequence[float]], max_nodes: int, chain: bool = False
               ) -> list[tuple[float, tuple[int, ...]]]:
    """Up to ``max_nodes`` (value, rank path) in non-increasing value, where value = Π p along the path.
    ``table`` must be non-increasing in rank; a child's value never exceeds its parent's, so every
    prefix of the result is a tree (and the highest-value one of its size)."""
    depth, ranks = len(table), (1 if chain else min(len(r) for r in table) if table else 0)
    out: list[tuple[float, tuple[int, ...]]] = []
    if depth == 0 or ranks == 0:
        return out
    heap: list[tuple[float, tuple[int, ...], float]] = [(-table[0][0], (0,), 1.0)]  # (-value, rank path, parent value)
    while heap and len(out) < max_nodes:
        neg, path, parent_value = heapq.heappop(heap)
        if -neg <= 0.0:
            break
        out.append((-neg, path))
        d, r = len(path) - 1, path[-1]
        if r + 1 < ranks:  # the next sibling (same parent, next rank)
            heapq.heappush(heap, (-parent_value * table[d][r + 1], path[:-1] + (r + 1,), parent_value))
        if d + 1 < depth:  # the first child
            heapq.heappush(heap, (neg * table[d + 1][0], path + (0,), -neg))
    return out


def _best_prefix(nodes: Sequence[tuple[float, tuple[int, ...]]], costs: Costs, rows: int, extra: float,
                 floor: float) -> TreePlan:
    """The prefix of a best-first node list with the highest predicted speedup above ``floor``."""
    plain = costs.v_at(rows - 1)
    best_n, best_s, e, best_e = 0, floor, 1.0, 1.0
    for n, (value, _) in enumerate(nodes, start=1):
        e += value
        s = e * plain / (rows * (costs.c + extra) + costs.v_at(rows * (n + 1) - 1))
        if s > best_s:
            best_n, best_s, best_e = n, s, e
    if best_n == 0:
        return NO_TREE
    chosen = [p for _, p in nodes[:best_n]]
    # the rank-0 chain first (then best-first): its path, the one most often accepted, is then a prefix
    # of the pass, which ``cache.keep`` keeps without copying anything
    paths = tuple([p for p in chosen if not any(p)] + [p for p in chosen if any(p)])
    index = {p: i for i, p in enumerate(paths)}
    parents = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths)
    return TreePlan(paths, parents, best_e, best_s)


def plan_tree(table: Sequence[Sequence[float]], costs: Costs, max_nodes: int, margin: float, chain: bool = False,
              rows: int = 1, tree_extra: float = 0.0) -> TreePlan:
    """The draft maximising E(n) / cost(n) for ``rows`` rows drafting together, where
    cost(n) = rows·c + v(rows·(n + 1) − 1) against plain decoding's v(rows − 1), plus rows·``tree_extra``
    for a tree (its mask and the compaction of its accepted path cost more than a chain's rollback).
    The best chain (rank 0 at every depth) competes with the best tree, so a tree is drafted only when
    it pays for its own overhead; ``chain``: chains only. NO_TREE unless the best beats plain decoding
    by ``margin``."""
    cap = min(max_nodes, MAX_NODES)
    best_chain = _best_prefix(best_first(table, cap, chain=True), costs, rows, 0.0, margin)
    if chain:
        return best_chain
    best_tree = _best_prefix(best_first(table, cap), costs, rows, tree_extra, max(margin, best_chain.speedup))
    return best_tree if best_tree.paths else best_chain


def fixed_plan(choices: Sequence[Sequence[int]]) -> TreePlan:
    """A tree given as rank paths (Medusa's static "choices"), ordered parents first; for ablations
    and tests. Raises ConfigError when a path's parent is missing."""
    paths = sorted({tuple(int(r) for r in c) for c in choices}, key=lambda p: (len(p), p))
    index = {p: i for i, p in enumerate(paths)}
    for p in paths:
        if not p or min(p) < 0 or (len(p) > 1 and p[:-1] not in index):
            raise ConfigError(f"Medusa tree choice {list(p)} needs its parent {list(p[:-1])} in the tree too "
                              "(and ranks >= 0)")
    return TreePlan(tuple(paths), tuple(index[p[:-1]] if len(p) > 1 else -1 for p in paths), 0.0, 0.0)
