"""End to end: the law of the first 3 tokens of generate() with a draft equals the target's exact law."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import specdecode as sd
from specdecode.config import SamplingConfig
from specdecode.drafters.vocab import write_vocab_file
from specdecode.sampling import probs_from_logits
from tiny import build_model

from .chi2 import gof_pvalue

pytestmark = pytest.mark.slow  # full tier: make test-full

V, N, PROMPT = 8, 2500, [1, 2]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[sd.Model, sd.Model]:
    root = tmp_path_factory.mktemp("v8")
    target = sd.load_model(build_model(root / "t", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=1,
                                       seed=11))
    draft = sd.load_model(build_model(root / "d", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=1, seed=12))
    return target, draft


def exact_law(model: sd.Model, cfg: SamplingConfig) -> dict[tuple[int, ...], float]:
    """Enumerate all V^3 continuations and multiply the filtered conditionals (one batched pass)."""
    seqs = list(itertools.product(range(V), repeat=3))
    ids = torch.tensor([PROMPT + list(s) for s in seqs])
    with torch.inference_mode():
        logits = model.module(ids).float()  # no cache: full causal pass
    n = len(PROMPT)
    law = {}
    for row, s in enumerate(seqs):
        probs = probs_from_logits(logits[row, n - 1 : n + 2], cfg)
        law[s] = float(probs[0, s[0]] * probs[1, s[1]] * probs[2, s[2]])
    return law


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)],
                         ids=["T1", "T0.8-k5-p0.9"])
@pytest.mark.parametrize("chain_rule", ["block", "token"])
def test_generate_law_matches_target(models: tuple[sd.Model, sd.Model], cfg: SamplingConfig, chain_rule: str) -> None:
    target, draft = models
    drafter = sd.DraftModelDrafter(draft, gamma=2)
    samples = []
    for seed in range(N):
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=3, temperature=cfg.temperature,
                        top_k=cfg.top_k, top_p=cfg.top_p, seed=seed, ignore_eos=True, chain_rule=chain_rule,
                        accept_rule="rejection")
        samples.append(tuple(r.token_ids))
    assert gof_pvalue(samples, exact_law(target, cfg)) > 1e-3
    # the same test rejects the draft's law: it has power
    assert gof_pvalue(samples, exact_law(draft, cfg)) < 1e-6


def test_restricted_vocabulary_draft_law_matches_target(models: tuple[sd.Model, sd.Model]) -> None:
    """A draft that may only propose 4 of the 8 tokens (FR-Spec): its law q is zero elsewhere, and the
    output must still follow the target's law, including tokens the draft can never propose."""
    target, draft = models
    write_vocab_file(draft.path, [5, 1, 6, 2, 0, 3, 4, 7], np.ones(V), V, "test")  # auto stays the full vocabulary
    drafter = sd.DraftModelDrafter(draft, gamma=2, vocab=4)
    assert drafter.vocab is not None and sorted(drafter.vocab.ids.tolist()) == [1, 2, 5, 6]
    cfg = SamplingConfig(temperature=1.0)
    samples = [tuple(sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=3, temperature=1.0, seed=s,
                                 ignore_eos=True, accept_rule="rejection").token_ids) for s in range(N)]
    assert any(t in (0, 3, 4, 7) for s in samples for t in s)
    assert gof_pvalue(samples, exact_law(target, cfg)) > 1e-3
    assert gof_pvalue(samples, exact_law(draft, cfg)) < 1e-6


def test_prompt_lookup_law_matches_target(models: tuple[sd.Model, sd.Model]) -> None:
    target, _ = models
    cfg = SamplingConfig(temperature=1.0)
    drafter = sd.PromptLookupDrafter(max_ngram=1, num_draft_tokens=2)
    prompt = [1, 2, 1, 2, 1, 2]
    samples = [tuple(sd.generate(target, prompt, drafter=drafter, max_new_tokens=3, temperature=1.0, seed=s,
                                 ignore_eos=True, accept_rule="rejection").token_ids) for s in range(N)]
    seqs = list(itertools.product(range(V), repeat=3))
    with torch.inference_mode():
        logits = target.module(torch.tensor([prompt + list(s) for s in seqs])).float()
    n = len(prompt)
    law = {}
    for row, s in enumerate(seqs):
        probs = probs_from_logits(logits[row, n - 1 : n + 2], cfg)
        law[s] = float(probs[0, s[0]] * probs[1, s[1]] * probs[2, s[2]])
    assert gof_pvalue(samples, law) > 1e-3
