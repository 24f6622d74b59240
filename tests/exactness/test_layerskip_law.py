"""Sampling with a layer-skip draft: the law of the first 3 tokens of generate() is the target's exact law.

The draft is the target's own module over some layers, its cache partly the target's; whatever it
computes, the law it drew each token from goes into ``Draft.probs`` and verification makes the output
exact. The same test rejects the draft's own law (computed here by enumeration too), so it has power.
"""

from __future__ import annotations

import itertools
from typing import Optional

import pytest
import torch

import specdecode as sd
from specdecode.config import SamplingConfig
from specdecode.drafters.layerskip import LayerSkipDrafter
from specdecode.sampling import probs_from_logits
from tiny import build_model

from .chi2 import gof_pvalue

pytestmark = pytest.mark.slow  # full tier: make test-full

V, N, PROMPT = 8, 2500, [1, 2]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> sd.Model:
    root = tmp_path_factory.mktemp("ls8")
    return sd.load_model(build_model(root / "t", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=3, seed=31))


def exact_law(model: sd.Model, cfg: SamplingConfig, layers: Optional[tuple[int, ...]] = None
              ) -> dict[tuple[int, ...], float]:
    """All V^3 continuations, each the product of its filtered conditionals (one cache-free pass; with
    ``layers``, the partial model's law: the draft's)."""
    seqs = list(itertools.product(range(V), repeat=3))
    ids = torch.tensor([PROMPT + list(s) for s in seqs])
    with torch.inference_mode():
        logits = model.module(ids, layers=layers).float()
    n = len(PROMPT)
    law = {}
    for row, s in enumerate(seqs):
        probs = probs_from_logits(logits[row, n - 1 : n + 2], cfg)
        law[s] = float(probs[0, s[0]] * probs[1, s[1]] * probs[2, s[2]])
    return law


@pytest.mark.parametrize("plan,cfg,rule", [
    ({"exit_layer": 1}, SamplingConfig(temperature=1.0), "block"),
    ({"skip_layers": [1]}, SamplingConfig(temperature=0.8, top_k=5, top_p=0.9), "block"),
    ({"skip_layers": [1]}, SamplingConfig(temperature=1.0), "token"),
], ids=["exit1-T1-block", "skip1-T0.8-k5-p0.9-block", "skip1-T1-token"])
def test_layerskip_law_matches_target(target: sd.Model, plan: dict, cfg: SamplingConfig, rule: str) -> None:
    drafter = LayerSkipDrafter(gamma=2, **plan)
    samples, drafted = [], 0
    for seed in range(N):
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=3, temperature=cfg.temperature,
                        top_k=cfg.top_k, top_p=cfg.top_p, seed=seed, ignore_eos=True, chain_rule=rule,
                        accept_rule="rejection")
        samples.append(tuple(r.token_ids))
        drafted += r.stats.drafted
    assert drafted > N  # speculation really ran
    assert gof_pvalue(samples, exact_law(target, cfg)) > 1e-3
    assert drafter.plan is not None
    assert gof_pvalue(samples, exact_law(target, cfg, drafter.plan.layers)) < 1e-6  # the draft's own law: rejected
