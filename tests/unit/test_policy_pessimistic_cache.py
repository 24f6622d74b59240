"""A cost cache whose wider passes were timed under load (issue 49 item 6): the widths the live passes have
measured show how far the cache overstates, and the widths not yet run are scaled alike, so they get tried
(and so measured) instead of keeping γ at the one width the cache left cheap."""

from __future__ import annotations

import pytest

from specdecode.sizing.costs import Costs
from specdecode.sizing.live import TRUST, overstated
from specdecode.sizing.policy import GammaPolicy, RowPlan

QUIET_V = tuple(1.0 + 0.02 * k for k in range(16))  # the pair's real v(k): verification nearly flat
LOADED = Costs(c=0.05, v=(1.0,) + tuple(3.0 * x for x in QUIET_V[1:]))  # every width from 2 timed 3x slow
T1 = 0.002  # seconds of a one-token pass


def _quiet_passes(p: GammaPolicy, widths: range) -> None:
    for w in widths:
        for _ in range(TRUST):
            p.record_target(1, w, T1 * QUIET_V[w - 1])
    for _ in range(TRUST):
        p.record_draft("model", 1, 1, T1 * LOADED.c)


def test_the_median_overstatement_seen_scales_the_rest() -> None:
    assert overstated([1.0, 3.0, 3.3], [1.0, 1.1, None]) == pytest.approx(1.1 / 3.0)
    assert overstated([1.0, 1.0, 1.1], [1.0, 1.5, None]) == 1.0  # an optimistic cache is left as it is
    assert overstated([1.0, 3.0], [None, None]) == 1.0
    # one low reading among sound ones is noise, not an overstated cache; nor is a median within FOLLOW (10%)
    assert overstated([1.0, 1.2, 1.3, 1.4, 1.5], [1.0, 1.2, 1.3, 1.0, None]) == 1.0
    assert overstated([1.0, 1.2, 1.3], [1.0, 1.14, 1.24]) == 1.0
    assert overstated([1.0, 3.0, 3.0, 3.0], [1.0, 1.0, 1.5, 3.0]) == pytest.approx(0.5)


def test_untried_widths_follow_the_measured_ones() -> None:
    p = GammaPolicy()
    p.set_offline("model", LOADED)
    _quiet_passes(p, range(1, 3))  # what a core that drafted one token at a time has measured
    assert p.target_seconds(1, 6, "model") < 1.5 * T1  # not 3x: tried, so measured
    assert p.choose([RowPlan("model", 8, True, 0.8)])[0] > 1
    refined = p.take_refined()["model"]
    assert max(refined.v[:9]) < 1.5  # the cache file is rewritten with the untried widths scaled too


def test_a_sound_cache_is_unchanged_by_its_own_measurements() -> None:
    p = GammaPolicy()
    p.set_offline("model", Costs(c=0.05, v=QUIET_V))
    _quiet_passes(p, range(1, 3))
    assert p.target_seconds(1, 6, "model") == pytest.approx(T1 * QUIET_V[5])
    assert p.take_refined() == {}
