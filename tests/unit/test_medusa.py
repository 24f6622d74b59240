"""Medusa: the tree planner against brute force, the running rank acceptance, the heads directory and
its errors, the registry entry."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from specdecode.config import ConfigError
from specdecode.sizing.costs import Costs
from specdecode.sizing.pricer import SPECULATION_MARGIN as MARGIN
from specdecode.drafters.medusa import (MAX_NODES, NO_TREE, MedusaDrafter, RankAcceptance, best_first, fixed_plan,
                                        plan_tree)
from specdecode.drafters.medusa_heads import CONFIG_FILE, MedusaHeadsError, load_heads
from specdecode.models import load_model

from medusa_util import make_heads

TABLE = [[0.6, 0.15, 0.08, 0.04], [0.5, 0.2, 0.1, 0.05], [0.45, 0.2, 0.1, 0.02]]


def _value(table, path) -> float:
    v = 1.0
    for d, r in enumerate(path):
        v *= table[d][r]
    return v


def _all_paths(depth: int, ranks: int):
    for d in range(1, depth + 1):
        yield from itertools.product(range(ranks), repeat=d)


def test_best_first_is_the_best_tree_of_every_size() -> None:
    nodes = best_first(TABLE, 40)
    values = [v for v, _ in nodes]
    assert values == sorted(values, reverse=True)
    seen = set()
    for _, p in nodes:  # parents first: every prefix is a tree
        assert len(p) == 1 or p[:-1] in seen
        seen.add(p)
    brute = sorted((_value(TABLE, p) for p in _all_paths(3, 4)), reverse=True)
    for n in range(1, 41):  # the n best nodes have the n largest values of all paths (ties aside)
        assert sum(values[:n]) == pytest.approx(sum(brute[:n]))


def test_chain_mode_takes_rank_zero_only() -> None:
    nodes = best_first(TABLE, 10, chain=True)
    assert [p for _, p in nodes] == [(0,), (0, 0), (0, 0, 0)]


def _costs(v: list[float], c: float = 0.0) -> Costs:
    return Costs(c=c, v=tuple(v))


def test_plan_maximises_expected_tokens_over_cost() -> None:
    v = [1.0] * 8 + [1.0 + 0.15 * k for k in range(1, 57)]  # flat up to 8 tokens, then linear (the CPU's shape)
    costs = _costs(v, c=0.1)
    plan = plan_tree(TABLE, costs, MAX_NODES, MARGIN)
    nodes = best_first(TABLE, MAX_NODES)
    best = max(range(1, len(nodes) + 1),
               key=lambda n: (1 + sum(x for x, _ in nodes[:n])) / (0.1 + costs.v_at(n)))
    assert len(plan.paths) == best
    assert plan.expected_tokens == pytest.approx(1 + sum(x for x, _ in nodes[:best]))
    assert plan.speedup == pytest.approx(plan.expected_tokens / (0.1 + costs.v_at(best)))
    assert all(p == -1 or p < i for i, p in enumerate(plan.parents))
    # a capped plan never exceeds the cap, and wider batches never get wider trees
    assert len(plan_tree(TABLE, costs, 3, MARGIN).paths) <= 3
    widths = [len(plan_tree(TABLE, costs, MAX_NODES, MARGIN, rows=b).paths) for b in (1, 2, 4, 16)]
    assert widths == sorted(widths, reverse=True)


def test_a_tree_must_pay_for_its_overhead_over_the_best_chain() -> None:
    flat = _costs([1.0] * 64)
    tree = plan_tree(TABLE, flat, 12, MARGIN)
    assert len(tree.paths) == 12 and not tree.is_chain
    chain = plan_tree(TABLE, flat, 12, MARGIN, tree_extra=5.0)  # a tree step dearer than anything it can gain
    assert chain.is_chain and chain.paths == ((0,), (0, 0), (0, 0, 0))
    assert chain == plan_tree(TABLE, flat, 12, MARGIN, chain=True)


def test_plan_drops_the_tree_when_nothing_pays() -> None:
    steep = _costs([1.0 + 0.5 * k for k in range(64)], c=0.3)
    assert plan_tree([[0.05] * 4] * 3, steep, MAX_NODES, MARGIN) is NO_TREE
    assert plan_tree([[0.05] * 4] * 3, _costs([1.0] * 64), MAX_NODES, MARGIN).paths  # free nodes: any evidence pays


def test_fixed_plan_orders_parents_first_and_rejects_orphans() -> None:
    plan = fixed_plan([[0, 1], [1], [0], [0, 0]])
    assert plan.paths == ((0,), (1,), (0, 0), (0, 1))
    assert plan.parents == (-1, -1, 0, 0)
    with pytest.raises(ConfigError, match="parent"):
        fixed_plan([[0], [1, 0]])


def test_rank_acceptance_counts_conditionally_and_forgets() -> None:
    acc = RankAcceptance(3, ranks=4, prior=[[0.5, 0.1, 0, 0]] * 3, prior_weight=10, memory=100)
    acc.observe([0, 4, 0])  # depth 1 hit at rank 0, depth 2 missed: depth 3 is not counted
    assert acc.totals == [11, 11, 10]
    assert acc.counts[0][0] == pytest.approx(6.0) and acc.counts[2][0] == pytest.approx(5.0)
    for _ in range(500):
        acc.observe([1, 0, 0])
    t = acc.table()
    assert t[0][1] > 0.95 * t[0][0]  # rank 1 is what happens now; the table stays non-increasing in rank
    assert all(row == sorted(row, reverse=True) for row in t)
    assert acc.totals[0] == pytest.approx(100)


def test_heads_directory_round_trip(tmp_path: Path) -> None:
    d = make_heads(tmp_path / "h", 16, 50)
    cfg, sd = load_heads(d)
    assert (cfg.num_heads, cfg.dim, cfg.vocab_size) == (3, 16, 50)
    assert sd["weight"].shape == (3, 16, 16) and sd["bias"].shape == (3, 16)
    raw = json.loads((d / CONFIG_FILE).read_text())
    assert raw["format_version"] == 1 and raw["rank_acceptance"][0][0] == 0.5


def test_heads_errors_name_the_fix(tmp_path: Path, tiny_dirs: dict[str, Path]) -> None:
    target = load_model(tiny_dirs["llama"])
    with pytest.raises(MedusaHeadsError, match="does not exist.*distill --method medusa"):
        MedusaDrafter.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MedusaHeadsError, match="not a Medusa heads directory"):
        MedusaDrafter.load(tmp_path / "empty")
    wrong_dim = MedusaDrafter.load(make_heads(tmp_path / "dim", target.config.dim + 8, target.vocab_size))
    with pytest.raises(MedusaHeadsError, match="hidden size.*distill --method medusa --target"):
        wrong_dim.prepare(target)
    wrong_vocab = MedusaDrafter.load(make_heads(tmp_path / "voc", target.config.dim, target.vocab_size + 1))
    with pytest.raises(MedusaHeadsError, match="vocabulary of"):
        wrong_vocab.prepare(target)
    bad = make_heads(tmp_path / "bad", 16, 50)
    (bad / CONFIG_FILE).write_text("{not json")
    with pytest.raises(MedusaHeadsError, match="malformed"):
        MedusaDrafter.load(bad)
    with pytest.raises(ConfigError, match="depth 4 but there are only 3 heads"):
        MedusaDrafter.load(make_heads(tmp_path / "ok", 16, 50), choices=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])


def test_packed_heads_propose_as_the_dense_heads(tmp_path: Path, tiny_dirs: dict[str, Path]) -> None:
    """int8 heads (the default on the fast CPU path) halve the bytes a draft reads; their candidates follow
    the dense heads' within Q8_0's rounding, and a bad format is refused naming the field."""
    import torch

    from medusa_util import FLAT

    target = load_model(tiny_dirs["llama"])
    heads = make_heads(tmp_path / "h", target.config.dim, target.vocab_size)
    packed = MedusaDrafter.load(heads, costs=FLAT)
    dense = MedusaDrafter.load(heads, costs=FLAT, quant=None)
    packed.prepare(target)
    dense.prepare(target)
    if not target.kernels.fast:
        pytest.skip("no fast CPU kernel on this machine: the heads stay dense")
    assert (packed.runtime, dense.runtime) == ("int8", "dense")
    h = torch.randn(32, target.config.dim)
    a, b = packed.candidates(h), dense.candidates(h)
    assert float((a[..., 0] == b[..., 0]).float().mean()) >= 0.9
    with pytest.raises(ConfigError, match="quant .*must be None or one of int8, int4"):
        MedusaDrafter.load(heads, quant="int3")


def test_heads_that_do_not_pay_are_probed_ever_more_rarely(tmp_path: Path, tiny_dirs: dict[str, Path]) -> None:
    """While no tree pays, the heads run on probes only, spaced 8, 16, 32 ... 256 steps apart (one every 8
    steps cost 3% of plain decoding on SmolLM2, AVX2)."""
    import torch

    from specdecode.config import SamplingConfig
    from specdecode.draft import DraftContext
    from specdecode.drafters.medusa import PROBE_FIRST, PROBE_MAX

    target = load_model(tiny_dirs["llama"])
    steep = _costs([1.0] + [50.0] * 63, c=5.0)  # every node dearer than it can pay
    d = MedusaDrafter.load(make_heads(tmp_path / "h", target.config.dim, target.vocab_size), costs=steep)
    d.prepare(target)
    runs = []
    real = d.candidates
    d.candidates = lambda h: (runs.append(1), real(h))[1]  # type: ignore[method-assign]
    ctx = DraftContext([1, 2, 3], 4, SamplingConfig(), None, hidden=torch.randn(1, target.config.dim))
    steps, gap, probes_at = 0, PROBE_FIRST, []
    while gap < PROBE_MAX:  # the spacing doubles from PROBE_FIRST up to PROBE_MAX ...
        probes_at.append(steps + gap)
        steps, gap = steps + gap, 2 * gap
    probes_at += [steps + PROBE_MAX * (i + 1) for i in range(3)]  # ... and stays there
    seen = []
    for step in range(1, probes_at[-1] + 1):
        before = len(runs)
        assert not d.propose_rows({0: ctx})[0].tokens  # nothing pays: no draft
        if len(runs) > before:
            seen.append(step)
    assert seen == probes_at
