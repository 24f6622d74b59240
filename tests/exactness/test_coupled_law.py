"""The Gumbel-max coupled rule (``verify.coupled_verify``, ``sampling.CoupledNoise``) emits the target's
exact law over seeds, with a sampling drafter and with a deterministic one, under the four filter
settings of the chain tests; the same chi-square test rejects a wrong law (power), including the law
a coupling whose noise does not change with the position would give.

Each sample is one seed: the law "over seeds" is the law the rule promises. The laws depend on the
whole prefix (``toylm.PrefixLaws``), so a rule that scored a draft token against the wrong prefix or
position would show."""

from __future__ import annotations

from typing import Optional

import pytest
import torch

import specdecode as sd
from specdecode.config import SamplingConfig
from specdecode.sampling import CoupledNoise
from specdecode.verify import coupled_verify, coupled_verify_tree

from .chi2 import gof_pvalue
from .test_generate_law import N as N_GENERATE, PROMPT, exact_law, models  # noqa: F401  (the fixture)
from .test_rejection_law import SETTINGS
from .test_tree_generate_law import TreeDrafter
from .toylm import PrefixLaws

V, LENGTH, N = 5, 3, 8000


def simulate(seed: int, target: PrefixLaws, draft: PrefixLaws, gamma: int, sampled: bool,
             noise: Optional[CoupledNoise] = None) -> tuple[tuple[int, ...], int]:
    """LENGTH tokens by the coupled rule: drafts of up to ``gamma`` tokens, drawn from ``draft``'s law
    with the shared noise (``sampled``) or its argmax (a deterministic drafter), verified in one go.
    Returns the tokens and how many draft tokens were kept."""
    noise = noise or CoupledNoise(seed, V)
    out: list[int] = []
    kept = 0
    while len(out) < LENGTH:
        k = len(out)
        tokens: list[int] = []
        for j in range(min(gamma, LENGTH - k)):
            q = draft(out + tokens)
            tokens.append(noise.draw(q, k + j) if sampled else int(q.argmax()))
        r = coupled_verify(target.along(out, tokens), tokens, noise.window(k, len(tokens) + 1))
        out.extend(tokens[: r.n_accepted] + [r.next_token])
        kept += r.n_accepted
    return tuple(out[:LENGTH]), kept


def pair(setting: SamplingConfig, seed: int) -> tuple[PrefixLaws, PrefixLaws]:
    target = PrefixLaws(V, LENGTH, setting, seed=seed)
    return target, PrefixLaws(V, LENGTH, setting, seed=seed + 1, like=target, noise=1.0)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}-m{s.min_p}")
@pytest.mark.parametrize("gamma,sampled", [(1, True), (3, True), (2, False)],
                         ids=["sampled-g1", "sampled-g3", "deterministic-g2"])
def test_coupled_output_law_is_target_law(setting: SamplingConfig, gamma: int, sampled: bool) -> None:
    target, draft = pair(setting, 100 + gamma)
    samples, kept = [], 0
    for seed in range(N):
        seq, k = simulate(seed, target, draft, gamma, sampled)
        samples.append(seq)
        kept += k
    assert kept > N // 5  # drafts were really kept, often
    assert gof_pvalue(samples, target.sequence_law(LENGTH)) > 1e-3
    # power: the same samples must not pass as draws from the draft's law
    assert gof_pvalue(samples, draft.sequence_law(LENGTH)) < 1e-6


def test_a_coupling_that_reuses_noise_across_positions_is_caught() -> None:
    """Noise that depends on the seed but not on the position gives every position's marginal right
    and their joint law wrong (tokens follow the same large rates): the test must reject it."""

    class StuckNoise(CoupledNoise):
        def rate(self, position: int) -> torch.Tensor:
            return super().rate(0)

    target, draft = pair(SETTINGS[0], 7)
    samples = [simulate(s, target, draft, 2, True, StuckNoise(s, V))[0] for s in range(N)]
    assert gof_pvalue(samples, target.sequence_law(LENGTH)) < 1e-6


@pytest.mark.slow
def test_coupled_draws_are_the_target_law_per_position() -> None:
    """One position: argmax p / E over seeds is a draw from p (the exponential race), filters included."""
    for setting in SETTINGS:
        p = PrefixLaws(V, 0, setting, seed=3)([])
        draws = [CoupledNoise(s, V).draw(p, 5) for s in range(N)]
        law = {x: float(p[x]) for x in range(V)}
        assert gof_pvalue(draws, law) > 1e-3
        assert all(p[x] > 0 for x in draws)  # a filtered-out token is never drawn
        flat = {x: 1.0 / V for x in range(V)}
        assert gof_pvalue(draws, flat) < 1e-6


def test_coupled_tree_follows_the_child_equal_to_the_target_draw() -> None:
    """A tree with every token as a root child and a second level under the drafted one: the accepted
    path is the target's own draws, as deep as the tree agrees."""
    target, _ = pair(SETTINGS[0], 11)
    for seed in range(20):
        noise = CoupledNoise(seed, V)
        first = noise.draw(target([]), 0)
        second = noise.draw(target([first]), 1)
        tokens = list(range(V)) + [second]
        parents = [-1] * V + [first]
        laws = torch.stack([target([])] + [target([t]) for t in range(V)] + [target([first, second])])
        r = coupled_verify_tree(laws, tokens, parents, noise.window(0, 3))
        assert r.path == (first, V) and r.n_accepted == 2 and r.bonus
        assert r.next_token == noise.draw(target([first, second]), 2)


# -- end to end: generate() with real (tiny) models through the decode core ---------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind,cfg", [
    ("model", SamplingConfig(temperature=1.0)),
    ("model", SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)),
    ("ngram", SamplingConfig(temperature=1.0)),
    ("tree", SamplingConfig(temperature=1.0)),
], ids=["model-T1", "model-T0.8-k5-p0.9", "ngram-T1", "sampled-tree-T1"])
def test_generate_coupled_law_matches_target(models: tuple[sd.Model, sd.Model], kind: str,  # noqa: F811
                                             cfg: SamplingConfig) -> None:
    """Seeded generate() (the coupled rule by default) over seeds: the target's exact law of the first
    3 tokens, with a sampling draft model, prompt lookup and a sampled tree; the draft's law is rejected."""
    target, draft = models
    drafter: object = {"model": sd.DraftModelDrafter(draft, gamma=2),
                       "ngram": sd.PromptLookupDrafter(max_ngram=1, num_draft_tokens=2),
                       "tree": TreeDrafter(draft, sampled=True)}[kind]
    samples, kept = [], 0
    for seed in range(N_GENERATE):
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=3, temperature=cfg.temperature,
                        top_k=cfg.top_k, top_p=cfg.top_p, seed=seed, ignore_eos=True)
        samples.append(tuple(r.token_ids[:3]))
        kept += sum(r.from_draft)
    if kind != "ngram":  # PROMPT [1, 2] gives prompt lookup nothing to match at first
        assert kept > N_GENERATE // 10
    assert gof_pvalue(samples, exact_law(target, cfg)) > 1e-3
    assert gof_pvalue(samples, exact_law(draft, cfg)) < 1e-6
