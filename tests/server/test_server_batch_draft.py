"""A DraftModelDrafter drafting for many rows at once proposes exactly what one per row proposes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from specdecode.config import SamplingConfig
from specdecode.draft import DraftContext
from specdecode.drafters import DraftModelDrafter
from specdecode.drafters.vocab import write_vocab_file
from specdecode.sampling import make_generator

from server_helpers import Models


@pytest.mark.parametrize("vocab", ["full", 100])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_drafts_equal_per_row_drafts(models: Models, temperature: float, vocab: object) -> None:
    rng = random.Random(0)
    sampling = SamplingConfig(temperature=temperature)
    prompts = [models.target.encode(p) for p in ("def fib(n):", "class Point:\n    def __init__", "x")]
    seqs = [list(p) for p in prompts]
    if vocab != "full":  # a ranking whose recommended cut is the whole vocabulary: other tests see no change
        V = models.draft.vocab_size
        write_vocab_file(models.draft.path, list(range(V))[::-1], np.ones(V), V, "test")
    batched = DraftModelDrafter(models.draft, gamma=8, vocab=vocab)  # type: ignore[arg-type]
    batched.prepare_rows(models.target, 4, 256)
    singles = [DraftModelDrafter(models.draft, gamma=8, vocab=vocab) for _ in prompts]  # type: ignore[arg-type]
    for d in singles:
        d.prepare(models.target)
    gens_b = [make_generator(i) for i in range(3)]
    gens_s = [make_generator(i) for i in range(3)]
    for step in range(12):
        # different lengths per row, some rows idle this step (γ = 0), like the scheduler's policy
        lengths = [rng.choice([0, 1, 2, 4]) for _ in seqs]
        contexts = {r: DraftContext(seqs[r], g, sampling, gens_b[r]) for r, g in enumerate(lengths) if g}
        got = batched.propose_rows(contexts)
        for r, g in enumerate(lengths):
            if not g:
                continue
            ref = singles[r].propose(DraftContext(seqs[r], g, sampling, gens_s[r]))
            assert got[r].tokens == ref.tokens, (step, r)
            if vocab != "full":  # the top 100 of the reversed ranking
                assert all(t >= models.draft.vocab_size - 100 for t in got[r].tokens)
            if temperature:
                assert got[r].probs is not None and ref.probs is not None
                assert (got[r].probs - ref.probs).abs().max() < 1e-5
            n = rng.randint(0, g)  # what a verifier might accept, then a correction token
            batched.on_verified_row(r, n)
            singles[r].on_verified(n)
            seqs[r] += ref.tokens[:n] + [rng.randrange(models.target.vocab_size)]
        if step == 5:  # a row leaves: the last row moves into its place, as in the scheduler
            kept = batched._n_cached[2]
            batched.move_row(2, 0)
            assert batched._cache is not None
            assert batched._n_cached[0] == batched._cache.lengths[0] == kept  # no re-prefill needed
            seqs[0], singles[0], gens_b[0], gens_s[0] = seqs[2], singles[2], gens_b[2], gens_s[2]
            seqs, singles, gens_b, gens_s = seqs[:2], singles[:2], gens_b[:2], gens_s[:2]
            assert batched._cache.lengths[2] == 0
