"""The EAGLE drafter's tree and its sizing by the cost model; the directory's checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdecode import generate
from specdecode.sizing.costs import Costs
from specdecode.drafters.eagle import EagleDrafter
from specdecode.drafters.eagle_model import EagleError, default_aux_layers, is_eagle_dir, load_eagle
from specdecode.models import load_model

from eagle_util import FLAT, make_eagle

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"


def _sizes(drafter: EagleDrafter, target, max_new: int = 24) -> list[tuple[int, int]]:
    seen = []
    grow = drafter.grow

    def spy(*a):
        d = grow(*a)
        seen.append(drafter.last_sizes)
        assert all(-1 <= p < i for i, p in enumerate(d.parents or [])), d.parents  # parents come first
        assert len(d) <= a[1].max_tokens
        return d

    drafter.grow = spy  # type: ignore[method-assign]
    generate(target, PROMPT, drafter, max_new_tokens=max_new, ignore_eos=True)
    return seen


def test_tree_size_follows_the_costs(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    target = load_model(tiny_dirs["llama"])
    eagle = make_eagle(tmp_path / "e", target, draft_vocab=100)
    free = _sizes(EagleDrafter.load(eagle, costs=FLAT, gamma=10), target)
    assert max(n for n, _ in free) == 10 and max(d for _, d in free) >= 3  # free nodes: full trees, grown deep
    # a pass costs 1 + 2n: no node ever pays, nothing is drafted (and no level is grown past the first). At
    # 1 + n a sure node would still pay against the plain step plus the ingestion spent either way, and a
    # confident draft token (numerics: e.g. the KV-cache storage) tipped it
    steep = Costs(c=0.0, v=tuple(1.0 + 2 * k for k in range(64)))
    costly = _sizes(EagleDrafter.load(eagle, costs=steep, level_cost=0.5, gamma=10), target)
    assert all(n == 0 for n, _ in costly) and all(d == 1 for _, d in costly)


def test_calibration_follows_acceptance(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """Edges are judged from the tokens the target wrote: each drafted step judges at least the root's
    children; every draft token the target accepted is counted, and so is a grown node left out of the
    draft that the target wrote (the whole grown tree is judged), never more than the tokens written."""
    target = load_model(tiny_dirs["llama"])
    drafter = EagleDrafter.load(make_eagle(tmp_path / "e", target), costs=FLAT, gamma=6)
    assert drafter.edges.rate(0.35) == 0.35  # the prior: acceptance = draft probability
    r = generate(target, PROMPT, drafter, max_new_tokens=24, ignore_eos=True)
    judged, accepted = drafter.edges.observations, sum(map(sum, drafter.edges.accepted))
    steps = r.stats.target_passes
    assert judged >= steps - 2 and sum(r.from_draft) <= accepted <= len(r.token_ids)


def test_edge_calibration_learns_a_rate() -> None:
    from specdecode.drafters.eagle import EdgeCalibration

    cal = EdgeCalibration()
    for i in range(400):
        cal.observe(0.42, i % 5 != 0)  # judged at p = 0.42, accepted 80% of the time
    assert abs(cal.rate(0.45) - 0.8) < 0.02 and cal.rate(0.95) == 0.95  # other buckets keep the prior
    assert cal.rate(0.45, first=False) == 0.45  # a parent's other children are calibrated apart
    for i in range(400):
        cal.observe(0.42, i % 5 == 0, first=False)  # a second child at the same p: accepted 20% of the time
    assert abs(cal.rate(0.45, first=False) - 0.2) < 0.02 and abs(cal.rate(0.45) - 0.8) < 0.02


def test_directory_checks(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    target = load_model(tiny_dirs["llama"])
    eagle = make_eagle(tmp_path / "e", target)
    assert is_eagle_dir(eagle) and not is_eagle_dir(tiny_dirs["llama"]) and not is_eagle_dir(None)
    cfg = json.loads((eagle / "config.json").read_text())
    cfg["num_hidden_layers"] = 2
    (eagle / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EagleError, match="malformed"):
        load_eagle(eagle)
    with pytest.raises(EagleError, match="not an EAGLE-3 directory"):
        load_eagle(tiny_dirs["llama"])
    assert default_aux_layers(32) == (1, 15, 28) and default_aux_layers(8) == (1, 3, 4)
    assert default_aux_layers(2) == (0, 0, 1)


def test_a_level_expands_only_the_nodes_that_pay(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A level of m nodes costs between a one-node level and an ``expand``-node one: a confident frontier
    (one strong node) expands that node alone, an uncertain one (several near-equal nodes) branches,
    and where neither a level's nodes nor their verification cost more, every frontier node is expanded."""
    target = load_model(tiny_dirs["llama"])
    eagle = make_eagle(tmp_path / "e", target, draft_vocab=100)
    v = Costs(c=0.0, v=tuple(1.0 + 0.02 * k for k in range(64)))  # a node costs 0.02 of a pass to verify
    d = EagleDrafter.load(eagle, costs=v, level_cost=0.2, level_one=0.05, gamma=20)
    d._top1 = 0.8
    assert d._level_cost(1) == pytest.approx(0.05) and d._level_cost(4) == pytest.approx(0.2)
    tree = [0.9, 0.05, 0.04, 0.03]  # the values drafted so far: the frontier's four nodes
    assert d._expansion(tree, [0.9, 0.05, 0.04, 0.03], 0.1, 20)[0] == 1
    wide = [0.45, 0.44, 0.43, 0.42]
    assert d._expansion(wide, wide, 0.1, 20)[0] == 4
    flat = EagleDrafter.load(eagle, costs=FLAT, level_cost=0.2, gamma=20)  # no level_one: m costs the same
    flat._top1 = 0.8
    assert flat._expansion(tree, [0.9, 0.05, 0.04, 0.03], 0.1, 20)[0] == 4


@pytest.mark.parametrize("fast", [True, False], ids=["fused", "eager"])
def test_run_time_levels_compute_the_training_unroll(tiny_dirs: dict[str, Path], tmp_path: Path, fast: bool) -> None:
    """The drafter's ingestion and tree levels (cache slots, RoPE positions, ancestor masks) compute what the
    trainer's training-time test (``EagleNet.unroll``) computes: a mismatch there costs acceptance only, which
    no exactness test would notice. Depth k from anchor n - 2 is unroll step k at position n - 2 + k."""
    import torch

    from specdecode.config import SamplingConfig
    from specdecode.draft import DraftContext
    from specdecode.drafters.eagle_model import input_embedding

    target = load_model(tiny_dirs["llama"], weight_dtype="fp32", fast=fast)
    drafter = EagleDrafter.load(make_eagle(tmp_path / "e", target, draft_vocab=100, scale=1.0), costs=FLAT, quant=None)
    seq = generate(target, PROMPT, max_new_tokens=24, ignore_eos=True).token_ids
    seq = target.encode(PROMPT) + list(seq)
    aux = tuple(drafter.cfg.aux_layers)
    with torch.inference_mode():
        out = target.run(torch.tensor([seq]), target.new_cache(1, len(seq)), hidden_layers=aux)
        layers = {i: out.layers[i][0].float() for i in aux}
        emb = input_embedding(target).float()
        nxt = torch.tensor([seq[1:] + seq[-1:]])
        ref = drafter.net.float().unroll(torch.cat([layers[i] for i in aux], -1)[None], emb[nxt], 3)
        ref_logits = [drafter.net.logits(o[0]) for o in ref]
        drafter.prepare_rows(target, 1, len(seq) + 8)
        checked = 0
        for n in range(len(seq) - 20, len(seq) - 2, 3):
            drafter.reset_row(0)
            ctx = DraftContext(tokens=seq[:n], max_tokens=8, sampling=SamplingConfig(), generator=None,
                               hidden=torch.zeros(n - 1, 1), layers={i: layers[i][: n - 1] for i in aux})
            got = [drafter.ingest(0, ctx)]
            assert got[0] is not None
            st = drafter._row(0)
            prefix = len(st.positions)
            # depth 1 under the true token x_n (bank row 0), then depth 2 under x_{n+1}, its ancestor scratch slot 0
            got.append(drafter._layer(st, [seq[n]], drafter._bank, [0], 1, prefix, [n - 1], [0]))
            got.append(drafter._layer(st, [seq[n + 1]], drafter._bank, [1], 2, prefix + 1, [n], [1]))
            for k, lg in enumerate(got):
                want = ref_logits[k][n - 2 + k]
                torch.testing.assert_close(lg[-1].float(), want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))
            checked += 1
    assert checked >= 5
