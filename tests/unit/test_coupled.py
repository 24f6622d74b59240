"""The Gumbel-max coupling's parts: the counter-based noise, the pure verifier, the rule's selection."""

from __future__ import annotations

import pytest
import torch

from specdecode.config import ConfigError, SamplingConfig, VerifyConfig
from specdecode.draft import DraftContext, draw_token
from specdecode.sampling import CoupledNoise, coupled_draws
from specdecode.verify import coupled_verify, coupled_verify_tree, tree_levels


def test_noise_is_a_function_of_seed_and_position_only() -> None:
    a, b = CoupledNoise(7, 50), CoupledNoise(7, 50)
    first = [a.rate(p).clone() for p in (0, 1, 2, 3)]
    later = [b.rate(p) for p in (3, 1, 0, 2)]  # another order, another object: the same noise
    assert all(torch.equal(x, y) for x, y in zip(first, [later[2], later[1], later[3], later[0]]))
    assert not torch.equal(a.rate(0), a.rate(1))
    assert not torch.equal(a.rate(0), CoupledNoise(8, 50).rate(0))
    assert not torch.equal(CoupledNoise(-1, 50).rate(0), CoupledNoise(2**64 - 1, 50).rate(0))
    assert torch.equal(CoupledNoise(2**70 + 5, 8).rate(3), CoupledNoise(2**70 + 5, 8).rate(3))
    assert a.rate(0).dtype == torch.float32 and bool((a.rate(0) > 0).all() and torch.isfinite(a.rate(0)).all())


def test_window_forgets_passed_positions_but_not_the_noise() -> None:
    n = CoupledNoise(3, 16)
    w = n.window(5, 3).clone()
    assert w.shape == (3, 16)
    assert sorted(n._rates) == [5, 6, 7]
    assert torch.equal(n.window(6, 2), w[1:]) and sorted(n._rates) == [6, 7]
    assert torch.equal(n.window(0, 1)[0], CoupledNoise(3, 16).rate(0))  # recomputed the same


def test_noise_rates_are_inverse_unit_exponentials() -> None:
    e = 1.0 / CoupledNoise(11, 200_000).rate(9).double()
    assert abs(float(e.mean()) - 1.0) < 0.01 and abs(float(e.var()) - 1.0) < 0.03


def test_coupled_draws_never_pick_a_zero_weight_token() -> None:
    probs = torch.tensor([[0.0, 1e-30, 0.0, 0.0]])
    for s in range(50):
        assert coupled_draws(probs, CoupledNoise(s, 4).window(0, 1)) == [1]
    with pytest.raises(ValueError, match="one shape"):
        coupled_draws(torch.ones(1, 5), CoupledNoise(0, 4).window(0, 1))


@pytest.mark.parametrize("draft, n, bonus", [("none", 0, True), ("target", 3, True), ("wrong-at-1", 1, False)])
def test_coupled_verify_keeps_the_prefix_equal_to_the_target_draws(draft: str, n: int, bonus: bool) -> None:
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(4, 6) * 2, -1)
    noise = CoupledNoise(5, 6)
    rates = noise.window(10, 4)
    draws = coupled_draws(p, rates)
    tokens = {"target": draws[:3], "wrong-at-1": [draws[0], (draws[1] + 1) % 6, draws[2]]}.get(draft, [])
    r = coupled_verify(p[: len(tokens) + 1], tokens, rates[: len(tokens) + 1])
    assert (r.n_accepted, r.bonus) == (n, bonus)
    assert r.next_token == draws[n]  # the target's own draw: the rejected position's, or the bonus


def test_tree_levels() -> None:
    assert tree_levels([]) == 0 and tree_levels([-1, 0, 1]) == 3 and tree_levels([-1, -1, 0, 1]) == 2


def test_coupled_tree_with_no_matching_child_emits_the_root_draw() -> None:
    p = torch.softmax(torch.randn(4, 6), -1)
    rates = CoupledNoise(1, 6).window(0, 2)
    want = coupled_draws(p[:1], rates[:1])[0]
    others = [t for t in range(6) if t != want][:3]
    r = coupled_verify_tree(p, others, [-1, -1, -1], rates)
    assert (r.n_accepted, r.next_token, r.bonus, r.path) == (0, want, False, ())


def test_accept_rule_selection_and_errors() -> None:
    seeded, unseeded = SamplingConfig(temperature=0.8, seed=1), SamplingConfig(temperature=0.8)
    assert VerifyConfig().accept_rule == "auto"
    assert VerifyConfig().coupled(seeded) and not VerifyConfig().coupled(unseeded)
    assert VerifyConfig(accept_rule="coupled").coupled(unseeded)
    assert not VerifyConfig(accept_rule="rejection").coupled(seeded)
    assert not VerifyConfig(accept_rule="coupled").coupled(SamplingConfig(seed=1))  # greedy: the argmax rule
    with pytest.raises(ConfigError, match="accept_rule must be one of auto, coupled, rejection"):
        VerifyConfig(accept_rule="leviathan")


def test_draw_token_uses_the_noise_of_its_position() -> None:
    q = torch.softmax(torch.randn(1, 9), -1)
    noise = CoupledNoise(4, 9)
    ctx = DraftContext([1, 2, 3], 4, SamplingConfig(temperature=1.0, seed=4), None, noise=noise)
    assert [draw_token(q, ctx, i) for i in range(4)] == [noise.draw(q, 3 + i) for i in range(4)]
    plain = DraftContext([1, 2, 3], 4, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert 0 <= draw_token(q, plain, 0) < 9
