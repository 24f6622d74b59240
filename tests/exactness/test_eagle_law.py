"""End to end: sampling with EAGLE drafts (EAGLE-2 dynamic trees of deterministic top-k candidates,
``probs=None``) gives the target's exact law of the first 3 tokens; the same test rejects another
model's law."""

from __future__ import annotations

from pathlib import Path

import pytest

import specdecode as sd
from specdecode.config import SamplingConfig
from specdecode.drafters.eagle import EagleDrafter
from tiny import build_model

from eagle_util import FLAT, make_eagle

from .chi2 import gof_pvalue
from .test_generate_law import N, PROMPT, V, exact_law

pytestmark = pytest.mark.slow  # full tier: make test-full


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[sd.Model, sd.Model, Path]:
    root = tmp_path_factory.mktemp("eagle-v8")
    target = sd.load_model(build_model(root / "t", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=2,
                                       seed=11))
    other = sd.load_model(build_model(root / "d", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=2, seed=12))
    return target, other, make_eagle(root / "eagle", target, seed=3)


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)],
                         ids=["T1", "T0.8-k5-p0.9"])
def test_eagle_sampled_law_matches_target(setup: tuple[sd.Model, sd.Model, Path], cfg: SamplingConfig) -> None:
    target, other, eagle = setup
    drafter = EagleDrafter.load(eagle, costs=FLAT, gamma=6)
    samples, accepted, deep = [], 0, 0
    for seed in range(N):
        # the prefill's features let the first pass verify a whole tree: the 3 tokens tested come from it
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=4, temperature=cfg.temperature,
                        top_k=cfg.top_k, top_p=cfg.top_p, seed=seed, ignore_eos=True, accept_rule="rejection")
        samples.append(tuple(r.token_ids[:3]))
        accepted += sum(r.from_draft[:3])
        deep += r.from_draft[0] and r.from_draft[1]  # a depth-2 node accepted on the first pass
    assert accepted > N // 5 and deep > N // 100  # candidates, deep ones too, were really accepted
    assert gof_pvalue(samples, exact_law(target, cfg)) > 1e-3
    assert gof_pvalue(samples, exact_law(other, cfg)) < 1e-6  # power: another model's law is rejected
