"""The rejection sampler's output law equals the target's (filtered) law; a wrong law is rejected."""

from __future__ import annotations

import itertools

import pytest
import torch

from specdecode.config import SamplingConfig
from specdecode.sampling import draw, probs_from_logits
from specdecode.verify import rejection_sample

from .chi2 import gof_pvalue

V, LENGTH, N = 5, 3, 12000
SETTINGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=3),
    SamplingConfig(temperature=1.5, top_p=0.85),
    SamplingConfig(temperature=1.0, min_p=0.15),
]


def simulate(p: torch.Tensor, q: torch.Tensor | None, gamma: int, g: torch.Generator) -> tuple[int, ...]:
    """Emit LENGTH tokens from position-wise laws p[pos] (target) with drafts from q[pos] (context-free)."""
    out: list[int] = []
    while len(out) < LENGTH:
        k = len(out)
        n = min(gamma, LENGTH - k)
        if q is None:  # deterministic drafter: always propose token 0
            tokens = torch.zeros(n, dtype=torch.long)
            probs = None
        else:
            tokens = draw(q[k : k + n], g)
            probs = q[k : k + n]
        r = rejection_sample(p[k : k + n + 1], tokens, probs, g)
        out.extend(tokens[: r.n_accepted].tolist() + [r.next_token])
    return tuple(out[:LENGTH])


def product_law(p: torch.Tensor) -> dict[tuple[int, ...], float]:
    return {seq: float(torch.prod(torch.stack([p[i, t] for i, t in enumerate(seq)])))
            for seq in itertools.product(range(V), repeat=LENGTH)}


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}-m{s.min_p}")
@pytest.mark.parametrize("gamma", [1, 3])
def test_output_law_is_target_law(setting: SamplingConfig, gamma: int) -> None:
    torch.manual_seed(1000 + gamma)
    p = probs_from_logits(torch.randn(LENGTH + 1, V) * 1.5, setting)
    q = probs_from_logits(torch.randn(LENGTH + 1, V) * 1.5, setting)
    g = torch.Generator().manual_seed(42)
    samples = [simulate(p, q, gamma, g) for _ in range(N)]
    assert gof_pvalue(samples, product_law(p)) > 1e-3
    # power: the same samples must not pass as draws from the draft's law
    assert gof_pvalue(samples, product_law(q)) < 1e-6


@pytest.mark.slow
def test_deterministic_drafter_law() -> None:
    torch.manual_seed(7)
    p = probs_from_logits(torch.randn(LENGTH + 1, V), SamplingConfig(temperature=1.0))
    g = torch.Generator().manual_seed(3)
    samples = [simulate(p, None, 2, g) for _ in range(N)]
    assert gof_pvalue(samples, product_law(p)) > 1e-3
    onehot_biased = p.clone()
    onehot_biased[:, 0] += 0.1
    onehot_biased /= onehot_biased.sum(-1, keepdim=True)
    assert gof_pvalue(samples, product_law(onehot_biased)) < 1e-6


def test_accepting_every_draft_would_be_caught() -> None:
    """A broken verifier that keeps every draft token emits the draft's law; the test must see it."""
    torch.manual_seed(1)
    p = probs_from_logits(torch.randn(LENGTH + 1, V) * 1.5, SETTINGS[0])
    q = probs_from_logits(torch.randn(LENGTH + 1, V) * 1.5, SETTINGS[0])
    g = torch.Generator().manual_seed(5)
    samples = [tuple(draw(q[:LENGTH], g).tolist()) for _ in range(N)]
    assert gof_pvalue(samples, product_law(p)) < 1e-6
