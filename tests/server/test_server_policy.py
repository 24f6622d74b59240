"""The speculation policy: draft only when the measured costs and acceptance say it pays."""

from __future__ import annotations

import pytest

from specdecode.server.scheduler import SpeculationPolicy, expected_tokens


@pytest.mark.parametrize("alpha,gamma,expected", [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.8, 2, 2.44), (0.6, 2, 1.96)])
def test_expected_tokens_is_the_papers_formula(alpha: float, gamma: int, expected: float) -> None:
    assert expected_tokens(alpha, gamma) == pytest.approx(expected)


def _measured(policy: SpeculationPolicy, batch: int, per_width: dict[int, float], draft_step: float) -> None:
    """Target pass costs per width, and the cost of one batched draft position for all ``batch`` rows."""
    for width, seconds in per_width.items():
        policy.record_target(batch, width, seconds)
    policy.record_draft("model", batch, 1, draft_step)


def test_drafting_pays_when_verification_is_cheap_and_drafts_are_accepted() -> None:
    p = SpeculationPolicy()
    _measured(p, 4, {1: 0.010, 2: 0.011, 3: 0.012, 4: 0.013, 5: 0.014}, draft_step=0.002)
    for _ in range(50):
        p.record_verify("model", 4, 4)
    assert p.choose([4] * 4, ["model"] * 4, [0.9] * 4) == [4] * 4


def test_no_drafting_when_acceptance_is_low() -> None:
    p = SpeculationPolicy()
    _measured(p, 4, {1: 0.010, 2: 0.011, 3: 0.012, 4: 0.013, 5: 0.014}, draft_step=0.002)
    assert p.choose([4] * 4, ["model"] * 4, [0.05] * 4) == [0] * 4


def test_no_drafting_when_a_wide_batch_costs_too_much() -> None:
    # at batch 16 the pass costs ~T times one token (compute-bound): even α = 0.7 loses
    p = SpeculationPolicy()
    _measured(p, 16, {w: 0.010 * w for w in range(1, 6)}, draft_step=0.004)
    assert p.choose([4] * 16, ["model"] * 16, [0.7] * 16) == [0] * 16
    # ...while at batch 1 with a flat cost the same acceptance pays
    _measured(p, 1, {w: 0.010 for w in range(1, 6)}, draft_step=0.001)
    assert p.choose([4], ["model"], [0.7])[0] > 0


def test_unmeasured_widths_are_tried_once() -> None:
    p = SpeculationPolicy()
    p.record_target(2, 1, 0.010)  # only plain decoding measured: wider passes get the same lower bound
    assert p.choose([4, 4], ["model"] * 2, [0.8, 0.8]) == [4, 4]


def test_probe_drafts_one_token_for_one_row_every_interval() -> None:
    p = SpeculationPolicy(probe_interval=5)
    _measured(p, 3, {1: 0.010, 2: 0.011, 3: 0.012}, draft_step=0.001)  # would pay if drafts were accepted
    picks = [p.choose([2, 0, 2], ["model", "none", "model"], [0.01] * 3) for _ in range(10)]
    assert picks[:4] == [[0, 0, 0]] * 4 and picks[5:9] == [[0, 0, 0]] * 4
    assert sorted([picks[4], picks[9]]) == [[0, 0, 1], [1, 0, 0]]  # round robin over rows that can draft


def test_no_probe_where_even_perfect_drafts_cannot_pay() -> None:
    # 16 rows, compute-bound: a width-w pass costs w times one token, so no acceptance rate repays it
    p = SpeculationPolicy(probe_interval=3)
    _measured(p, 16, {w: 0.010 * w for w in range(1, 4)}, draft_step=0.004)
    assert all(p.choose([2] * 16, ["model"] * 16, [0.01] * 16) == [0] * 16 for _ in range(12))
    # an unmeasured width could still pay: then the probe runs
    q = SpeculationPolicy(probe_interval=3)
    _measured(q, 16, {1: 0.010, 2: 0.020}, draft_step=0.004)
    assert any(sum(q.choose([3] * 16, ["model"] * 16, [0.01] * 16)) for _ in range(6))


def test_rows_without_drafter_or_room_never_draft() -> None:
    p = SpeculationPolicy("always")
    assert p.choose([0, 0], ["none", "none"], [0.5, 0.5]) == [0, 0]
    assert p.choose([0, 3], ["none", "model"], [0.5, 0.5]) == [0, 3]


def test_row_alpha_blends_the_request_with_its_drafter_kind() -> None:
    p = SpeculationPolicy(prior_weight=8)
    for _ in range(200):
        p.record_verify("ngram", 4, 0)
    assert p.kind_alpha("ngram") < 0.05
    assert p.row_alpha("ngram", 0, 0) == pytest.approx(p.kind_alpha("ngram"))
    assert p.row_alpha("ngram", 90, 10) > 0.8


def test_noise_cannot_make_a_wider_pass_look_cheaper() -> None:
    p = SpeculationPolicy()
    p.record_target(1, 1, 0.010)
    p.record_target(1, 5, 0.004)  # a lucky measurement
    assert p.target_seconds(1, 5) == 0.010
    p.record_draft("ngram", 1, 4, 0.0004)
    assert p.choose([4], ["ngram"], [0.01]) == [0]


def test_a_batched_draft_costs_per_position_not_per_row() -> None:
    # one batched draft forward for 16 rows takes 2 ms: drafting 4 deep costs 8 ms, not 16 x 8 ms
    p = SpeculationPolicy()
    _measured(p, 16, {w: 0.010 for w in range(1, 6)}, draft_step=0.002)
    assert p.draft_seconds("model", 16) == 0.002 and p.draft_seconds("model", 32) == 0.002
    assert p.draft_seconds("model", 8) == 0.0  # unmeasured smaller batch: optimistic until measured
    assert p.choose([4] * 16, ["model"] * 16, [0.8] * 16) == [4] * 16
