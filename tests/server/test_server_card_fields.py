"""The per-pass card's fields (``server/card.py``), built from a core StepEvent's raw facts: a tree pass is read
along its verified path (accepted nodes, then the last accepted node's children, all rejected), so the target's
token is a bonus only at a leaf and nodes off the path count at no position. Chains keep their old card."""

from __future__ import annotations

from specdecode.rows import StepEvent
from specdecode.server.card import card_fields, pass_view
from specdecode.server.metrics import ServerMetrics

# a tree of 6 nodes over token ids 10..15:   root ─┬─ 0:10 ─┬─ 2:12 ── 4:14
#                                                   │        └─ 3:13
#                                                   └─ 1:11 ── 5:15
TOKENS = [10, 11, 12, 13, 14, 15]
PARENTS = [-1, -1, 0, 0, 2, 1]


def _tree_ev(path: list[int], own: int, cut: bool = False) -> StepEvent:
    acc = [TOKENS[k] for k in path]
    ids, flags = (acc, [True] * len(acc)) if cut else (acc + [own], [True] * len(acc) + [False])
    return StepEvent(ids, flags, [f"<{t}>" for t in ids], drafted=len(TOKENS), proposed=list(TOKENS),
                     parents=list(PARENTS), path=list(path))


def text(t: int) -> str:
    return f"<{t}>"


def test_tree_rejection_at_the_first_disagreement_on_the_path() -> None:
    # accepted 0 -> 2; node 2's only child (14) rejected, the target writes 99: no bonus, 3 positions judged
    f = card_fields(_tree_ev([0, 2], 99), text)
    assert f == {"rejected": "<14>", "bonus": False, "verified": [True, True, False], "tree": True}


def test_tree_several_rejected_siblings() -> None:
    # accepted 0; its children 12 and 13 both rejected: the drafter's first shown, the other listed
    f = card_fields(_tree_ev([0], 99), text)
    assert f["rejected"] == "<12>" and f["rejected_also"] == ["<13>"] and f["bonus"] is False
    assert f["verified"] == [True, False]


def test_tree_nothing_accepted() -> None:
    f = card_fields(_tree_ev([], 99), text)
    assert f["rejected"] == "<10>" and f["rejected_also"] == ["<11>"] and f["verified"] == [False]


def test_tree_leaf_reached_is_a_bonus() -> None:
    # the whole proposed path 0 -> 2 -> 4 accepted: the target's token is a bonus; the 3 nodes off the path
    # (1, 3, 5) count at no position although the pass drafted 6
    for path in ([0, 2, 4], [1, 5]):
        f = card_fields(_tree_ev(path, 99), text)
        assert f == {"rejected": None, "bonus": True, "verified": [True] * len(path), "tree": True}


def test_tree_cut_short_by_eos_judges_nothing_after_the_cut() -> None:
    f = card_fields(_tree_ev([0, 2], 0, cut=True), text)
    assert f == {"rejected": None, "bonus": False, "verified": [True, True], "tree": True}


def test_chain_card_as_before() -> None:
    rej = StepEvent([5, 6, 99], [True, True, False], ["a", "b", "c"], drafted=4, proposed=[5, 6, 7, 8])
    assert card_fields(rej, text) == {"rejected": "<7>", "bonus": False, "verified": [True, True, False, False],
                                      "tree": False}
    full = StepEvent([5, 6, 99], [True, True, False], ["a", "b", "c"], drafted=2, proposed=[5, 6])
    assert card_fields(full, text) == {"rejected": None, "bonus": True, "verified": [True, True], "tree": False}
    plain = StepEvent([99], [False], ["c"])
    assert card_fields(plain, text) == {"rejected": None}


def test_metrics_count_only_the_verified_path() -> None:
    m = ServerMetrics(max_positions=8)
    ev = _tree_ev([0], 99)  # 6 nodes drafted, the path: one accepted, one position rejected
    m.observe_step(6, [(ev.drafted, 1, 2, pass_view(ev).verified)])
    leaf = _tree_ev([1, 5], 99)
    m.observe_step(6, [(leaf.drafted, 2, 3, pass_view(leaf).verified)])
    assert m._pos[:3] == [[2, 2], [2, 1], [0, 0]]
