"""A user who asks for Medusa where its heads do not pay learns why nothing was drafted: one log line, once
per target, with the predicted speed against the margin and what the heads cost (issue 49: Medusa and
Medusa-chain drafted 0 tokens on SmolLM2 with no word of why)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from specdecode.config import SamplingConfig
from specdecode.sizing.costs import Costs
from specdecode.draft import DraftContext
from specdecode.drafters.medusa import MedusaDrafter
from specdecode.models import load_model

from medusa_util import FLAT, make_heads

STEEP = Costs(c=5.0, v=(1.0,) + (50.0,) * 63)  # every node dearer than it can pay
SAYS = "drafting nothing for now"


def _propose(tmp_path: Path, tiny_dirs: dict[str, Path], costs: Costs, tree: bool, steps: int) -> int:
    """Drafted tokens over ``steps`` proposals of one row."""
    target = load_model(tiny_dirs["llama"])
    d = MedusaDrafter.load(make_heads(tmp_path / "h", target.config.dim, target.vocab_size), costs=costs)
    d.tree = tree
    d.prepare(target)
    ctx = DraftContext([1, 2, 3], 4, SamplingConfig(), None, hidden=torch.randn(1, target.config.dim))
    return sum(len(d.propose_rows({0: ctx})[0].tokens) for _ in range(steps))


@pytest.mark.parametrize("tree, name", [(True, "medusa"), (False, "medusa-chain")])
def test_heads_that_do_not_pay_say_why_once(tmp_path: Path, tiny_dirs: dict[str, Path],
                                            caplog: pytest.LogCaptureFixture, tree: bool, name: str) -> None:
    with caplog.at_level(logging.INFO, logger="specdecode.drafters.medusa"):
        drafted = _propose(tmp_path, tiny_dirs, STEEP, tree, 40)  # past several probes of the heads
    said = [r.getMessage() for r in caplog.records if SAYS in r.getMessage()]
    assert drafted == 0
    assert len(said) == 1, said
    line = said[0]
    assert line.startswith(f"{name}: ")
    assert "plain decoding" in line and "1.08x speculation needs" in line  # the prediction against the margin
    assert "the heads cost 5.00 of a target pass" in line  # and the cost that makes it lose


def test_heads_that_pay_say_nothing_of_the_kind(tmp_path: Path, tiny_dirs: dict[str, Path],
                                                caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="specdecode.drafters.medusa"):
        drafted = _propose(tmp_path, tiny_dirs, FLAT, True, 5)
    assert drafted > 0
    assert not [r for r in caplog.records if SAYS in r.getMessage()]
