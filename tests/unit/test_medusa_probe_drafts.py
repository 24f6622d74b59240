"""Medusa out of a pessimistic cost cache (issue 49: Medusa and Medusa-chain drafted 0 tokens on SmolLM2 with
any γ). A cache timed under load overstates v(n) of the wide passes; while nothing drafts, no wide pass runs,
so no live timing ever corrects it. With measured costs a probe therefore drafts, at one size, so that width
gets timed (``sizing.live.TRUST`` passes) and ``refine_costs`` brings drafting back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdecode.config import SamplingConfig
from specdecode.sizing.costs import Costs
from specdecode.draft import DraftContext
from specdecode.drafters.medusa import PROBE_FIRST, MedusaDrafter
from specdecode.models import load_model

from medusa_util import make_heads


def _overstated(measured: Costs) -> Costs:
    """The measured figures with every pass wider than one token 50x dearer (a cache timed under load)."""
    return Costs(c=measured.c, v=(1.0,) + tuple(50.0 * x for x in measured.v[1:]))


@pytest.mark.parametrize("tree", [True, False], ids=["tree", "chain"])
def test_probes_draft_one_size_and_live_passes_bring_drafting_back(
        tmp_path: Path, tiny_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tree: bool) -> None:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    target = load_model(tiny_dirs["llama"])
    d = MedusaDrafter.load(make_heads(tmp_path / "h", target.config.dim, target.vocab_size))
    d.tree = tree
    d.prepare(target)  # measures its costs: the mode whose figures live timings correct
    assert d.costs is not None
    d._costs = _overstated(d.costs)  # as if read from a cache timed under load
    ctx = DraftContext([1, 2, 3], 4, SamplingConfig(), None, hidden=torch.randn(1, target.config.dim))
    sizes = {step: len(d.propose_rows({0: ctx})[0].tokens) for step in range(1, 8 * PROBE_FIRST)}
    probes = {step: n for step, n in sizes.items() if n}
    assert sorted(probes) == [PROBE_FIRST, 3 * PROBE_FIRST, 7 * PROBE_FIRST]  # only probes draft, ever rarer
    assert len(set(probes.values())) == 1  # one width, so its live timing gets trusted
    # the core's trusted live passes: that width costs what a one-token pass does
    width = next(iter(probes.values())) + 1
    d.refine_costs({1: 1e-3, width: 1e-3})
    assert d.costs is not None and d.costs.v[width - 1] == pytest.approx(1.0)
    assert len(d.propose_rows({0: ctx})[0].tokens) > 0  # drafting again at once, not at the next probe


def test_fixed_costs_probe_the_heads_without_drafting(tmp_path: Path, tiny_dirs: dict[str, Path]) -> None:
    """Costs given (tests, ablations) are kept: nothing to re-time, so a probe only reads the heads."""
    target = load_model(tiny_dirs["llama"])
    steep = Costs(c=5.0, v=(1.0,) + (50.0,) * 63)
    d = MedusaDrafter.load(make_heads(tmp_path / "h", target.config.dim, target.vocab_size), costs=steep)
    d.prepare(target)
    ctx = DraftContext([1, 2, 3], 4, SamplingConfig(), None, hidden=torch.randn(1, target.config.dim))
    assert sum(len(d.propose_rows({0: ctx})[0].tokens) for _ in range(4 * PROBE_FIRST)) == 0
