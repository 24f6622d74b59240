"""Table-driven cases for the pure verification functions."""

from __future__ import annotations

import pytest
import torch

from specdecode.verify import greedy_verify, rejection_sample


@pytest.mark.parametrize("target, draft, n, nxt, bonus", [
    ([5, 6, 7, 8], [5, 6, 7], 3, 8, True),
    ([5, 6, 7, 8], [5, 9, 7], 1, 6, False),
    ([5, 6, 7, 8], [4, 6, 7], 0, 5, False),
    ([3], [], 0, 3, True),
])
def test_greedy_verify(target: list[int], draft: list[int], n: int, nxt: int, bonus: bool) -> None:
    r = greedy_verify(target, draft)
    assert (r.n_accepted, r.next_token, r.bonus) == (n, nxt, bonus)


def onehot(i: int, v: int = 4) -> torch.Tensor:
    x = torch.zeros(v)
    x[i] = 1.0
    return x


def test_identical_laws_accept_everything() -> None:
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(4, 10), -1)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        r = rejection_sample(p, torch.tensor([1, 2, 3]), p[:3].clone(), g)
        assert r.n_accepted == 3 and r.bonus


def test_zero_target_mass_rejects_and_resamples_from_residual() -> None:
    # the target never emits token 0; the draft always proposes it -> always rejected,
    # and the recovered token comes from norm(max(0, p - q)) = p here.
    p = torch.stack([torch.tensor([0.0, 0.5, 0.5, 0.0]), onehot(3)])
    q = onehot(0).unsqueeze(0)
    g = torch.Generator().manual_seed(1)
    seen = set()
    for _ in range(100):
        r = rejection_sample(p, torch.tensor([0]), q, g)
        assert r.n_accepted == 0 and not r.bonus
        seen.add(r.next_token)
    assert seen == {1, 2}


def test_deterministic_drafter_residual_excludes_the_rejected_token() -> None:
    p = torch.stack([torch.tensor([0.25, 0.25, 0.25, 0.25]), onehot(0)])
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        r = rejection_sample(p, torch.tensor([2]), None, g)
        if r.n_accepted == 0:
            assert r.next_token != 2
        else:
            assert r.next_token == 0 and r.bonus


def test_residual_with_no_mass_falls_back_to_target() -> None:
    # p == q at the rejected position up to rounding: residual is all zero; must not crash or emit NaN.
    p = torch.stack([torch.tensor([0.0, 1.0, 0.0, 0.0]), onehot(2)])
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    r = rejection_sample(p, torch.tensor([1]), q, torch.Generator().manual_seed(0))
    assert r.n_accepted == 1 and r.next_token == 2


def test_empty_draft_samples_from_target() -> None:
    p = onehot(3).unsqueeze(0)
    r = rejection_sample(p, torch.tensor([], dtype=torch.long), None, torch.Generator().manual_seed(0))
    assert (r.n_accepted, r.next_token, r.bonus) == (0, 3, True)


# -- block verification ----------------------------------------------------------------------------
def test_block_identical_laws_accept_everything() -> None:
    from specdecode.verify import block_verify

    torch.manual_seed(0)
    p = torch.softmax(torch.randn(4, 10), -1)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        r = block_verify(p, torch.tensor([1, 2, 3]), p[:3].clone(), g)
        assert r.n_accepted == 3 and r.bonus


def test_block_zero_target_mass_stops_before_it() -> None:
    # p(X_2) = 0: the block can never keep X_2; X_1 (p = q) is always kept, the next token is never X_2
    from specdecode.verify import block_verify

    p = torch.stack([torch.tensor([0.25, 0.25, 0.25, 0.25]), torch.tensor([0.0, 0.5, 0.5, 0.0]), onehot(3)])
    q = torch.stack([torch.tensor([0.25, 0.25, 0.25, 0.25]), onehot(0)])
    g = torch.Generator().manual_seed(1)
    for _ in range(100):
        r = block_verify(p, torch.tensor([2, 0]), q, g)
        assert r.n_accepted == 1 and not r.bonus and r.next_token in (1, 2)


def test_block_deterministic_drafter_residual_excludes_the_proposed_token() -> None:
    from specdecode.verify import block_verify

    p = torch.stack([torch.tensor([0.25, 0.25, 0.25, 0.25]), onehot(0)])
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        r = block_verify(p, torch.tensor([2]), None, g)
        assert r.next_token != 2 if r.n_accepted == 0 else (r.next_token == 0 and r.bonus)


def test_block_empty_draft_and_degenerate_residual() -> None:
    from specdecode.verify import block_verify

    r = block_verify(onehot(3).unsqueeze(0), torch.tensor([], dtype=torch.long), None, torch.Generator().manual_seed(0))
    assert (r.n_accepted, r.next_token, r.bonus) == (0, 3, True)
    p = torch.stack([torch.tensor([0.0, 1.0, 0.0, 0.0]), onehot(2)])
    r = block_verify(p, torch.tensor([1]), torch.tensor([[0.0, 1.0, 0.0, 0.0]]), torch.Generator().manual_seed(0))
    assert r.n_accepted == 1 and r.next_token == 2


# -- sampled trees ---------------------------------------------------------------------------------
# tree: root children 1 (node 0), 2 (node 1); node 0 has child 3 (node 2)
TREE_TOKENS, TREE_PARENTS = [1, 2, 3], [-1, -1, 0]


def test_tree_follows_certain_target_to_a_leaf() -> None:
    from specdecode.verify import rejection_sample_tree

    p = torch.stack([onehot(2), onehot(3), onehot(0), onehot(1)])  # row k + 1: after node k; after node 1: 0
    for probs in (None, torch.full((3, 4), 0.25)):
        r = rejection_sample_tree(p, TREE_TOKENS, TREE_PARENTS, probs, torch.Generator().manual_seed(0))
        assert (r.path, r.n_accepted, r.next_token, r.bonus) == ((1,), 1, 0, True)  # node 1 is a leaf


def test_tree_deep_path_and_rejected_candidates_never_drawn() -> None:
    from specdecode.verify import rejection_sample_tree

    # root law uniform over {1, 2, 0}: candidates 1 then 2 tried; if both fail the next token is 0
    root = torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0])
    p = torch.stack([root, onehot(3), onehot(0), onehot(1)])
    g = torch.Generator().manual_seed(3)
    seen = set()
    for _ in range(300):
        r = rejection_sample_tree(p, TREE_TOKENS, TREE_PARENTS, None, g)
        seen.add(r.path)
        if r.path == ():
            assert r.next_token == 0 and not r.bonus
        elif r.path == (0, 2):
            assert r.next_token == 1 and r.bonus and r.n_accepted == 2
        else:
            assert r.path == (1,) and r.next_token == 0
    assert seen == {(), (0, 2), (1,)}


def test_tree_empty_draft_samples_from_target() -> None:
    from specdecode.verify import rejection_sample_tree

    r = rejection_sample_tree(onehot(3).unsqueeze(0), [], [], None, torch.Generator().manual_seed(0))
    assert (r.n_accepted, r.next_token, r.path) == (0, 3, ())
