"""A draft restricted to its most frequent tokens (FR-Spec): the mapping, the file, the errors, exactness."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import specdecode as sd
from specdecode.config import ConfigError
from specdecode.sampling import make_generator
from specdecode.drafters.vocab import (VOCAB_FILE, DraftVocab, draft_vocab_for, parse_vocab_spec, rank_tokens,
                                       write_vocab_file)

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"


def ranked_draft(src: Path, dst: Path, size: int, seed: int = 0) -> Path:
    """A copy of ``src`` with a draft_vocab.json ranking every token (a random order; ``size`` = the cut)."""
    shutil.copytree(src, dst)
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    stream = np.random.default_rng(seed).integers(0, vocab, 5000)
    ranked, counts = rank_tokens(stream, vocab)
    write_vocab_file(dst, ranked, counts, size, "test")
    return dst


def test_expand_puts_subset_logits_in_place() -> None:
    v = DraftVocab(torch.tensor([1, 3]), torch.zeros(2, 4), vocab_size=5)
    full = v.expand(torch.tensor([2.0, 7.0]))
    assert full[1] == 2.0 and full[3] == 7.0
    assert torch.isinf(full[[0, 2, 4]]).all()
    batched = v.expand(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert batched.shape == (2, 5) and batched[1, 3] == 4.0


def test_rank_tokens_orders_by_frequency_then_id() -> None:
    ranked, counts = rank_tokens(np.array([2, 2, 2, 0, 0, 3]), 5)
    assert ranked == [2, 0, 3, 1, 4]
    assert counts.tolist() == [3, 2, 1, 0, 0]


@pytest.mark.parametrize("value,expected", [("auto", "auto"), ("FULL", "full"), ("64", 64), (12, 12), (None, "auto")])
def test_parse_vocab_spec(value: object, expected: object) -> None:
    assert parse_vocab_spec(value) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["0", "-3", "most", "1.5"])
def test_parse_vocab_spec_rejects(value: str) -> None:
    with pytest.raises(ConfigError, match="draft vocabulary"):
        parse_vocab_spec(value)


def test_file_is_optional_for_auto_but_required_for_a_size(tiny_dirs: dict[str, Path]) -> None:
    draft = sd.load_model(tiny_dirs["draft"])
    assert draft_vocab_for(draft, "auto") is None
    assert draft_vocab_for(draft, "full") is None
    with pytest.raises(ConfigError, match="specdecode draft-vocab"):
        draft_vocab_for(draft, 64)


def test_file_errors_name_the_fix(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    d = tmp_path / "draft"
    shutil.copytree(tiny_dirs["draft"], d)
    (d / VOCAB_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="malformed.*draft-vocab"):
        draft_vocab_for(sd.load_model(d), "auto")
    (d / VOCAB_FILE).write_text(json.dumps({"size": 2, "token_ids": [5, 10**6]}))
    with pytest.raises(ConfigError, match="outside the draft's vocabulary"):
        draft_vocab_for(sd.load_model(d), "auto")


def test_auto_uses_the_recommended_cut(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    draft = sd.load_model(ranked_draft(tiny_dirs["draft"], tmp_path / "d", size=64))
    v = draft_vocab_for(draft, "auto")
    assert v is not None and v.size == 64
    ranked = json.loads((tmp_path / "d" / VOCAB_FILE).read_text())["token_ids"]
    assert sorted(v.ids.tolist()) == sorted(ranked[:64])
    assert torch.equal(v.head, draft.output_matrix()[v.ids])
    assert draft_vocab_for(draft, 32).size == 32  # type: ignore[union-attr]
    assert draft_vocab_for(draft, 10**6) is None  # the whole vocabulary: no restriction


def test_restricted_logits_are_the_full_logits_at_those_tokens(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    draft = sd.load_model(ranked_draft(tiny_dirs["draft"], tmp_path / "d", size=64))
    v = draft_vocab_for(draft, "auto")
    assert v is not None
    ids = torch.tensor([draft.encode(PROMPT)])
    full = draft.forward(ids, draft.new_cache(1, 64))
    sub = draft.forward(ids, draft.new_cache(1, 64), head=v.head)
    assert sub.shape[-1] == 64
    assert torch.allclose(sub, full[..., v.ids], atol=1e-5)


@pytest.mark.parametrize("gamma", [1, 4, "auto"])
def test_restricted_draft_is_token_identical_to_plain(tiny_dirs: dict[str, Path], tmp_path: Path,
                                                     gamma: object) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    plain = sd.generate(target, PROMPT, max_new_tokens=24, ignore_eos=True)
    # self-speculation over a quarter of the vocabulary: many proposals agree, the rest are corrected
    own = sd.load_model(ranked_draft(tiny_dirs["llama"], tmp_path / "self", size=75))
    other = sd.load_model(ranked_draft(tiny_dirs["draft"], tmp_path / "other", size=75))
    for m in (own, other):
        drafter = sd.DraftModelDrafter(m, gamma=gamma, vocab="auto")  # type: ignore[arg-type]
        assert drafter.vocab is not None and drafter.vocab.size == 75
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=24, ignore_eos=True)
        assert r.token_ids == plain.token_ids
        proposed = [t for t, f in zip(r.token_ids, r.from_draft) if f]
        assert set(proposed) <= set(drafter.vocab.ids.tolist())


def test_sampled_proposals_stay_in_the_subset(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    draft = sd.load_model(ranked_draft(tiny_dirs["llama"], tmp_path / "self", size=75))
    drafter = sd.DraftModelDrafter(draft, gamma=3)
    drafter.prepare(target)
    ctx = sd.DraftContext(target.encode(PROMPT), 3, sd.SamplingConfig(temperature=1.0), make_generator(0))
    d = drafter.propose(ctx)
    assert d.probs is not None and d.probs.shape == (3, target.vocab_size)
    outside = torch.ones(target.vocab_size, dtype=torch.bool)
    outside[drafter.vocab.ids] = False  # type: ignore[union-attr]
    assert d.probs[:, outside].sum() == 0
    assert torch.allclose(d.probs.sum(-1), torch.ones(3))
