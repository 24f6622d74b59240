"""EAGLE tree sizing: what a node's value is (``EdgeCalibration``: calibrated edge acceptance), the
growing tree (``GrowingTree``) and the measured costs the sizing weighs it against (``EagleCosts``,
from the cost model's timing of ``EagleDrafter.cost_steps``). ``eagle.py`` grows and drafts the tree.

**Size from the cost model.** The draft is the top-n nodes by value (parents always rank
before children, so any prefix is a tree), n maximising E(n) / (cost of the levels run +
v(n) + t): E(n) = 1 + Σ values, v(n) the measured cost of a target pass over n + 1 tree
tokens, the ingestion's and a level's cost and t (a tree step's extra over a chain step)
measured once per machine. A level expands the m best frontier nodes, m chosen by the
predicted speedup of an optimistic next level (each expanded node's best child at the running
mean top-1 acceptance) against what m nodes cost (a level of one node and of ``expand`` measured,
linear between): a confident chain expands one node a level and pays for one, an uncertain
step branches. Growth stops when no m could raise the predicted speedup; nothing is drafted
unless it beats a plain pass after the same draft work by the policy's margin.

A node's value is the product of calibrated edge acceptances, not of raw draft probabilities: a
draft trained on the target's soft laws is under-confident about greedy acceptance (a top-1 at
p = 0.45 is the target's argmax far more often than 45% of the time), and the error compounds
with depth. ``EdgeCalibration`` learns, per bucket of draft probability, how often a judged node
(a child of a node on the target's path, drafted or not) was accepted, read off the tokens the
target actually wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from ..sizing.book import CostSpec
from ..sizing.costs import Costs
from ..sizing.estimate import Estimate
from ..sizing.live import StepTimings, follows, live_v, unit_seconds
from ..sizing.pricer import Pricer
from .tree_steps import measured_tree_extra

if TYPE_CHECKING:
    from ..models import Model

BUCKETS = 10  # edge calibration: draft probability buckets
CALIB_PRIOR = 5.0  # observations per bucket the identity prior (acceptance = p) is worth
CALIB_MEMORY = 2000.0  # observations per bucket the running estimate remembers


class EdgeCalibration:
    """a(p, first): the chance that a judged draft node whose draft probability given its parent is p is
    the target's token, per bucket of p, apart for a parent's first child (its draft top-1) and the
    others, starting from a(p) = p. The two differ at the same p: a top-1 at p = 0.35 tops a flat law,
    a second child at 0.35 trails a sibling at 0.35 or more, so a pooled calibration underrates first
    children and trees grow shallower than chains."""

    def __init__(self, buckets: int = BUCKETS) -> None:
        self.buckets = buckets
        # [first child?][bucket]; the prior is read at the node's own p (``rate``), the bucket's middle is a label
        self.table = [[Estimate((b + 0.5) / buckets, CALIB_PRIOR, CALIB_MEMORY) for b in range(buckets)]
                      for _ in range(2)]

    def _bucket(self, p: float) -> int:
        return min(self.buckets - 1, max(0, int(p * self.buckets)))

    def rate(self, p: float, first: bool = True) -> float:
        return min(1.0, self.table[int(first)][self._bucket(p)].mean_with(p, CALIB_PRIOR))

    def observe(self, p: float, ok: bool, first: bool = True) -> None:
        self.table[int(first)][self._bucket(p)].add(float(ok))

    @property
    def accepted(self) -> list[list[float]]:
        return [[e.hits for e in side] for side in self.table]

    @property
    def observations(self) -> float:
        return sum(e.trials for side in self.table for e in side)

    def observe_tree(self, written: Sequence[int], tokens: Sequence[int], parents: Sequence[int],
                     probs: Sequence[float]) -> None:
        """Judge a grown tree (``tokens``, ``parents``, ``probs``) by the tokens the target ``written`` since:
        walk it along them; every child of a node on that path (and of the root) was judged, the one on
        the path accepted. The whole tree, not only the drafted part: a node left out, or a step that
        drafted nothing, is judged all the same by the token the target wrote, and without that evidence
        a conservative start (a(p) = p) would keep trees small and so never learn otherwise."""
        children: dict[int, list[int]] = {}
        for i, par in enumerate(parents):
            children.setdefault(par, []).append(i)
        node = -1
        for t in written:
            nxt = -1
            for rank, i in enumerate(children.get(node, [])):  # a node's children were appended best first
                ok = tokens[i] == t
                self.observe(probs[i], ok, rank == 0)
                if ok:
                    nxt = i
            if nxt < 0:
                break
            node = nxt


@dataclass
class GrowingTree:
    """A growing tree of one row: tokens, parents, values, depths; per expanded node its scratch slot."""

    tokens: list[int]
    parents: list[int]
    probs: list[float]  # the draft's probability of the node given its parent
    values: list[float]  # Π calibrated acceptance along the path
    depths: list[int]
    feats: list[int]  # the feature bank row of the output that is this node's input feature
    ancestors: list[int]  # bit j: scratch slot j holds an expanded ancestor's key (itself once expanded)


@dataclass(frozen=True)
class EagleCosts:
    """What tree sizing needs, relative to a one-token target pass: ``costs`` (v(n) of tree passes),
    ``level`` (one tree level of ``expand`` nodes, the draft's weights warm from the ingestion before it),
    ``level_one`` (a level of one node), ``tree_extra``
    (a tree step's extra over a chain step) and ``ingest`` (ingesting a step's few verified
    positions right after the target's pass, its weights cold)."""

    costs: Costs
    level: float
    tree_extra: float
    ingest: float
    level_one: float  # a level of one node (a chain's)

    @classmethod
    def from_costs(cls, costs: Costs, tree_extra: float) -> "EagleCosts":
        """The figures from the cost model's ``Costs`` of ``EagleDrafter.cost_steps`` (c: a level)."""
        return cls(costs, costs.c, tree_extra, costs.extra("ingest"), costs.extra("level_one"))

    def to_costs(self) -> Costs:
        """The ``Costs`` that ``from_costs`` reads (the cache file's figures; the tree step's extra is its own)."""
        unit = self.costs.target_s[0] if self.costs.target_s else None
        return replace(self.costs, c=self.level, draft_s=self.level * unit if unit else self.costs.draft_s,
                       extras=(("ingest", self.ingest), ("level_one", self.level_one)))


def refined_eagle_costs(cur: EagleCosts, steps: StepTimings, passes: Mapping[int, float], expand: int
                        ) -> Optional[EagleCosts]:
    """``cur`` with the trusted live figures that differ from it by more than ``FOLLOW`` put in (None: none
    does): v(n) from the passes, the ingestion and the levels over the live one-token pass (``sizing/live.py``).
    A level of one node does less than an ingestion (one position, no feature projection) and a level of
    ``expand`` nodes no more than ``expand`` levels of one, so a pessimistic level figure not yet timed is
    bounded by them: the tree then runs such levels, and times them."""
    costs = live_v(cur.costs, passes) or cur.costs
    unit = unit_seconds(costs, passes)
    if unit is None:
        return None
    ingest = steps.ratio("ingest", unit) or cur.ingest
    one = steps.ratio("level_one", unit) or min(cur.level_one, ingest)
    full = steps.ratio("level", unit) or min(cur.level, expand * one)
    pairs = ((ingest, cur.ingest), (one, cur.level_one), (full, cur.level))
    if costs is cur.costs and not any(follows(a, b) for a, b in pairs):
        return None
    new = EagleCosts(costs, full, cur.tree_extra, ingest, one)
    return replace(new, costs=new.to_costs())


def eagle_costs(target: "Model", spec: CostSpec, pricer: Pricer) -> EagleCosts:
    """``EagleCosts`` from ``pricer``'s cost book (measured once per machine, target and draft shape, then
    cached; a tree step's extra: ``tree_steps.TreeStep``, shared by the tree drafters)."""
    return EagleCosts.from_costs(pricer.costs(target, spec), measured_tree_extra(target, pricer))


def best_prefix(values: Sequence[float], spent: float, costs: Costs) -> tuple[int, float]:
    """(n, predicted speedup) of the best prefix of ``values`` (node values, best first) after draft work
    ``spent`` (a tree's extra included): E(n) / (spent + v(n)), E(n) = 1 + the first n values."""
    e, best_n, best_s = 1.0, 0, 0.0
    for n, v in enumerate(values, start=1):
        e += v
        s = e / (spent + costs.v_at(n))
        if s > best_s:
            best_n, best_s = n, s
    return best_n, best_s


def level_cost(m: int, one: float, full: float, expand: int) -> float:
    """A level of m nodes: measured at one node (``one``) and at ``expand`` (``full``), linear between."""
    if expand <= 1:
        return one
    return one + (full - one) * (m - 1) / (expand - 1)
