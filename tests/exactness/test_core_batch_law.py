"""The batched decode core (what the server runs) keeps the target's exact law in every row.

Rows of one batch draft different lengths (so passes are padded), rows come and go, and each row
samples with its own generator: the law of each row's first 3 tokens must still be the target's."""

from __future__ import annotations

import pytest

import specdecode as sd
from specdecode.config import GenerationConfig, SamplingConfig, VerifyConfig
from specdecode.core import DecodeCore
from specdecode.rows import FinishEvent, Request

from .chi2 import gof_pvalue
from .test_generate_law import N, PROMPT, exact_law, models  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow  # full tier: make test-full


@pytest.mark.parametrize("rule", ["rejection", "coupled"])
def test_batched_rows_follow_the_target_law(models: tuple[sd.Model, sd.Model], rule: str) -> None:  # noqa: F811
    target, draft = models
    cfg = SamplingConfig(temperature=1.0)
    drafters = {"model": sd.DraftModelDrafter(draft, gamma=3),
                "ngram": sd.drafters.build_drafter("ngram",
                                                   sd.drafters.DrafterOptions(gamma=2, options={"ngram_max": 1}))}
    core = DecodeCore(target, drafters, max_rows=4, context_len=16)
    generation = GenerationConfig(max_new_tokens=3, ignore_eos=True)
    # per row slot: (drafter, gamma); row 3 decodes plainly beside the drafting rows
    kinds = [("model", 3), ("model", 1), ("ngram", 2), (None, None)]
    samples: list[tuple[int, ...]] = []
    seed = 0
    while len(samples) < N:
        while len(core.rows) < 4:  # refill: rows join a batch that is already running
            kind, gamma = kinds[seed % 4]
            core.add(Request(PROMPT, SamplingConfig(temperature=1.0, seed=seed), generation, kind, gamma,
                             verify=VerifyConfig(accept_rule=rule)))
            seed += 1
        for _, ev in core.step():
            if isinstance(ev, FinishEvent):
                samples.append(tuple(ev.token_ids))
    assert gof_pvalue(samples, exact_law(target, cfg)) > 1e-3
    assert gof_pvalue(samples, exact_law(draft, cfg)) < 1e-6  # the test has power


@pytest.mark.parametrize("width", [1, 4])
def test_a_row_samples_the_same_tokens_alone_or_in_a_batch(models: tuple[sd.Model, sd.Model], width: int) -> None:  # noqa: F811
    """A seeded row (the coupled rule by default; its draws depend on nothing but seed and position)
    writes the same tokens alone or beside other rows."""
    target, draft = models
    generation = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    core = DecodeCore(target, {"model": sd.DraftModelDrafter(draft, gamma=2)}, max_rows=width, context_len=16)
    rows = [core.add(Request(PROMPT, SamplingConfig(temperature=1.0, seed=7 + i), generation, "model"))
            for i in range(width)]
    done = {}
    while core.rows:
        for row, ev in core.step():
            if isinstance(ev, FinishEvent):
                done[id(row)] = ev.token_ids
    for i, row in enumerate(rows):
        alone = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=2), max_new_tokens=6,
                            temperature=1.0, seed=7 + i, ignore_eos=True)
        assert done[id(row)] == alone.token_ids
