"""The one γ policy: draft only when the measured costs and acceptance say it pays, at any batch width."""

from __future__ import annotations

import pytest

from specdecode.costmodel import Costs, expected_tokens
from specdecode.drafters.base import Acceptance
from specdecode.policy import GammaPolicy, RowPlan


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
