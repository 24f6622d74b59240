"""Our filters must match transformers' warpers exactly (same order, same semantics)."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
)

from specdecode.config import ConfigError, SamplingConfig
from specdecode.sampling import draw, filter_logits, make_generator, probs_from_logits

SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, min_p=0.1),
    dict(temperature=0.8, top_k=10, top_p=0.9, min_p=0.05),
    dict(temperature=2.0, top_k=1),
    dict(temperature=1.0, top_p=0.01),
]


def reference(logits: torch.Tensor, s: dict) -> torch.Tensor:
    scores = TemperatureLogitsWarper(s["temperature"])(None, logits.clone())
    if s.get("top_k"):
        scores = TopKLogitsWarper(s["top_k"])(None, scores)
    if s.get("top_p"):
        scores = TopPLogitsWarper(s["top_p"])(None, scores)
    if s.get("min_p"):
        scores = MinPLogitsWarper(s["min_p"])(None, scores)
    return scores


@pytest.mark.parametrize("setting", SETTINGS)
def test_filters_match_transformers(setting: dict) -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    ours = filter_logits(logits, SamplingConfig(**setting))
    ref = reference(logits, setting)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    finite = ~torch.isinf(ref)
    torch.testing.assert_close(ours[finite], ref[finite])


def test_probs_sum_to_one_and_keep_at_least_one_token() -> None:
    logits = torch.randn(4, 30)
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=1e-6, min_p=1.0))
    torch.testing.assert_close(p.sum(-1), torch.ones(4))
    assert ((p > 0).sum(-1) >= 1).all()


def test_seed_reproduces_draws() -> None:
    probs = torch.softmax(torch.randn(3, 100), -1)
    a = draw(probs, make_generator(7))
    b = draw(probs, make_generator(7))
    assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
    (dict(top_k=0), "top_k must be a positive integer"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p must be in (0, 1]"),
    (dict(min_p=-0.1), "min_p must be in [0, 1]"),
])
def test_invalid_sampling_values(kwargs: dict, message: str) -> None:
    pattern = message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(ConfigError, match=pattern):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-op", "torch"])
def test_draw_follows_the_weights_and_never_draws_a_zero(fused: bool) -> None:
    """Inverse-CDF draws: the frequencies match the (unnormalised) weights by a chi-square test,
    zero-weight tokens never appear, and the test rejects a wrong law (it has power)."""
    from scipy.stats import chisquare

    from specdecode.kernels import fused as fused_module

    ext = fused_module.load_fused_extension()
    if fused and ext is None:
        pytest.skip("fused ops cannot be built here")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fused_module, "_ext", ext if fused else None)  # draw uses the extension when it is loaded
        w = torch.tensor([[0.0, 2.0, 0.0, 5.0, 1.0, 0.0, 0.5, 1.5] * 8])  # 64 categories, a third of them zero
        g = make_generator(0)
        counts = torch.bincount(torch.cat([draw(w.expand(50, -1), g) for _ in range(200)]), minlength=64)
        assert counts[w[0] == 0].sum() == 0
        nz = w[0] > 0
        expected = (w[0][nz] / w[0][nz].sum() * counts.sum()).numpy()
        assert chisquare(counts[nz].numpy(), expected).pvalue > 1e-3
        wrong = torch.ones(int(nz.sum())) / int(nz.sum()) * counts.sum()
        assert chisquare(counts[nz].numpy(), wrong.numpy()).pvalue < 1e-6


@pytest.mark.parametrize("bad", [[0.0, 0.0], [1.0, float("nan")], [1.0, -1.0], [float("inf"), 1.0]])
def test_draw_rejects_invalid_weights(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="cannot sample"):
        draw(torch.tensor([bad]), make_generator(0))


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p_over_a_large_vocabulary_matches_transformers_row_by_row(top_p: float) -> None:
    """Rows whose best tokens hold the nucleus take the short path, flat rows the full sort; in one batch
    or alone, each row gets transformers' mask."""
    from specdecode.sampling import NUCLEUS_PROBE

    torch.manual_seed(1)
    v = 8 * NUCLEUS_PROBE
    peaked = torch.randn(4, v) * 6  # the nucleus among the best few tokens
    flat = torch.randn(3, v) * 0.5  # the nucleus spans most of the vocabulary
    logits = torch.cat([peaked, flat])[torch.randperm(7)]
    setting = dict(temperature=0.7, top_p=top_p)
    ours = filter_logits(logits, SamplingConfig(**setting))
    ref = reference(logits, setting)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    kept = (~torch.isinf(ref)).sum(-1)
    assert kept.min() < NUCLEUS_PROBE < kept.max()  # both paths ran
    for r in range(7):  # a row alone gets the mask it got in the batch
        assert torch.equal(filter_logits(logits[r : r + 1], SamplingConfig(**setting)), ours[r : r + 1])
    # leading dims are rows too: [batch, positions, vocab] and a single [vocab] row
    assert torch.equal(filter_logits(logits[:6].view(2, 3, v), SamplingConfig(**setting)), ours[:6].view(2, 3, v))
    assert torch.equal(filter_logits(logits[0], SamplingConfig(**setting)), ours[0])
    # the full sort alone (every row: what a GPU runs, with no host read) gives the same mask
    from specdecode.sampling import _outside_nucleus, sorted_outside_nucleus

    scores = logits / 0.7
    assert torch.equal(sorted_outside_nucleus(scores, top_p), _outside_nucleus(scores, top_p))
