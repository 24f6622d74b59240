"""Metric arithmetic on hand-built traces, where τ, α̂ and the per-position counts are known."""

from __future__ import annotations

import math

import pytest

from specdecode.bench.stats import Counts, counts_from_steps, first_mismatch, mean_std

# γ = 4; passes accept 4 (all, + bonus), 2, 0, then one pass with no draft (e.g. no lookup match).
STEPS = [(4, 4), (4, 2), (4, 0), (0, 0)]
GENERATED = 5 + 3 + 1 + 1


def test_tau_alpha_and_positions() -> None:
    c = counts_from_steps(STEPS, GENERATED)
    assert c.passes == 4
    assert c.tau == pytest.approx(10 / 4)
    assert c.drafted == 12 and c.accepted == 6
    assert c.alpha_hat == pytest.approx(6 / 12)
    # judged tokens: 4 successes; 2 successes + 1 failure; 1 failure -> 6 / 8
    assert c.rejections == 2
    assert c.alpha_iid == pytest.approx(6 / 8)
    assert c.drafted_by_position == [3, 3, 3, 3]
    assert c.accepted_by_position == [2, 2, 1, 1]
    assert c.acceptance_by_position == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert c.draft_length_hist == [1, 0, 0, 0, 3]


def test_plain_decoding_trace() -> None:
    c = counts_from_steps([(0, 0)] * 7, 7)
    assert c.tau == 1.0 and c.alpha_hat == 0.0 and c.alpha_iid == 0.0 and c.acceptance_by_position == []


def test_variable_draft_lengths_and_merge() -> None:
    a = counts_from_steps([(2, 2), (1, 0)], 4)
    b = counts_from_steps([(3, 1)], 2)
    a.merge(b)
    assert (a.passes, a.generated, a.drafted, a.accepted, a.rejections) == (3, 6, 6, 3, 2)
    assert a.drafted_by_position == [3, 2, 1]
    assert a.accepted_by_position == [2, 1, 0]
    assert a.draft_length_hist == [0, 1, 1, 1]


def test_mean_pass_cost_uses_the_draft_length_histogram() -> None:
    c = counts_from_steps([(4, 4), (0, 0)], 6)
    v = {0: 1.0, 4: 2.0}
    # (4 * 0.1 + 2.0 + 0 + 1.0) / 2
    assert c.mean_pass_cost(0.1, v.__getitem__) == pytest.approx(1.7)


def test_impossible_step_is_rejected() -> None:
    with pytest.raises(ValueError):
        Counts().add_step(2, 3)


def test_mean_std_and_first_mismatch() -> None:
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2)))
    assert mean_std([5.0]) == (5.0, 0.0)
    assert all(math.isnan(x) for x in mean_std([]))
    assert first_mismatch([1, 2, 3], [1, 2, 3]) == -1
    assert first_mismatch([1, 2, 3], [1, 9, 3]) == 1
    assert first_mismatch([1, 2, 3], [1, 2]) == 2
