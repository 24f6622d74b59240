"""ConstraintState: the mask, the draft stack, and how drafts are cut (constraints.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llguidance")

from specdecode.config import ConfigError
from specdecode.constraints import (Constraint, ConstraintSpec, spec_from_args, spec_from_files, token_list_tokenizer)
from specdecode.draft import Draft

TOKENS = [b"<eos>", b"a", b"b", b"c", b"ab", b"ca", b"x", b"bb"]
A, B, C, AB, CA, X, BB, EOS = 1, 2, 3, 4, 5, 6, 7, 0


def state(regex: str = r"a[ab]*c|b"):  # type: ignore[no-untyped-def]
    return Constraint(ConstraintSpec("regex", regex), token_list_tokenizer(TOKENS, EOS), len(TOKENS)).start()


def ids(mask: torch.Tensor) -> list[int]:
    return [i for i, m in enumerate(mask.tolist()) if m]


def test_mask_push_rollback_commit() -> None:
    s = state()
    assert ids(s.allowed()) == [A, B, AB]
    assert not s.push(X) and ids(s.allowed()) == [A, B, AB]  # a refused push changes nothing
    assert s.push(A) and ids(s.allowed()) == [A, B, C, AB, BB]
    assert s.push(C) and ids(s.allowed()) == [EOS]  # complete: EOS only
    assert s.push(EOS) and s.done and ids(s.allowed()) == [EOS]  # past the end: EOS only, by convention
    s.rollback(2)
    assert not s.done and ids(s.allowed()) == [A, B, C, AB, BB]
    s.rollback()
    assert ids(s.allowed()) == [A, B, AB]
    s.commit([AB, B])
    assert ids(s.allowed()) == [A, B, C, AB, BB]
    with pytest.raises(RuntimeError, match="forbids"):
        s.commit([X])


def test_forced_tokens() -> None:
    s = state(r"abab[ab]")
    forced = s.forced(8)
    # "abab" is forced; llguidance keeps back the last token whose split could merge with what follows
    assert forced == [AB] and s.forced(0) == []
    s.commit([AB, AB])
    assert s.forced(8) == [] and ids(s.allowed()) == [A, B]


def test_check_draft_cuts_chains_exactly() -> None:
    s = state()
    probs = torch.full((4, len(TOKENS)), 1 / len(TOKENS))
    # a stochastic draft keeps its first forbidden token (rejected for sure) and drops the rest
    d, masks = s.check_draft(Draft([A, B, X, C], probs))
    assert d.tokens == [A, B, X] and d.probs is not None and d.probs.shape[0] == 3 and masks.shape[0] == 4
    assert ids(masks[0]) == [A, B, AB] and not masks[3, X]
    assert ids(masks[3]) == [EOS]  # never used: the position after a token that is surely rejected
    # a deterministic draft (no laws) stops before it
    d, masks = s.check_draft(Draft([A, B, X, C]))
    assert d.tokens == [A, B] and masks.shape[0] == 3
    # an allowed draft is untouched, and the state is back where it was
    draft = Draft([A, C, EOS])
    d, masks = s.check_draft(draft)
    assert d is draft and [ids(m) for m in masks] == [[A, B, AB], [A, B, C, AB, BB], [EOS], [EOS]]
    assert ids(s.allowed()) == [A, B, AB]


def test_check_draft_prunes_trees() -> None:
    s = state()
    # root children: A (ok), X (forbidden, its child dropped too), B (ok); A's children: C (ok), CA (forbidden)
    d, masks = s.check_draft(Draft([A, X, B, C, C, CA], None, [-1, -1, -1, 0, 1, 0]))
    assert d.tokens == [A, B, C] and d.parents == [-1, -1, 0]
    assert [ids(m) for m in masks] == [[A, B, AB], [A, B, C, AB, BB], [EOS], [EOS]]
    d, _ = s.check_draft(Draft([A, B], torch.full((2, len(TOKENS)), 0.125), [-1, -1]))
    assert d.tokens == []  # a sampled tree is not verified under a grammar


def test_drafter_mask_is_never_empty() -> None:
    s = state()
    logits = torch.full((len(TOKENS),), float("-inf"))
    logits[X] = 0.0  # a restricted draft vocabulary with nothing the grammar allows
    out = s.mask(logits)
    assert ids(torch.isfinite(out)) == [A, B, AB]


def test_spec_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="invalid JSON schema"):
        spec_from_args(json_schema={"type": "bogus"})
    with pytest.raises(ConfigError, match="not valid JSON"):
        spec_from_args(json_schema="{nope")
    with pytest.raises(ConfigError, match="invalid grammar"):
        spec_from_args(grammar="start: (")
    with pytest.raises(ConfigError, match="constraint kind"):
        ConstraintSpec("xml")
    with pytest.raises(ConfigError, match="--grammar"):
        spec_from_files(None, None, str(tmp_path / "missing.lark"))
    assert spec_from_args() is None
