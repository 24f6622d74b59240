"""End to end: sampling with cross-tokenizer drafts (SLEM, drafters/crosstok.py) gives the target's exact
law of the first 3 tokens; the same test rejects another model's law (power).

A toy tokenizer pair on a tiny vocabulary makes the law enumerable: the target's tokens are the single
characters a..h, the draft's are those characters plus the pairs ab, cd, ef, gh (BPE merges), so every
draft step becomes one or two target tokens after re-tokenization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny import build_model

import specdecode as sd
from specdecode.config import SamplingConfig
from specdecode.drafters.crosstok import CrossTokenizerDrafter

from .chi2 import gof_pvalue
from .test_generate_law import PROMPT, N, V, exact_law

pytestmark = pytest.mark.slow  # full tier: make test-full

CHARS = "abcdefgh"
PAIRS = [("a", "b"), ("c", "d"), ("e", "f"), ("g", "h")]


def _write_tokenizer(out: Path, pairs: list[tuple[str, str]], special: bool) -> None:
    from tokenizers import Tokenizer, decoders, models

    vocab = {c: i for i, c in enumerate(CHARS)}
    for a, b in pairs:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.decoder = decoders.Fuse()
    if special:
        tok.add_special_tokens(["<eos>"])
    tok.save(str(out / "tokenizer.json"))
    assert json.loads((out / "tokenizer.json").read_text())["model"]["vocab"] == vocab


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[sd.Model, sd.Model, sd.Model]:
    root = tmp_path_factory.mktemp("crosstok-v8")
    t = build_model(root / "t", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=1, seed=21)
    _write_tokenizer(t, [], special=False)
    o = build_model(root / "o", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=1, seed=22)
    d = build_model(root / "d", "llama", vocab_size=V + len(PAIRS) + 1, tokenizer=False, hidden=16, layers=1,
                    seed=23, eos_token_id=V + len(PAIRS), bos_token_id=V + len(PAIRS))
    _write_tokenizer(d, PAIRS, special=True)
    return sd.load_model(t), sd.load_model(o), sd.load_model(d)


def test_toy_pair_differs(models: tuple[sd.Model, sd.Model, sd.Model]) -> None:
    target, _, draft = models
    assert target.encode("abcd", add_special_tokens=False) == [0, 1, 2, 3]
    assert draft.encode("abcd", add_special_tokens=False) == [8, 9]
    assert target.decode([0, 1, 2]) == "abc" and draft.decode([8, 2]) == "abc"


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)],
                         ids=["T1", "T0.8-k5-p0.9"])
def test_crosstok_sampled_law_matches_target(models: tuple[sd.Model, sd.Model, sd.Model], cfg: SamplingConfig) -> None:
    target, other, draft = models
    drafter = CrossTokenizerDrafter(draft, gamma=3)
    samples, accepted, drafted = [], 0, 0
    for seed in range(N):
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=3, temperature=cfg.temperature,
                        top_k=cfg.top_k, top_p=cfg.top_p, seed=seed, ignore_eos=True)
        samples.append(tuple(r.token_ids[:3]))
        accepted += sum(r.from_draft[:3])
        drafted += r.stats.drafted
    assert drafted > N and accepted > N // 10, (drafted, accepted)  # proposals were made and really accepted
    assert gof_pvalue(samples, exact_law(target, cfg)) > 1e-3
    assert gof_pvalue(samples, exact_law(other, cfg)) < 1e-6  # power: another model's law is rejected
