"""End to end: sampling with the int4 self-draft (``--drafter quant``) gives the target's exact law of the
first 3 tokens (dense target, and an int8 target whose law is its own quantized one); the same test
rejects another model's law."""

from __future__ import annotations

import itertools

import pytest
import torch
from tiny import build_model

import specdecode as sd
from specdecode.config import SamplingConfig
from specdecode.drafters.quant import QuantDrafter
from specdecode.sampling import probs_from_logits

from .chi2 import gof_pvalue
from .test_generate_law import PROMPT, N, V, exact_law

pytestmark = pytest.mark.slow  # full tier: make test-full


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[sd.Model, sd.Model, sd.Model]:
    root = tmp_path_factory.mktemp("quant-v8")
    path = build_model(root / "t", "llama", vocab_size=V, tokenizer=False, hidden=64, layers=1, seed=11)
    other = sd.load_model(build_model(root / "o", "llama", vocab_size=V, tokenizer=False, hidden=64, layers=1, seed=12))
    return sd.load_model(path), sd.load_model(path, weight_dtype="int8"), other


def cached_law(model: sd.Model, cfg: SamplingConfig) -> dict[tuple[int, ...], float]:
    """``exact_law`` through ``Model.forward`` (the path that multiplies by a quantized model's packed head)."""
    seqs = list(itertools.product(range(V), repeat=3))
    ids = torch.tensor([PROMPT + list(s) for s in seqs])
    logits = model.forward(ids, model.new_cache(len(seqs), 8))
    n = len(PROMPT)
    law = {}
    for row, s in enumerate(seqs):
        probs = probs_from_logits(logits[row, n - 1: n + 2], cfg)
        law[s] = float(probs[0, s[0]] * probs[1, s[1]] * probs[2, s[2]])
    return law


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)],
                         ids=["T1", "T0.8-k5-p0.9"])
@pytest.mark.parametrize("which", ["dense", "int8"])
def test_quant_drafter_law_matches_target(models: tuple[sd.Model, sd.Model, sd.Model], cfg: SamplingConfig,
                                          which: str) -> None:
    dense, q8, other = models
    target = dense if which == "dense" else q8
    drafter = QuantDrafter(gamma=2)
    samples, accepted = [], 0
    for seed in range(N):
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=3, temperature=cfg.temperature,
                        top_k=cfg.top_k, top_p=cfg.top_p, seed=seed, ignore_eos=True)
        samples.append(tuple(r.token_ids))
        accepted += sum(r.from_draft)
    assert accepted > N // 2  # the int4 copy's drafts really were accepted
    law = exact_law(target, cfg) if which == "dense" else cached_law(target, cfg)
    assert gof_pvalue(samples, law) > 1e-3
    assert gof_pvalue(samples, exact_law(other, cfg)) < 1e-6  # power: another model's law is rejected
