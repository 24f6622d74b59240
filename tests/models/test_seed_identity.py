"""A seeded sampled request writes the same text whatever the drafter, γ (auto included) or tree: the
Gumbel-max coupling (``accept_rule`` auto = coupled when seeded) makes every token the target's own
seeded draw, so speculation only changes how fast it comes. On three architectures."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest

import specdecode as sd
from specdecode.drafters.base import Gamma
from specdecode.drafters.layerskip import LayerSkipDrafter
from specdecode.drafters.medusa import MedusaDrafter
from medusa_util import FLAT, make_heads

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"
NEW = 24
SETTINGS = [dict(temperature=1.0), dict(temperature=0.8, top_k=40, top_p=0.95)]
SEEDS = (0, 7)


@pytest.fixture(scope="module")
def loaded(tiny_dirs: dict[str, Path]) -> dict[str, sd.Model]:
    return {name: sd.load_model(tiny_dirs[name]) for name in ("llama", "qwen2", "gpt2", "draft", "gpt2_draft")}


def drafters(arch: str, models: dict[str, sd.Model], gamma: Gamma) -> dict[str, object]:
    """Every kind of drafter the CLI's --drafter names: a separate draft model (sampling with its own
    law, acceptance well below 1), the target itself (acceptance ~1), prompt lookup (deterministic)
    and layer skip (the target's first layer, sampling). With γ "auto" the policy is told drafting is
    free (``FLAT`` offline costs), so it drafts, and its online timings move γ from step to step: the
    case that made seeded outputs differ from run to run under rejection sampling."""
    target = models[arch]
    other = models["gpt2_draft" if arch == "gpt2" else "draft"]
    lookup = 10 if gamma == "auto" else gamma
    out: dict[str, object] = {
        "model": sd.DraftModelDrafter(other, gamma),
        "self": sd.DraftModelDrafter(target, gamma),
        "ngram": sd.PromptLookupDrafter(max_ngram=2, num_draft_tokens=lookup),
        "layerskip": LayerSkipDrafter(exit_layer=1, gamma=gamma),
    }
    if gamma == "auto":
        for name in ("model", "self", "layerskip"):
            out[name].costs_for = lambda target: FLAT  # type: ignore[attr-defined]
    return out


def run(target: sd.Model, drafter: Optional[object], seed: int, accept_rule: str = "auto", **sampling: object
        ) -> sd.GenerationResult:
    return sd.generate(target, PROMPT, drafter, max_new_tokens=NEW, ignore_eos=True, seed=seed,
                       accept_rule=accept_rule, **sampling)  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("gamma", [1, 3, 8, "auto"])
def test_seeded_text_is_the_same_for_every_drafter_and_gamma(loaded: dict[str, sd.Model], arch: str,
                                                             gamma: Gamma) -> None:
    target = loaded[arch]
    for sampling in SETTINGS:
        for seed in SEEDS:
            plain = run(target, None, seed, **sampling)
            assert plain.stats.drafted == 0
            for name, drafter in drafters(arch, loaded, gamma).items():
                r = run(target, drafter, seed, **sampling)
                assert r.token_ids == plain.token_ids, (name, sampling, seed)
                assert r.text == plain.text
                if name == "self":  # speculation really ran, and accepted (nearly) everything
                    assert r.stats.drafted > 0 and r.stats.alpha > 0.9


def test_plain_seeded_sampling_is_a_real_draw(loaded: dict[str, sd.Model]) -> None:
    """Seeds give different texts, and the coupled draw is not the argmax: the identity above is not
    the trivial one of greedy decoding."""
    target = loaded["llama"]
    texts = {tuple(run(target, None, seed, temperature=1.0).token_ids) for seed in range(6)}
    assert len(texts) == 6
    greedy = sd.generate(target, PROMPT, max_new_tokens=NEW, ignore_eos=True).token_ids
    assert all(list(t) != greedy for t in texts)


def test_speculation_is_used_and_the_rule_matters(loaded: dict[str, sd.Model]) -> None:
    """The drafts were really verified (the self-draft is accepted almost always, the other draft
    sometimes), and the identity is the coupled rule's doing: rejection sampling with the same seeds
    draws from its generator in a drafter-dependent order, so its texts differ from plain decoding's."""
    target = loaded["llama"]
    ds = drafters("llama", loaded, 3)
    self_run = run(target, ds["self"], 0, temperature=1.0)
    assert self_run.stats.alpha > 0.9
    other_run = run(target, ds["model"], 0, temperature=1.0)
    assert 0 < other_run.stats.alpha < 0.9
    differ = 0
    for seed in range(4):
        plain = run(target, None, seed, "rejection", temperature=1.0)
        differ += run(target, ds["model"], seed, "rejection", temperature=1.0).token_ids != plain.token_ids
    assert differ >= 2


def test_medusa_tree_and_chain_keep_the_seeded_text(tiny_dirs: dict[str, Path], loaded: dict[str, sd.Model],
                                                    tmp_path: Path) -> None:
    """Deterministic tree candidates (Medusa heads): the coupled rule follows the child equal to the
    target's draw, so a tree, its chain and plain decoding write the same text."""
    target = loaded["llama"]
    heads = make_heads(tmp_path / "heads", target.config.dim, target.vocab_size, num_heads=3, scale=0.02)
    for tree, choices in ((True, [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]), (False, [[0], [0, 0]])):
        for seed in SEEDS:
            plain = run(target, None, seed, temperature=0.9)
            r = run(target, MedusaDrafter.load(heads, tree=tree, choices=choices), seed, temperature=0.9)
            assert r.stats.drafted > 0
            assert r.token_ids == plain.token_ids, (tree, seed)
