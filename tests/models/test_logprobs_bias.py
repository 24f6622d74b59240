"""``logprobs``/``top_logprobs`` from the target's law and ``logit_bias`` on target and draft alike,
on tiny real checkpoints: the same numbers and tokens with and without speculation."""

from __future__ import annotations

import pytest
import torch

import specdecode as sd
from specdecode.config import ConfigError
from tiny import build_model

PROMPT = "def fib(n):\n    "


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[sd.Model, sd.Model]:
    root = tmp_path_factory.mktemp("lp")
    target = sd.load_model(build_model(root / "t", "qwen2", seed=3, hidden=64, layers=2), fast=False)
    draft = sd.load_model(build_model(root / "d", "qwen2", seed=4, hidden=32, layers=1), fast=False)
    return target, draft


def reference_logprobs(target: sd.Model, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log p(token k | prefix) for each generated token, from one full causal pass."""
    ids = target.encode(PROMPT)
    with torch.inference_mode():
        logits = target.module(torch.tensor([ids + tokens])).float()[0]
    logp = (logits[len(ids) - 1 : len(ids) - 1 + len(tokens)] / temperature).log_softmax(-1)
    return logp.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)


def test_logprobs_equal_with_and_without_speculation(models: tuple[sd.Model, sd.Model]) -> None:
    target, draft = models
    plain = sd.generate(target, PROMPT, max_new_tokens=24, logprobs=3, ignore_eos=True)
    spec = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=3), max_new_tokens=24, logprobs=3,
                       ignore_eos=True)
    assert spec.token_ids == plain.token_ids and len(spec.logprobs) == len(spec.token_ids)
    for a, b in zip(plain.logprobs, spec.logprobs):
        assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-4
        assert [t for t, _ in a.top] == [t for t, _ in b.top] and len(a.top) == 3
        assert a.top[0][0] == a.token  # greedy: the chosen token is the most likely one
    ref = reference_logprobs(target, plain.token_ids)
    assert torch.allclose(torch.tensor([x.logprob for x in spec.logprobs]), ref, atol=1e-4)


def test_sampled_logprobs_are_the_target_law(models: tuple[sd.Model, sd.Model]) -> None:
    target, draft = models
    r = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=3), max_new_tokens=24, temperature=0.7,
                    seed=5, logprobs=0, ignore_eos=True)
    ref = reference_logprobs(target, r.token_ids, temperature=0.7)
    assert torch.allclose(torch.tensor([x.logprob for x in r.logprobs]), ref, atol=1e-4)
    assert all(x.top == [] for x in r.logprobs)


def test_logprobs_under_a_grammar_are_the_masked_law(models: tuple[sd.Model, sd.Model]) -> None:
    pytest.importorskip("llguidance")
    target, draft = models
    r = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=3), max_new_tokens=30, regex=r"[0-9]{4}",
                    logprobs=5)
    assert r.finish_reason == "stop" and len(r.text) == 4 and r.text.isdigit()
    for x in r.logprobs[:-1]:  # only digits may follow, so their probabilities sum to 1
        assert all(target.decode([t]).isdigit() for t, _ in x.top)
    assert r.logprobs[-1].logprob == pytest.approx(0.0, abs=1e-5)  # EOS is forced after 4 digits


def test_logit_bias_applies_to_target_and_draft(models: tuple[sd.Model, sd.Model]) -> None:
    target, draft = models
    plain = sd.generate(target, PROMPT, max_new_tokens=24, ignore_eos=True)
    banned = sorted(set(plain.token_ids))[:3]
    bias = {t: -100.0 for t in banned}
    a = sd.generate(target, PROMPT, max_new_tokens=24, ignore_eos=True, logit_bias=bias)
    b = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=3), max_new_tokens=24, ignore_eos=True,
                    logit_bias=bias)
    assert a.token_ids == b.token_ids and not set(a.token_ids) & set(banned)
    boosted = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=3), max_new_tokens=8,
                          ignore_eos=True, logit_bias={"42": 100})
    assert boosted.token_ids == [42] * 8


def test_bad_values_are_config_errors(models: tuple[sd.Model, sd.Model]) -> None:
    target, _ = models
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        sd.generate(target, PROMPT, logit_bias={10**6: 1.0})
    with pytest.raises(ConfigError, match=r"\[-100, 100\]"):
        sd.generate(target, PROMPT, logit_bias={1: 500})
    with pytest.raises(ConfigError, match="token ids"):
        sd.generate(target, PROMPT, logit_bias={"x": 1})
    with pytest.raises(ConfigError, match="top_logprobs"):
        sd.generate(target, PROMPT, logprobs=99)
