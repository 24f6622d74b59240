"""Medusa drafts (tree and chain) give exactly plain greedy decoding's tokens on llama, qwen2 and gpt2."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode import generate
from specdecode.drafters.medusa import MedusaDrafter
from specdecode.models import load_model

from medusa_util import FLAT, make_heads

PROMPTS = ["def add(a, b):\n    return", "class Point:\n    def __init__(self", "fib(n - 1) +"]
TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0]]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("mode", ["tree", "chain", "tree-cost-model"])
def test_medusa_greedy_equals_plain(arch: str, mode: str, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    target = load_model(tiny_dirs[arch])
    heads = make_heads(tmp_path / "heads", target.config.dim, target.vocab_size, seed=len(arch))
    if mode == "tree":
        drafter = MedusaDrafter.load(heads, choices=TREE)
    elif mode == "chain":
        drafter = MedusaDrafter.load(heads, tree=False, choices=[[0], [0, 0], [0, 0, 0]])
    else:  # the planner's trees (free nodes: it always drafts), with the running rank estimates
        drafter = MedusaDrafter.load(heads, costs=FLAT, gamma=12)
    accepted = drafted = 0
    for prompt in PROMPTS:
        plain = generate(target, prompt, max_new_tokens=40, ignore_eos=True)
        spec = generate(target, prompt, drafter, max_new_tokens=40, ignore_eos=True)
        assert spec.token_ids == plain.token_ids, (arch, mode, prompt)
        accepted += sum(spec.from_draft)
        drafted += spec.stats.drafted
    assert drafted > 0 and 0 < accepted < drafted  # drafts were judged, some kept and some rejected
    if mode == "tree-cost-model":
        assert drafter.last_plan.paths and len(drafter.last_plan.paths) <= 12
        assert drafter.stats.version > 0  # the true tokens' ranks were counted


def test_medusa_on_the_eager_path_equals_plain(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A model loaded with fast=False (eager PyTorch, weights in the compute dtype): the heads follow it."""
    target = load_model(tiny_dirs["llama"], fast=False)
    heads = make_heads(tmp_path / "heads", target.config.dim, target.vocab_size)
    drafter = MedusaDrafter.load(heads, choices=TREE)
    for prompt in PROMPTS:
        plain = generate(target, prompt, max_new_tokens=30, ignore_eos=True)
        spec = generate(target, prompt, drafter, max_new_tokens=30, ignore_eos=True)
        assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0


def test_a_target_without_exact_trees_verifies_their_first_paths(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """Where a tree's rows would not be rounded as plain decoding's (CUDA, ``Model.exact_trees``), the core
    sends the tree's first path as a chain: no tree mask reaches the target, and the tokens stay plain's."""
    target = load_model(tiny_dirs["llama"])
    target.exact_trees = False
    heads = make_heads(tmp_path / "heads", target.config.dim, target.vocab_size)
    drafter = MedusaDrafter.load(heads, choices=TREE)
    masks = []
    run = target.run

    def recording(*args: object, **kw: object) -> object:
        masks.append(kw.get("tree_mask"))
        return run(*args, **kw)  # type: ignore[arg-type]

    target.run = recording  # type: ignore[method-assign]
    for prompt in PROMPTS:
        plain = generate(target, prompt, max_new_tokens=30, ignore_eos=True)
        spec = generate(target, prompt, drafter, max_new_tokens=30, ignore_eos=True)
        assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0
    assert masks and all(m is None for m in masks)


def test_first_path_follows_each_nodes_first_child() -> None:
    import torch

    from specdecode.draft import Draft

    tree = Draft([10, 11, 12, 13, 14, 15], torch.eye(6), [-1, -1, 1, 0, 3, 3], source="x")
    chain = tree.first_path()
    assert chain.tokens == [10, 13, 14] and chain.parents is None and chain.source == "x"
    assert chain.probs is not None and torch.equal(chain.probs, torch.eye(6)[[0, 3, 4]])
    assert Draft([1, 2]).first_path().tokens == [1, 2] and Draft().first_path().tokens == []
