"""The one γ policy: draft only when the measured costs and acceptance say it pays, at any batch width."""

from __future__ import annotations

import pytest

from specdecode.sizing.costs import Costs, expected_tokens
from specdecode.drafters.base import Acceptance
from specdecode.sizing.policy import GammaPolicy, RowPlan


def plans(n: int, cap: int = 4, alpha: float = 0.8, drafter: str = "model", auto: bool = True) -> list[RowPlan]:
    return [RowPlan(drafter, cap, auto, alpha) for _ in range(n)]


def measured(policy: GammaPolicy, batch: int, per_width: dict[int, float], draft_step: float) -> None:
    """Target pass costs per width, and the cost of one batched draft position for all ``batch`` rows."""
    for width, seconds in per_width.items():
        policy.record_target(batch, width, seconds)
    policy.record_draft("model", batch, 1, draft_step)


@pytest.mark.parametrize("alpha,gamma,expected", [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.8, 2, 2.44), (0.6, 2, 1.96)])
def test_expected_tokens_is_the_papers_formula(alpha: float, gamma: int, expected: float) -> None:
    assert expected_tokens(alpha, gamma) == pytest.approx(expected, abs=0.005)


def test_drafting_pays_when_verification_is_cheap_and_drafts_are_accepted() -> None:
    p = GammaPolicy()
    measured(p, 4, {1: 0.010, 2: 0.011, 3: 0.012, 4: 0.013, 5: 0.014}, draft_step=0.002)
    assert p.choose(plans(4, alpha=0.9)) == [4] * 4


def test_no_drafting_when_acceptance_is_low() -> None:
    p = GammaPolicy()
    measured(p, 4, {1: 0.010, 2: 0.011, 3: 0.012, 4: 0.013, 5: 0.014}, draft_step=0.002)
    assert p.choose(plans(4, alpha=0.05)) == [0] * 4


def test_batch_width_is_an_input_a_wide_compute_bound_batch_does_not_draft() -> None:
    p = GammaPolicy()
    measured(p, 16, {w: 0.010 * w for w in range(1, 6)}, draft_step=0.004)  # 16 rows: a pass costs ~T tokens
    assert p.choose(plans(16, alpha=0.7)) == [0] * 16
    measured(p, 1, {w: 0.010 for w in range(1, 6)}, draft_step=0.001)  # one row, flat cost: the same α pays
    assert p.choose(plans(1, alpha=0.7))[0] > 0


def test_unmeasured_widths_get_a_lower_bound_and_are_tried() -> None:
    p = GammaPolicy()
    p.record_target(2, 1, 0.010)  # only plain decoding measured
    assert p.choose(plans(2)) == [4, 4]


def test_fixed_rows_draft_their_cap_and_rows_without_a_drafter_never_draft() -> None:
    p = GammaPolicy()
    measured(p, 3, {w: 0.010 * w for w in range(1, 6)}, draft_step=0.004)
    got = p.choose([RowPlan(None, 0, False, 0.0), RowPlan("ngram", 3, False, 0.0), RowPlan("model", 4, True, 0.05)])
    assert got == [0, 3, 0]


def test_noise_cannot_make_a_wider_pass_look_cheaper() -> None:
    p = GammaPolicy()
    p.record_target(2, 1, 0.010)
    p.record_target(2, 5, 0.004)  # a lucky measurement
    assert p.target_seconds(2, 5) == 0.010


def test_a_batched_draft_costs_per_position_not_per_row() -> None:
    p = GammaPolicy()
    measured(p, 16, {w: 0.010 for w in range(1, 6)}, draft_step=0.002)
    assert p.draft_seconds("model", 16) == 0.002 and p.draft_seconds("model", 32) == 0.002
    assert p.draft_seconds("model", 8) == 0.0  # unmeasured smaller batch: optimistic until measured
    assert p.choose(plans(16)) == [4] * 16


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.85, 0.95])
def test_one_row_with_offline_costs_is_leviathans_rule(alpha: float) -> None:
    costs = Costs(c=0.06, v=tuple(1.0 + 0.05 * k + 0.01 * k * k for k in range(16)))
    p = GammaPolicy()
    p.set_offline("model", costs)
    p.record_target(1, 3, 0.123)  # online seconds set the unit only; the choice is E / (γc + v)
    want = costs.best_gamma(alpha, 15)
    assert p.choose(plans(1, cap=15, alpha=alpha)) == [want] and want > 0


def test_a_useless_drafter_is_switched_off_then_probed_again_as_evidence_fades() -> None:
    costs = Costs(c=0.05, v=tuple([1.0] * 16))
    p = GammaPolicy()
    p.set_offline("model", costs)
    acc = Acceptance(half_life=16)
    for _ in range(50):
        acc.update(4, 0)

    def step() -> int:
        acc.fade()
        g = p.choose([RowPlan("model", 4, True, acc.alpha)])[0]
        acc.mark(g)
        return g

    assert step() == 0
    for _ in range(200):
        if step() > 0:
            break
    else:
        pytest.fail("the faded evidence never let the drafter probe again")
    assert acc._last > 0
    assert Acceptance().mark(0) is False and acc.mark(0) is False and acc.mark(2) is True  # drafting after plain


def test_self_sizing_rows_get_their_cap_or_nothing() -> None:
    """A drafter that sizes its own trees is never shortened by the chain γ: alone it gets its cap
    (its own margin decides), in a batch its cap when the batch drafts and 0 when it does not."""
    p = GammaPolicy(max_gamma=8)
    p.set_offline("model", Costs(c=0.05, v=(1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.6)))
    lone = RowPlan("medusa", 7, True, 0.3, sizes_itself=True)
    assert p.choose([lone]) == [7]
    chain = RowPlan("model", 8, True, 0.3)
    assert p.choose([chain])[0] < 7  # the same α gives a chain row a short γ
    p = GammaPolicy(max_gamma=8)  # a batch: online costs only
    measured(p, 2, {w: 0.010 + 0.0005 * w for w in range(1, 10)}, draft_step=0.001)
    p.record_draft("medusa", 2, 1, 0.001)
    mixed = p.choose([RowPlan("model", 8, True, 0.9), RowPlan("medusa", 7, True, 0.9, sizes_itself=True)])
    assert 0 < mixed[0] and mixed[1] == 7
    useless = p.choose([RowPlan("model", 8, True, 0.0), RowPlan("medusa", 7, True, 0.0, sizes_itself=True)])
    assert useless == [0, 0]


# -- issue #30: live timings over cached ones, evidence per row, probes per request ------------------
def test_a_spike_of_load_never_sets_an_estimate() -> None:
    from specdecode.sizing.live import WINDOW, Timings

    t = Timings()
    for i in range(WINDOW - 1):
        t.add(0.010)
    t.add(0.336)  # one pass of a busy machine
    assert t.estimate == 0.010


def test_a_pessimistic_cached_c_is_tested_and_replaced_by_the_live_one() -> None:
    p = GammaPolicy()
    p.set_offline("model", Costs(c=1.5, v=tuple([1.0] * 16), key="k"))  # a cache written under load
    assert p.choose(plans(1, cap=8, alpha=0.8)) == [0]
    p.record_target(1, 1, 0.010)
    p.record_draft("model", 1, 1, 0.001)  # one probe's timing: c = 0.1 live
    assert p.choose(plans(1, cap=8, alpha=0.8))[0] > 0  # the cheaper figure counts until TRUST timings
    for _ in range(4):
        p.record_target(1, 1, 0.010)
        p.record_target(1, 5, 0.020)  # and verifying 5 tokens costs 2x, not the cached 1x
    for _ in range(4):
        p.record_draft("model", 1, 4, 0.004)
    refined = p.take_refined()
    assert set(refined) == {"model"} and refined["model"].c == pytest.approx(0.1) and refined["model"].key == "k"
    assert refined["model"].v[4] == pytest.approx(2.0) and refined["model"].v[3] == 1.0 and p.take_refined() == {}
    assert p.offline("model") == refined["model"]


def test_an_optimistic_cached_c_gives_way_to_trusted_live_timings() -> None:
    p = GammaPolicy()
    p.set_offline("model", Costs(c=0.01, v=tuple([1.0] * 16)))
    for _ in range(3):
        p.record_target(1, 1, 0.010)
        p.record_draft("model", 1, 1, 0.012)  # the draft really costs more than the target
    assert p.choose(plans(1, cap=8, alpha=0.8))[0] > 0  # not yet trusted: the cheaper figure
    p.record_draft("model", 1, 1, 0.012)
    assert p.choose(plans(1, cap=8, alpha=0.8)) == [0]


def test_a_rows_evidence_takes_the_drafters_history_as_a_bounded_prior() -> None:
    from specdecode.sizing.estimate import RowEvidence

    fresh = RowEvidence(Acceptance())
    assert fresh.alpha == pytest.approx(0.7)
    bad, good = Acceptance(), Acceptance()
    for _ in range(1000):
        bad.update(4, 0)
        good.update(4, 4)
    assert 0.5 < RowEvidence(bad).alpha < 0.7 < RowEvidence(good).alpha < 0.8
    row = RowEvidence(bad)
    for _ in range(3):
        row.update(4, 4)
    assert row.alpha > 0.8  # the request's own evidence dominates at once


def test_a_row_probes_on_its_own_schedule() -> None:
    from specdecode.sizing.estimate import PROBE_GAPS, RowEvidence

    row = RowEvidence(Acceptance())
    assert row.probe_due()  # its first pass, whatever came before
    row.step(3, probe=True)
    passes = []
    for k in range(200):
        if row.probe_due():
            passes.append(k)
            row.step(1, probe=True)
        else:
            row.step(0, probe=False)
    gaps = [b - a - 1 for a, b in zip([-1] + passes, passes)]
    assert gaps[:4] == [PROBE_GAPS[0] * PROBE_GAPS[1] ** i for i in range(4)]


def test_a_probe_drafts_what_a_fresh_drafter_would() -> None:
    p = GammaPolicy()
    p.set_offline("model", Costs(c=0.05, v=tuple([1.0] * 16)))
    fresh = p.choose(plans(1, cap=8, alpha=0.7))[0]
    assert fresh > 1 and p.probe_length(RowPlan("model", 8, True, 0.05), 0.7) == fresh
    p.set_offline("model", Costs(c=1.5, v=tuple([1.0] * 16)))
    assert p.probe_length(RowPlan("model", 8, True, 0.05), 0.7) == 1  # nothing pays: the cheapest probe


def test_load_inflated_widths_are_bounded_by_their_neighbours() -> None:
    from specdecode.sizing.costs import plausible

    measured_under_load = [1.0, 7.51, 2.28, 3.15, 1.0, 3.25, 3.25]  # a 3-sample minimum on a busy 2-core machine
    assert plausible(measured_under_load) == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0, 1.2, 1.4])
    assert plausible([1.0, 2.3, 2.4], fixed=[False, True, False]) == [1.0, 2.3, 2.4]  # live figures stay


def test_a_pessimistic_wide_width_is_still_tried() -> None:
    """A cache saying every pass over 5+ tokens costs 6x would keep γ ≤ 3 forever (those widths never
    run, so never get measured); bounded by the measured narrower widths, they get tried."""
    p = GammaPolicy()
    p.set_offline("model", Costs(c=0.02, v=(1.0, 1.0, 1.0, 1.0) + (6.0,) * 12))
    for _ in range(4):
        for w in (1, 2, 3, 4):
            p.record_target(1, w, 0.010)
    assert p.target_seconds(1, 5, "model") == pytest.approx(0.0125)  # at most 5/4 of the measured 4-token pass
    assert p.target_seconds(1, 9, "model") == pytest.approx(0.0225)
