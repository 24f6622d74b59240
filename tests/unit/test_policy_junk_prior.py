"""A row's evidence under a reader's own prior (issue 49 item 6): a composite drafter (auto) that values each
member's drafts from the member's shared history let junk requests set a fresh request's starting α; a
``RowEvidence`` started from the reader's prior moves only by the bounded history weight, however bad the
history, and then follows the request's own evidence."""

from __future__ import annotations

import pytest

from specdecode.drafters.base import Acceptance
from specdecode.sizing.estimate import HISTORY_WEIGHT, RowEvidence

AUTO_PRIOR = (0.75, 6.0)  # (α, weight in judged tokens): what auto starts a member at


def _history(alpha_num: int, steps: int = 1000) -> Acceptance:
    """A drafter whose every step drafted 4 tokens and had ``alpha_num`` accepted."""
    a = Acceptance()
    for _ in range(steps):
        a.update(4, alpha_num)
    return a


def test_the_readers_prior_replaces_the_drafters() -> None:
    row = RowEvidence(Acceptance(), prior=AUTO_PRIOR)
    assert row.alpha == pytest.approx(0.75) and row.fresh_alpha == 0.75
    assert RowEvidence(Acceptance()).alpha == pytest.approx(0.7)  # without one: the drafter's own


def test_junk_history_moves_a_new_rows_start_by_the_history_weight_at_most() -> None:
    junk = _history(0)  # every draft rejected, for as long as the history remembers
    start = RowEvidence(junk, prior=AUTO_PRIOR).alpha
    worst = AUTO_PRIOR[0] * AUTO_PRIOR[1] / (AUTO_PRIOR[1] + HISTORY_WEIGHT)
    assert start == pytest.approx(worst)
    assert start > 0.9 * AUTO_PRIOR[0]  # within 10% of a fresh start
    assert junk.accepted / junk.evaluated == 0.0  # while the shared record itself is all rejections


def test_the_requests_own_evidence_then_decides() -> None:
    row = RowEvidence(_history(0), prior=AUTO_PRIOR)
    for _ in range(10):
        row.update(4, 4)
    assert row.alpha > 0.9
    row = RowEvidence(_history(4), prior=AUTO_PRIOR)  # a good history does not hide a bad request either
    for _ in range(20):
        row.update(4, 0)
    assert row.alpha < 0.3
