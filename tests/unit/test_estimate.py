"""The one estimator (``sizing.estimate``) and its six uses.

Each port is checked against the formula it replaced, copied here as the reference: a fixed random
sequence of observations goes through both, and every estimate must agree to 1e-9 (a rescaled sum can
differ from the old one in its last bits; nothing else may differ)."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, cast

import pytest

import specdecode
from specdecode.drafters.auto import AutoDrafter
from specdecode.drafters.auto_members import OPTIMISTIC, PRIOR_ALPHA, PRIOR_WEIGHT, PROBE_FIRST, PROBE_MAX, \
    PROBE_WEIGHT, RATE_EMA, Member
from specdecode.drafters.base import Acceptance
from specdecode.drafters.eagle_sizing import CALIB_MEMORY, CALIB_PRIOR, EdgeCalibration
from specdecode.drafters.medusa_tree import RankAcceptance
from specdecode.drafters.suffix import BUCKETS, CONF_MEMORY, CONF_PRIOR, CONF_WEIGHT, IDLE_AGE, Q_MAX, SuffixDrafter, \
    _RowState
from specdecode.sizing.estimate import Estimate, ProbeSchedule, judged
from specdecode.sizing.estimate import HISTORY_WEIGHT, PROBE_GAPS, RowEvidence

TOL = 1e-9


# -- the estimator itself --------------------------------------------------------------------------------------
def test_a_kept_prior_holds_its_weight_and_memory_bounds_the_evidence() -> None:
    e = Estimate(0.7, 2.0, memory=10.0)
    assert e.mean == 0.7  # no evidence: the prior
    for _ in range(100):
        e.add(0.0)
    assert e.trials == pytest.approx(10.0) and e.hits == 0.0
    assert e.mean == pytest.approx(0.7 * 2 / 12)  # the prior still weighs 2 against a memory of 10
    e.fade(0.5)
    assert e.trials == pytest.approx(5.0) and e.mean == pytest.approx(0.7 * 2 / 7)


def test_a_forgotten_prior_is_replaced_by_the_evidence() -> None:
    e = Estimate(0.9, 4.0, memory=20.0, forgets_prior=True)
    assert e.mean == pytest.approx(0.9) and e.trials == 4.0  # the prior entered as evidence
    for _ in range(2000):
        e.add(0.0)
    assert e.mean < 1e-9  # its say is gone, unlike a kept prior's
    for _ in range(400):
        e.age(0.05)  # ageing walks the evidence back to the start
    assert e.mean == pytest.approx(0.9) and e.trials == pytest.approx(4.0)


def test_mean_with_reads_the_evidence_under_another_prior() -> None:
    e = Estimate(0.7, 2.0)
    e.add(3.0, 4.0)
    assert e.mean == pytest.approx((3 + 1.4) / 6)
    assert e.mean_with(0.2, 10.0) == pytest.approx((3 + 2) / 14)
    assert Estimate(0.5, 0.0).mean_with(0.3, 0.0) == 0.3  # nothing at all: the prior asked for


def test_a_sample_given_a_share_moves_the_mean_by_it_and_counts_as_its_trials() -> None:
    e = Estimate(1.0, 1.0, forgets_prior=True)
    for _ in range(9):
        e.add(1.0)
    e.add(11.0, share=0.5)  # its trials alone would give it 1/11
    assert e.mean == pytest.approx(6.0) and e.trials == pytest.approx(11.0)
    e.add(6.0 + 12.0, share=0.01)  # a share below the natural one changes nothing
    assert e.mean == pytest.approx(6.0 + 12.0 / 12)


def test_memory_sets_the_least_share_of_a_sample() -> None:
    e = Estimate(0.0, 1.0, memory=9.0, forgets_prior=True)
    for _ in range(50):
        e.add(0.0)
    before = e.mean
    e.add(10.0)
    assert e.mean - before == pytest.approx(0.1 * (10.0 - before))  # 1 / (memory + 1)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="weight"):
        Estimate(0.5, -1.0)
    with pytest.raises(ValueError, match="memory"):
        Estimate(0.5, 1.0, memory=0.0)
    with pytest.raises(ValueError, match="probe schedule"):
        ProbeSchedule(8, growth=0.5)


def test_judged_counts_the_first_rejection_only() -> None:
    assert [judged(4, a) for a in range(5)] == [1, 2, 3, 4, 4]


def test_a_probe_schedule_doubles_to_its_cap_and_restarts_on_merit() -> None:
    s = ProbeSchedule(2, 2, cap=8)
    probes = []
    for step in range(40):
        if s.due():
            probes.append(step)
            s.drafted(probe=True)
        else:
            s.plain()
    assert [b - a - 1 for a, b in zip(probes, probes[1:])] == [4, 8, 8, 8]  # plain steps between probes
    assert probes[0] == 2
    s.restart()
    assert s.gap == 2
    at_start = ProbeSchedule(8, 2, at_start=True)
    assert at_start.due()
    at_start.drafted(probe=True)  # the request's first pass: the gap stays the first one
    assert not at_start.due() and at_start.gap == 8


# -- drafters.base.Acceptance --------------------------------------------------------------------------------
class OldAcceptance:
    def __init__(self, prior_alpha: float, prior_weight: float, memory: float, half_life: float) -> None:
        self.prior_alpha, self.prior_weight, self.memory = prior_alpha, prior_weight, memory
        self._fade = 0.5 ** (1.0 / half_life)
        self.accepted = 0.0
        self.evaluated = 0.0

    @property
    def alpha(self) -> float:
        return (self.accepted + self.prior_alpha * self.prior_weight) / (self.evaluated + self.prior_weight)

    def fade(self) -> None:
        self.accepted *= self._fade
        self.evaluated *= self._fade

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if n_drafted == 0:
            return
        self.accepted += n_accepted
        self.evaluated += n_accepted + (1 if n_accepted < n_drafted else 0)
        if self.evaluated > self.memory:
            keep = self.memory / self.evaluated
            self.accepted *= keep
            self.evaluated *= keep


def _chain_steps(rng: random.Random, n: int, good: float) -> list[tuple[int, int]]:
    out = []
    for _ in range(n):
        g = rng.choice([0, 1, 2, 4, 8])
        a = 0
        while a < g and rng.random() < good:
            a += 1
        out.append((g, a))
    return out


def _replay_acceptance(new: Acceptance, old: OldAcceptance, rng: random.Random, n: int = 3000) -> None:
    steps = _chain_steps(rng, n // 2, good=0.85) + _chain_steps(rng, n // 2, good=0.3)  # a change of workload
    for g, a in steps:
        new.fade()
        old.fade()
        new.update(g, a)
        old.update(g, a)
        assert abs(new.alpha - old.alpha) < TOL
        assert abs(new.accepted - old.accepted) < TOL and abs(new.evaluated - old.evaluated) < TOL


@pytest.mark.parametrize("args", [(0.7, 2.0, 100.0, 4096.0), (0.3, 6.0, 20.0, 16.0)])
def test_acceptance_port_matches_the_old_formula(args: tuple[float, float, float, float]) -> None:
    _replay_acceptance(Acceptance(*args), OldAcceptance(*args), random.Random(48))


# -- sizing.estimate.RowEvidence ---------------------------------------------------------------------------------
class OldRowEvidence:
    def __init__(self, history: OldAcceptance, memory: float = 100.0,
                 prior: Optional[tuple[float, float]] = None) -> None:
        alpha0, weight0 = prior if prior is not None else (history.prior_alpha, history.prior_weight)
        w = min(HISTORY_WEIGHT, history.evaluated)
        past = history.accepted / history.evaluated if history.evaluated > 0 else 0.0
        self.fresh_alpha = alpha0
        mean = (alpha0 * weight0 + past * w) / (weight0 + w)
        self.accepted = mean * weight0
        self.evaluated = weight0
        self.memory = memory
        self.plain = 0
        self.gap = PROBE_GAPS[0]
        self.started = False

    @property
    def alpha(self) -> float:
        return self.accepted / self.evaluated if self.evaluated > 0 else self.fresh_alpha

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.accepted += accepted
        self.evaluated += accepted + (1 if accepted < drafted else 0)
        if self.evaluated > self.memory:
            keep = self.memory / self.evaluated
            self.accepted *= keep
            self.evaluated *= keep

    def probe_due(self) -> bool:
        return not self.started or self.plain >= self.gap

    def step(self, drafted: int, probe: bool) -> None:
        if drafted > 0:
            if probe and self.started:
                self.gap *= PROBE_GAPS[1]
            self.started, self.plain = True, 0
        else:
            self.plain += 1


@pytest.mark.parametrize("prior", [None, (0.75, 6.0)])
@pytest.mark.parametrize("history_steps", [0, 3, 400])
def test_row_evidence_port_matches_the_old_formula(prior: Optional[tuple[float, float]], history_steps: int) -> None:
    rng = random.Random(history_steps)
    new_h, old_h = Acceptance(), OldAcceptance(0.7, 2.0, 100.0, 4096.0)
    for g, a in _chain_steps(rng, history_steps, good=0.2):
        new_h.update(g, a)
        old_h.update(g, a)
    new, old = RowEvidence(new_h, prior=prior), OldRowEvidence(old_h, prior=prior)
    assert new.fresh_alpha == old.fresh_alpha
    for k in range(3000):
        assert new.probe_due() == old.probe_due() and new.plain == old.plain
        # the policy's choice, often plain (a switched-off row), at times on merit
        g = rng.choice([0, 0, 0, 3]) if k % 700 < 500 else rng.choice([0, 2, 5])
        probe = g == 0 and old.probe_due()
        if probe:
            g = 2
        new.step(g, probe)
        old.step(g, probe)
        a = sum(1 for _ in range(g) if rng.random() < 0.6)  # not a prefix law: the count is all that matters
        new.update(g, min(a, g))
        old.update(g, min(a, g))
        assert abs(new.alpha - old.alpha) < TOL
        assert abs(new.evaluated - old.evaluated) < TOL


# -- eagle_sizing.EdgeCalibration ------------------------------------------------------------------------------
class OldEdgeCalibration:
    def __init__(self, buckets: int = 10) -> None:
        self.buckets = buckets
        self.accepted = [[0.0] * buckets for _ in range(2)]
        self.judged = [[0.0] * buckets for _ in range(2)]

    def _bucket(self, p: float) -> int:
        return min(self.buckets - 1, max(0, int(p * self.buckets)))

    def rate(self, p: float, first: bool = True) -> float:
        b, k = self._bucket(p), int(first)
        return min(1.0, (self.accepted[k][b] + CALIB_PRIOR * p) / (self.judged[k][b] + CALIB_PRIOR))

    def observe(self, p: float, ok: bool, first: bool = True) -> None:
        b, k = self._bucket(p), int(first)
        acc, judged = self.accepted[k], self.judged[k]
        acc[b] += float(ok)
        judged[b] += 1.0
        if judged[b] > CALIB_MEMORY:
            keep = CALIB_MEMORY / judged[b]
            acc[b] *= keep
            judged[b] *= keep


def test_edge_calibration_port_matches_the_old_formula() -> None:
    rng = random.Random(9)
    new, old = EdgeCalibration(), OldEdgeCalibration()
    for _ in range(30000):  # past CALIB_MEMORY in the busiest buckets
        p, first = rng.random() ** 2, rng.random() < 0.6
        ok = rng.random() < min(1.0, 1.6 * p if first else 0.7 * p)
        new.observe(p, ok, first)
        old.observe(p, ok, first)
        q = rng.random()
        assert abs(new.rate(q, first) - old.rate(q, first)) < TOL
    assert max(map(max, old.judged)) == pytest.approx(CALIB_MEMORY, abs=1)  # the memory was exercised
    assert new.observations == pytest.approx(sum(map(sum, old.judged)))
    for new_side, old_side in zip(new.accepted, old.accepted):
        assert new_side == pytest.approx(old_side, abs=TOL)


# -- medusa_tree.RankAcceptance --------------------------------------------------------------------------------
class OldRankAcceptance:
    def __init__(self, depth: int, ranks: int, prior: Any, prior_weight: float, memory: float) -> None:
        self.depth, self.ranks, self.memory = depth, ranks, memory
        base = [list(prior[d][:ranks]) + [0.0] * (ranks - len(prior[d][:ranks])) if prior is not None and d < len(prior)
                else [0.4 * 0.5 ** r for r in range(ranks)] for d in range(depth)]
        self.counts = [[prior_weight * p for p in row] for row in base]
        self.totals = [prior_weight] * depth

    def observe(self, ranks: list[int]) -> None:
        for d, r in enumerate(ranks[: self.depth]):
            if r < self.ranks:
                self.counts[d][r] += 1.0
            self.totals[d] += 1.0
            if self.totals[d] > self.memory:
                keep = self.memory / self.totals[d]
                self.counts[d] = [c * keep for c in self.counts[d]]
                self.totals[d] = self.memory
            if r >= self.ranks:
                break

    def table(self) -> list[list[float]]:
        out = []
        for row, total in zip(self.counts, self.totals):
            p, best = [], 1.0
            for c in row:
                best = min(best, c / total)
                p.append(best)
            out.append(p)
        return out


@pytest.mark.parametrize("prior", [None, [[0.6, 0.2, 0.05], [0.3, 0.1]]])
def test_rank_acceptance_port_matches_the_old_formula(prior: Any) -> None:
    rng = random.Random(4)
    depth, ranks, weight, memory = 4, 6, 50.0, 300.0
    new = RankAcceptance(depth, ranks, prior, weight, memory)
    old = OldRankAcceptance(depth, ranks, prior, weight, memory)
    for _ in range(3000):
        obs = [min(ranks, int(rng.expovariate(0.8))) for _ in range(depth)]
        new.observe(obs)
        old.observe(obs)
        for new_row, old_row in zip(new.table(), old.table()):
            assert new_row == pytest.approx(old_row, abs=TOL)
    assert new.totals == pytest.approx(old.totals, abs=TOL) and old.totals[0] == memory
    for new_row, old_row in zip(new.counts, old.counts):
        assert new_row == pytest.approx(old_row, abs=TOL)


# -- suffix's confidence table ---------------------------------------------------------------------------------
class OldSuffixConf:
    def __init__(self) -> None:
        self.conf = [[q * CONF_WEIGHT, CONF_WEIGHT] for q in CONF_PRIOR + CONF_PRIOR]

    def verified(self, b: int, n_accepted: int, per_depth: list[float]) -> None:
        acc = self.conf[b]
        acc[0] += n_accepted
        acc[1] += sum(per_depth[:n_accepted + 1])
        if acc[1] > CONF_MEMORY:
            keep = CONF_MEMORY / acc[1]
            acc[0] *= keep
            acc[1] *= keep

    def age(self, b: int) -> None:
        acc = self.conf[b]
        acc[0] += IDLE_AGE * (CONF_PRIOR[b % len(BUCKETS)] * CONF_WEIGHT - acc[0])
        acc[1] += IDLE_AGE * (CONF_WEIGHT - acc[1])

    def q(self, b: int) -> float:
        a, p = self.conf[b]
        return min(Q_MAX, max(0.02, a / p))


def test_suffix_confidence_port_matches_the_old_formula() -> None:
    rng = random.Random(20)
    new, old = SuffixDrafter(), OldSuffixConf()
    slots = 2 * len(BUCKETS)
    for _ in range(20000):
        b = rng.randrange(slots)
        if rng.random() < 0.3:
            new._age(b)
            old.age(b)
        else:
            depth = rng.randint(1, 8)
            per_depth = [rng.uniform(0.2, 1.0) for _ in range(depth)]  # Σ frequency of the tree's nodes per depth
            n = min(depth, int(rng.expovariate(0.5)))
            new._rows[0] = _RowState(cast(Any, None), 0, 0, 0, 0, pending=(b, per_depth))
            new.on_verified_row(0, n)
            old.verified(b, n, per_depth)
        for k, m in enumerate(BUCKETS):
            for stored in (False, True):
                assert abs(new.conf(m, stored) - old.q(k + (len(BUCKETS) if stored else 0))) < TOL
    assert max(c[1] for c in old.conf) > 0.9 * CONF_MEMORY  # the memory was exercised


# -- auto's member rates, prior and probe schedule -------------------------------------------------------------
@dataclass
class OldRates:
    rate: float = OPTIMISTIC
    steps: int = 0
    row: tuple[float, int] = (OPTIMISTIC, 0)

    def observe(self, sample: float, probing: bool) -> None:
        self.steps += 1
        weight = max(RATE_EMA, 1.0 / (self.steps + 1), PROBE_WEIGHT if probing else 0.0)
        self.rate += weight * (sample - self.rate)
        rate, steps = self.row
        weight = max(RATE_EMA, 1.0 / (steps + 2), PROBE_WEIGHT if probing else 0.0)
        self.row = (rate + weight * (sample - rate), steps + 1)


class _Holder:
    def __init__(self) -> None:
        self.acceptance = Acceptance()


def test_auto_member_rates_port_matches_the_old_ema() -> None:
    rng = random.Random(49)
    m = Member("heads", cast(Any, _Holder()))
    old = OldRates()
    assert m.rates.mean == m.rate_at(0) == OPTIMISTIC
    for k in range(2000):
        m.probing = rng.random() < 0.1
        sample = rng.uniform(0.3, 3.0) if (k // 300) % 2 else rng.uniform(1.5, 4.0)
        AutoDrafter._observe(m, 0, sample)
        old.observe(sample, m.probing)
        assert abs(m.rates.mean - old.rate) < TOL and abs(m.rate_at(0) - old.row[0]) < TOL
        assert m.steps == old.steps


def test_auto_member_alpha_port_matches_the_old_formula() -> None:
    rng = random.Random(3)
    m = Member("lookup", cast(Any, _Holder()))
    a = m.drafter.acceptance
    for g, n in _chain_steps(rng, 1500, good=0.5):
        a.fade()
        a.update(g, n)
        old = (a.accepted + PRIOR_ALPHA * PRIOR_WEIGHT) / (a.evaluated + PRIOR_WEIGHT)
        assert abs(m.alpha - old) < TOL


def test_auto_probe_schedule_matches_the_old_intervals() -> None:
    """Auto's step: every member idles a step, a due probe lengthens the wait when asked (drafted or declined),
    one asked on merit restarts it, a winner's idle count restarts. The old counters, replayed beside it."""
    rng = random.Random(7)
    s = ProbeSchedule(PROBE_FIRST, 2, PROBE_MAX)
    idle, interval = 0, PROBE_FIRST
    for _ in range(20000):
        s.plain()
        idle += 1
        assert s.due() == (idle >= interval)
        asked = rng.random() < (0.9 if s.due() else 0.02)
        if asked and s.due():
            s.grow()
            interval = min(PROBE_MAX, 2 * interval)
        elif asked:
            s.restart()
            interval = PROBE_FIRST
        if asked and rng.random() < 0.5:
            s.drafted()
            idle = 0
        assert s.gap == interval and s.idle == idle
    assert math.isfinite(s.gap)


def test_no_module_outside_the_estimator_rescales_a_memory() -> None:
    """The rescale-when-full step (``keep = memory / trials``) is written once: a table elsewhere that needs
    one uses ``Estimate``."""
    root = Path(specdecode.__file__).parent
    pattern = re.compile(r"memory\s*/", re.IGNORECASE)
    found = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p.name != "estimate.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
