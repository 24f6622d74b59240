"""KV cache bookkeeping and drafter behaviour without a target pass."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import specdecode as sd
from specdecode.cache import ContextLengthError, KVCache
from specdecode.config import SamplingConfig
from specdecode.draft import DraftContext


def test_cache_trim_and_context_limit() -> None:
    c = KVCache(1, 2, 1, 8, 4, torch.float32, "cpu")
    meta = c.prepare(5)
    c.commit(meta)
    assert c.lengths == [5, 5]
    assert c.trim(2, row=1) == 3
    meta = c.prepare(2)  # rows at 5 and 3: non-contiguous write, causal mask per row
    assert not meta.contiguous and meta.mask is not None and meta.mask.shape == (2, 1, 2, 7)
    assert meta.positions.tolist() == [[5, 6], [3, 4]]
    with pytest.raises(ValueError, match="cannot trim 9"):
        c.trim(9)
    with pytest.raises(ContextLengthError, match="exceeds the context window of 8"):
        c.prepare(4)


def test_cache_repeat_to_repeats_a_rows_entries_in_order() -> None:
    c = KVCache(2, 2, 1, 8, 4, torch.float32, "cpu")
    c.k[:, 1, :, :3] = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 1, 3, 4)
    c.v[:, 1, :, :3] = -c.k[:, 1, :, :3]
    c.lengths[1] = 3
    c.repeat_to(7, row=1)
    assert c.lengths == [0, 7]
    assert torch.equal(c.k[:, 1, :, 3:6], c.k[:, 1, :, :3]) and torch.equal(c.k[:, 1, :, 6], c.k[:, 1, :, 0])
    assert torch.equal(c.v[:, 1, :, :7], -c.k[:, 1, :, :7]) and c.k[:, 0].abs().sum() == 0  # the other row untouched
    with pytest.raises(ValueError, match="cannot repeat row 0's 0 entries"):
        c.repeat_to(4, row=0)
    with pytest.raises(ValueError, match="room for 8"):
        c.repeat_to(9, row=1)


def ctx(tokens: list[int], max_tokens: int = 10) -> DraftContext:
    return DraftContext(tokens, max_tokens, SamplingConfig(), None)


def test_prompt_lookup_proposes_continuation_of_latest_match() -> None:
    d = sd.PromptLookupDrafter(max_ngram=2, num_draft_tokens=3)
    assert d.propose(ctx([1, 2, 3, 4, 9, 1, 2, 7, 8, 1, 2])).tokens == [7, 8, 1]
    d.reset()
    assert d.propose(ctx([5, 6, 7])).tokens == []  # no earlier occurrence of anything
    d.reset()
    assert d.propose(ctx([1, 2, 3, 4, 1, 2], max_tokens=1)).tokens == [3]


def test_prompt_lookup_tracks_a_growing_sequence() -> None:
    d = sd.PromptLookupDrafter(max_ngram=1, num_draft_tokens=2)
    seq = [4, 5, 6, 4]
    assert d.propose(ctx(seq)).tokens == [5, 6]
    seq += [5, 9, 5]
    assert d.propose(ctx(seq)).tokens == [9, 5]
    seq = [4] * 3000  # longer than the initial buffer
    d.reset()
    assert d.propose(ctx(seq)).tokens == [4, 4]


def _lookup_by_rule(seq: list[int], max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """The documented rule, by brute force: for n from max_ngram down, the latest earlier n-gram equal
    to the sequence's last n tokens that still has k tokens after it, else the latest one; what follows it."""
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        starts = [i for i in range(len(seq) - n) if seq[i:i + n] == seq[len(seq) - n:]]
        if starts:
            full = [i for i in starts if i + n + k <= len(seq)]
            start = (full or starts)[-1] + n
            return seq[start:start + k]
    return []


def test_prompt_lookup_follows_its_rule_on_random_sequences() -> None:
    rng = random.Random(0)
    for trial in range(400):
        vocab = rng.choice([2, 3, 5, 20])  # small vocabularies: many overlapping matches of every length
        seq = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        max_ngram = rng.randint(1, 4)
        min_ngram = rng.randint(1, max_ngram)
        k = rng.randint(1, 6)
        d = sd.PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram, num_draft_tokens=k)
        assert d.propose(ctx(seq)).tokens == _lookup_by_rule(seq, max_ngram, min_ngram, k), (trial, seq)
    d = sd.PromptLookupDrafter()
    assert d.propose(ctx([])).tokens == [] and d.propose(ctx([7])).tokens == []


def test_draft_model_cache_stays_in_sync(tiny_dirs: dict[str, Path]) -> None:
    """After any acceptance pattern the draft's cache equals a fresh prefill of the same tokens."""
    draft = sd.load_model(tiny_dirs["draft"])
    target = sd.load_model(tiny_dirs["llama"])
    d = sd.DraftModelDrafter(draft, gamma=3)
    d.prepare(target)
    seq = [5, 6, 7]
    for n_acc, correction in [(0, 11), (3, 12), (1, 13), (2, 14)]:
        prop = d.propose(ctx(seq))
        d.on_verified(n_acc)
        seq = seq + prop.tokens[:n_acc] + [correction]
        fresh = sd.DraftModelDrafter(draft, gamma=3)
        fresh.prepare(target)
        assert d.propose(ctx(seq)).tokens == fresh.propose(ctx(seq)).tokens
        d.on_verified(0)
