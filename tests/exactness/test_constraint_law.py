"""Structured output under speculation: the law of generate()'s output under a regex equals the
target's constrained law (the masked, renormalised target, enumerated exactly), for drafts that
honour the mask, drafts that ignore it (cut at the first forbidden token), and every sampled rule."""

from __future__ import annotations

import re
from typing import Optional

import pytest
import torch

pytest.importorskip("llguidance")

import specdecode as sd
from specdecode.config import GenerationConfig, SamplingConfig, VerifyConfig
from specdecode.constraints import Constraint, ConstraintSpec, token_list_tokenizer
from specdecode.draft import Draft, DraftContext
from specdecode.rows import FinishEvent
from specdecode.engine import stream
from specdecode.sampling import draw, probs_from_logits
from tiny import build_model

from .chi2 import gof_pvalue

pytestmark = pytest.mark.slow  # full tier: make test-full

V, N, PROMPT, EOS = 8, 2000, [1, 2], 0
TOKENS = [b"<eos>", b"a", b"b", b"c", b"ab", b"ca", b"x", b"bb"]
REGEX = r"a[ab]*c|b"  # forbidden tokens at every step, forced EOS after "b" and after the final "c"


def viable(s: str) -> bool:
    return re.fullmatch(r"(a[ab]*c?|b)?", s) is not None


def complete(s: str) -> bool:
    return re.fullmatch(REGEX, s) is not None


def allowed(text: str) -> list[bool]:
    """The grammar's mask after ``text``, computed here without llguidance."""
    return [complete(text) if t == EOS else viable(text + TOKENS[t].decode()) for t in range(V)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[sd.Model, sd.Model]:
    root = tmp_path_factory.mktemp("cv8")
    target = sd.load_model(build_model(root / "t", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=1,
                                       seed=21))
    draft = sd.load_model(build_model(root / "d", "llama", vocab_size=V, tokenizer=False, hidden=16, layers=1, seed=22))
    return target, draft


@pytest.fixture(scope="module")
def constraint() -> Constraint:
    return Constraint(ConstraintSpec("regex", REGEX), token_list_tokenizer(TOKENS, EOS), V)


def constrained_law(model: sd.Model, cfg: SamplingConfig, max_new: int = 3, bias: Optional[torch.Tensor] = None,
                    grammar: bool = True) -> dict[tuple[int, ...], float]:
    """Every output of up to ``max_new`` tokens (ending at EOS or at the budget) with its exact
    probability under the biased, masked, renormalised, filtered law of ``model``."""
    law: dict[tuple[int, ...], float] = {}

    def walk(seq: tuple[int, ...], pr: float) -> None:
        if (seq and seq[-1] == EOS) or len(seq) == max_new:
            law[seq] = law.get(seq, 0.0) + pr
            return
        with torch.inference_mode():
            logits = model.module(torch.tensor([PROMPT + list(seq)])).float()[0, -1]
        text = "".join(TOKENS[t].decode() for t in seq)
        mask = torch.tensor(allowed(text)) if grammar else torch.ones(V, dtype=torch.bool)
        if bias is not None:
            logits = logits + bias
        probs = probs_from_logits(logits.masked_fill(~mask, float("-inf")).unsqueeze(0), cfg)[0].double()
        for t in range(V):
            if probs[t] > 0:
                walk(seq + (t,), pr * float(probs[t]))

    walk((), 1.0)
    return law


class UniformDrafter:
    """A stochastic drafter that ignores the grammar: uniform draws over the whole vocabulary, so
    most drafts hold a forbidden token and the core must cut them (after that token)."""

    gamma = 3

    def prepare(self, target: sd.Model) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Draft:
        q = torch.full((ctx.max_tokens, V), 1.0 / V)
        return Draft([int(t) for t in draw(q, ctx.generator)], q)

    def on_verified(self, n_accepted: int) -> None:
        pass

    def reset(self) -> None:
        pass


def sample(target: sd.Model, drafter: object, constraint: Optional[Constraint], cfg: SamplingConfig,
           verify: VerifyConfig, n: int = N, logit_bias: Optional[dict[int, float]] = None) -> list[tuple[int, ...]]:
    out = []
    for seed in range(n):
        s = SamplingConfig(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=seed)
        for ev in stream(target, PROMPT, drafter, s, GenerationConfig(max_new_tokens=3), verify, constraint,
                         logit_bias):
            if isinstance(ev, FinishEvent):
                out.append(tuple(ev.token_ids))
    return out


CASES = [("model", "rejection", "block"), ("model", "rejection", "token"), ("model", "coupled", "block"),
         ("uniform", "rejection", "block"), ("uniform", "rejection", "token"), ("none", "rejection", "block")]


@pytest.mark.parametrize("drafter_kind,accept_rule,chain_rule", CASES, ids=["-".join(c) for c in CASES])
def test_constrained_law_matches_target(models: tuple[sd.Model, sd.Model], constraint: Constraint,
                                        drafter_kind: str, accept_rule: str, chain_rule: str) -> None:
    target, draft = models
    cfg = SamplingConfig(temperature=1.0)
    drafter: Optional[object] = {"model": lambda: sd.DraftModelDrafter(draft, gamma=2),
                                 "uniform": UniformDrafter, "none": lambda: None}[drafter_kind]()
    samples = sample(target, drafter, constraint, cfg, VerifyConfig(chain_rule=chain_rule, accept_rule=accept_rule))
    for s in samples:  # every output is a prefix the grammar allows (EOS only where it is complete)
        text = ""
        for t in s:
            assert allowed(text)[t], (s, text)
            text += TOKENS[t].decode() if t != EOS else ""
    law = constrained_law(target, cfg)
    assert gof_pvalue(samples, law) > 1e-3
    # power: the same samples reject the draft's constrained law
    assert gof_pvalue(samples, constrained_law(draft, cfg)) < 1e-6


def test_constrained_law_with_filters(models: tuple[sd.Model, sd.Model], constraint: Constraint) -> None:
    """The mask comes before temperature/top-k/top-p, on target and draft alike."""
    target, draft = models
    cfg = SamplingConfig(temperature=0.8, top_k=3, top_p=0.9)
    samples = sample(target, sd.DraftModelDrafter(draft, gamma=2), constraint, cfg,
                     VerifyConfig(accept_rule="rejection"))
    assert gof_pvalue(samples, constrained_law(target, cfg)) > 1e-3
    assert gof_pvalue(samples, constrained_law(target, SamplingConfig(temperature=1.0))) < 1e-6


@pytest.mark.parametrize("grammar", [False, True], ids=["bias", "bias+regex"])
def test_logit_bias_law(models: tuple[sd.Model, sd.Model], constraint: Constraint, grammar: bool) -> None:
    """``logit_bias`` shifts target and draft logits alike: the output follows the biased target law."""
    target, draft = models
    logit_bias = {1: 2.0, 2: -1.5, 3: 1.0, 5: -100.0}
    bias = torch.zeros(V)
    for t, b in logit_bias.items():
        bias[t] = b
    cfg = SamplingConfig(temperature=1.0)
    samples = sample(target, sd.DraftModelDrafter(draft, gamma=2), constraint if grammar else None, cfg,
                     VerifyConfig(accept_rule="rejection"), logit_bias=logit_bias)
    assert gof_pvalue(samples, constrained_law(target, cfg, bias=bias, grammar=grammar)) > 1e-3
    assert gof_pvalue(samples, constrained_law(target, cfg, grammar=grammar)) < 1e-6  # the unbiased law: rejected
