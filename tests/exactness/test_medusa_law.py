"""End to end: sampling with Medusa drafts (deterministic candidates, ``probs=None``), as a tree and as
a chain, gives the target's exact law of the first 3 tokens; the same test rejects another model's law."""

from __future__ import annotations

from pathlib import Path

import pytest

import specdecode as sd
from specdecode.config import SamplingConfig
from specdecode.drafters.medusa import MedusaDrafter
from tiny import build_model

from medusa_util import make_heads

from .chi2 import gof_pvalue
from .test_generate_law import N, PROMPT, V, exact_law

pytestmark = pytest.mark.slow  # full tier: make test-full


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[sd.Model, sd.Model, Path]:
    root = tmp_path_factory.mktemp("medusa-v8")
    target = sd.load_model(build_model(root / "t", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=1,
                                       seed=11))
    other = sd.load_model(build_model(root / "d", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=1, seed=12))
    heads = make_heads(root / "heads", 16, V, num_heads=2, scale=0.3, seed=3)
    return target, other, heads


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)],
                         ids=["T1", "T0.8-k5-p0.9"])
@pytest.mark.parametrize("tree", [True, False], ids=["tree", "chain"])
def test_medusa_sampled_law_matches_target(setup: tuple[sd.Model, sd.Model, Path], cfg: SamplingConfig,
                                           tree: bool) -> None:
    target, other, heads = setup
    choices = [[0], [1], [2], [0, 0], [0, 1], [1, 0]] if tree else [[0], [0, 0]]
    drafter = MedusaDrafter.load(heads, tree=tree, choices=choices)
    samples, accepted, deep = [], 0, 0
    for seed in range(N):
        # 8 tokens, so the second pass (the first with a hidden state) verifies the whole tree; the law
        # tested is the first 3 tokens' marginal, which the second pass's tree decides in part
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=8, temperature=cfg.temperature,
                        top_k=cfg.top_k, top_p=cfg.top_p, seed=seed, ignore_eos=True, accept_rule="rejection")
        samples.append(tuple(r.token_ids[:3]))
        accepted += sum(r.from_draft[1:3])
        deep += r.from_draft[2] and r.from_draft[1]  # a depth-2 node accepted on the second pass
    assert accepted > N // 5 and deep > N // 100  # candidates, deep ones too, were really accepted
    assert gof_pvalue(samples, exact_law(target, cfg)) > 1e-3
    assert gof_pvalue(samples, exact_law(other, cfg)) < 1e-6  # power: another model's law is rejected
