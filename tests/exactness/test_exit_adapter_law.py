"""Sampling with an exit adapter: the law of the first 3 tokens of generate() is the target's exact law.

The draft is the target's first layers plus the adapter, its cache the target's; whatever the adapter
computes, the law each token was drawn from goes into ``Draft.probs`` and verification makes the output
exact. The same samples are tested against the draft's own law (computed here by enumeration), which
the test must reject, so it has power.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import specdecode as sd
from specdecode.config import SamplingConfig
from specdecode.drafters.exit_adapter import ExitAdapter, ExitAdapterConfig, ExitAdapterDrafter
from specdecode.sampling import probs_from_logits
from specdecode.train.early_exit import adapter_train_logits
from tiny import build_model

from .chi2 import gof_pvalue
from .test_layerskip_law import exact_law

pytestmark = pytest.mark.slow  # full tier: make test-full

V, N, PROMPT, EXIT = 8, 2500, [1, 2], 1


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> sd.Model:
    root = tmp_path_factory.mktemp("ea8")
    return sd.load_model(build_model(root / "t", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=3, seed=31))


def make_adapter(target: sd.Model, vocab: int) -> ExitAdapter:
    """A random adapter layer proposing from the first ``vocab`` tokens."""
    g = torch.Generator().manual_seed(5)
    a = ExitAdapter(ExitAdapterConfig.for_target(target, EXIT, 12, vocab), torch.arange(vocab), target.max_seq_len)
    with torch.no_grad():
        for p in (a.block.wo, a.block.w2):
            p.copy_(torch.randn(p.shape, generator=g))
    return a.eval().requires_grad_(False)


def draft_law(model: sd.Model, adapter: ExitAdapter, cfg: SamplingConfig) -> dict[tuple[int, ...], float]:
    """The draft's own law of all V^3 continuations: the first EXIT layers, then the adapter layer."""
    seqs = list(itertools.product(range(V), repeat=3))
    ids = torch.tensor([PROMPT + list(s) for s in seqs])
    n_prop = len(adapter.vocab_ids)
    with torch.inference_mode():
        out = model.run(ids, model.new_cache(len(seqs), ids.shape[1]), hidden_layers=(EXIT - 1,))
        restricted = adapter_train_logits(model, adapter, out.layers[EXIT - 1], model.output_matrix()[:n_prop].float())
    logits = torch.full((len(seqs), ids.shape[1], V), float("-inf"))
    logits[..., :n_prop] = restricted
    n = len(PROMPT)
    law = {}
    for row, s in enumerate(seqs):
        probs = probs_from_logits(logits[row, n - 1 : n + 2], cfg)
        law[s] = float(probs[0, s[0]] * probs[1, s[1]] * probs[2, s[2]])
    return law


@pytest.mark.parametrize("cfg,rule,vocab", [
    (SamplingConfig(temperature=1.0), "block", V),
    (SamplingConfig(temperature=0.8, top_k=5, top_p=0.9), "token", 6),
], ids=["T1-block-full-vocab", "T0.8-k5-p0.9-token-6-of-8"])
def test_exit_adapter_law_matches_target(target: sd.Model, cfg: SamplingConfig, rule: str, vocab: int) -> None:
    adapter = make_adapter(target, vocab)
    drafter = ExitAdapterDrafter(adapter, gamma=2)
    samples, drafted = [], 0
    for seed in range(N):
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=3, temperature=cfg.temperature,
                        top_k=cfg.top_k, top_p=cfg.top_p, seed=seed, ignore_eos=True, chain_rule=rule,
                        accept_rule="rejection")
        samples.append(tuple(r.token_ids))
        drafted += r.stats.drafted
    assert drafted > N  # speculation really ran
    assert gof_pvalue(samples, exact_law(target, cfg)) > 1e-3
    law = draft_law(target, adapter, cfg)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-4)
    assert gof_pvalue(samples, law) < 1e-6  # the draft's own law: rejected
