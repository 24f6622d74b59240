"""EAGLE drafting: an EAGLE-3 draft layer (``eagle_model.py``) grows an EAGLE-2 dynamic tree each step.

Per step and row the core hands over the target's features of the tokens its last pass verified
(``DraftContext.layers``: the residual after the three ``aux_layers``; after the prefill, the
whole prompt's). With n = len(tokens) and k features, they sit at positions n-k-1 .. n-2, so:

1. **Ingest.** The draft layer runs once over those k positions (feature fused by ``fc``, next
   token's embedding), appending their keys and values to the row's draft KV cache. Its output at
   position n-2 gives the law of x_n: the depth-1 candidates (top ``topk``).
2. **Grow (EAGLE-2).** A node's value is the product of the draft's probabilities along its path
   (its "confidence", which tracks its chance of acceptance). Level by level, the ``expand``
   best nodes of the newest depth run through the draft layer together, each reading its
   parent's output as its feature and attending to the prefix plus its own ancestors (tree
   attention over the row's draft cache and a scratch list), giving ``topk`` children each.
3. **Size from the cost model.** The draft is the top-n nodes by value (parents always rank
   before children, so any prefix is a tree), n maximising E(n) / (cost of the levels run +
   v(n) + t): E(n) = 1 + Σ values, v(n) the measured cost of a target pass over n + 1 tree
   tokens, the level cost and t (a tree step's extra over a chain step) measured once per
   machine. Growth stops when even an optimistic next level (each frontier node's best child at
   the running mean top-1 acceptance) could not raise the predicted speedup; nothing is drafted
   unless it beats a plain pass after the same draft work by the policy's margin.

A node's value is the product of calibrated edge acceptances, not of raw draft probabilities: a
draft trained on the target's soft laws is under-confident about greedy acceptance (a top-1 at
p = 0.45 is the target's argmax far more often than 45% of the time), and the error compounds
with depth. ``EdgeCalibration`` learns, per bucket of draft probability, how often a judged node
(a child of an accepted node) was accepted, read off the tokens the target actually wrote.

Candidates are deterministic (``probs=None``): greedy verification follows the target's argmax
through the tree, and the core's sampled tree rule is exact for them. Rows are drafted one after
another (each has its own prefix length); the target pass is still batched.
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional, Union

import torch
import torch.nn.functional as F

from ..costmodel import WARMUP_ROUNDS, Costs, _fingerprint, cache_dir, cost_clock
from ..policy import SPECULATION_MARGIN
from .base import Acceptance, Draft, DraftContext, Gamma, RowZeroAdapter, check_gamma
from .eagle_model import EagleNet, check_fits, input_embedding, load_eagle
from .medusa import _COST_SIZES, PAIRS, _tree_mask

if TYPE_CHECKING:
    from ..models import Model

MAX_NODES = 63  # the fused path's tree-mask limit (64 new tokens with the pending one)
MAX_DEPTH = 10
TOPK = 4  # children per expanded node
EXPAND = 4  # nodes expanded per level
BUCKETS = 10  # edge calibration: draft probability buckets
CALIB_PRIOR = 5.0  # observations per bucket the identity prior (acceptance = p) is worth
CALIB_MEMORY = 2000.0  # observations per bucket the running estimate remembers
log = logging.getLogger(__name__)


class EdgeCalibration:
    """a(p): the chance that a judged draft node whose draft probability given its parent is p is
    the target's token, per bucket of p, starting from a(p) = p."""

    def __init__(self, buckets: int = BUCKETS) -> None:
        self.buckets = buckets
        self.accepted = [0.0] * buckets
        self.judged = [0.0] * buckets

    def _bucket(self, p: float) -> int:
        return min(self.buckets - 1, max(0, int(p * self.buckets)))

    def rate(self, p: float) -> float:
        b = self._bucket(p)
        return min(1.0, (self.accepted[b] + CALIB_PRIOR * p) / (self.judged[b] + CALIB_PRIOR))

    def observe(self, p: float, ok: bool) -> None:
        b = self._bucket(p)
        self.accepted[b] += float(ok)
        self.judged[b] += 1.0
        if self.judged[b] > CALIB_MEMORY:
            keep = CALIB_MEMORY / self.judged[b]
            self.accepted[b] *= keep
            self.judged[b] *= keep

    @property
    def observations(self) -> float:
        return sum(self.judged)


@dataclass
class _RowState:
    keys: torch.Tensor  # [max_len, nkv, hd] step-0 keys by position
    values: torch.Tensor
    valid: torch.Tensor  # [max_len] bool: a key was written from the target's features
    last: Optional[tuple[int, list[int], list[int], list[float]]] = None  # (len(tokens), tokens, parents, p)


@dataclass
class _Tree:
    """A growing tree of one row: tokens, parents, values, depths; per expanded node its scratch slot."""

    tokens: list[int]
    parents: list[int]
    probs: list[float]  # the draft's probability of the node given its parent
    values: list[float]  # Π calibrated acceptance along the path
    depths: list[int]
    feats: list[int]  # index into ``outs`` of the output that is this node's input feature
    ancestors: list[list[int]]  # scratch slots of the node's expanded ancestors (itself once expanded)


class EagleDrafter(RowZeroAdapter):
    """An EAGLE-3 draft as a ``BatchDrafter`` drafting EAGLE-2 dynamic trees.

    ``gamma``: the most nodes per draft ("auto": up to ``MAX_NODES``; the cost model picks fewer).
    ``topk``/``expand``: children per expanded node and nodes expanded per level. ``costs`` and
    ``level_cost``, ``tree_extra``: measured costs to use instead of measuring (tests)."""

    wants_hidden = True

    def __init__(self, net: EagleNet, *, gamma: Gamma = "auto", source: Optional[Union[str, Path]] = None,
                 topk: int = TOPK, expand: int = EXPAND, max_depth: int = MAX_DEPTH, costs: Optional[Costs] = None,
                 level_cost: float = 0.0, tree_extra: float = 0.0) -> None:
        gamma = check_gamma(gamma, "gamma (most EAGLE tree nodes)")
        self.net = net
        self.cfg = net.cfg
        self.hidden_layers: tuple[int, ...] = tuple(self.cfg.aux_layers)
        self.max_nodes = MAX_NODES if gamma == "auto" else min(int(gamma), MAX_NODES)
        self.gamma: Gamma = self.max_nodes  # a cap: the drafter plans its own trees
        self.source = str(source) if source is not None else None
        self.topk, self.expand, self.max_depth = max(1, topk), max(1, expand), max(1, max_depth)
        self.acceptance = Acceptance()  # the core's chain-shaped evidence (reported, not planned with)
        self._costs, self._level, self._tree_extra = costs, level_cost, tree_extra
        self._target: Optional["Model"] = None
        self._rows: dict[int, _RowState] = {}
        self._max_len = 0
        self.edges = EdgeCalibration()
        self._top1 = statistics.fmean(self.cfg.depth_acceptance) if self.cfg.depth_acceptance else 0.6
        self.last_sizes: tuple[int, int] = (0, 0)  # (nodes drafted, depth grown) of the last proposal

    @classmethod
    def load(cls, path: Union[str, Path], *, gamma: Gamma = "auto", costs: Optional[Costs] = None,
             level_cost: float = 0.0, tree_extra: float = 0.0) -> "EagleDrafter":
        """A draft directory written by ``specdecode distill --method eagle`` (or exported for an engine)."""
        return cls(load_eagle(path), gamma=gamma, source=path, costs=costs, level_cost=level_cost,
                   tree_extra=tree_extra)

    # -- setup -------------------------------------------------------------------------------------
    def prepare_rows(self, target: "Model", rows: int, max_len: int) -> None:
        """Check the draft fits ``target``, lay its weights out for the target's kernels, size the caches."""
        self._max_len = max(self._max_len, max_len, min(target.max_seq_len, 256))  # 256: the cost measurement's
        if target is not self._target:
            check_fits(self.cfg, target, self.source or "the given EAGLE draft")
            fast = target.kernels.fast
            wdt = target.weight_dtype
            self._lin = target.kernels.linear
            self._x = torch.float32 if fast else target.dtype
            net = self.net
            rt = EagleNet(self.cfg, net.draft_ids)
            with torch.no_grad():
                for name, p in net.named_parameters():
                    setattr(rt, name, torch.nn.Parameter(p.detach().to(target.device, wdt if p.dim() == 2 else self._x),
                                                         requires_grad=False))
            rt.draft_ids = net.draft_ids.to(target.device)
            self._rt = rt.eval()
            self._emb = input_embedding(target)
            self._target = target
            self._rows.clear()
            if self._costs is None:
                self._costs, self._level, self._tree_extra = load_or_measure_eagle_costs(target, self)

    def _row(self, row: int) -> _RowState:
        st = self._rows.get(row)
        if st is None or st.keys.shape[0] < self._max_len:
            c, dev = self.cfg, self._target.device  # type: ignore[union-attr]
            z = torch.zeros(self._max_len, c.n_kv_heads, c.head_dim, dtype=self._x, device=dev)
            st = self._rows[row] = _RowState(z, z.clone(), torch.zeros(self._max_len, dtype=torch.bool, device=dev))
        return st

    def costs_for(self, target: "Model") -> Optional[Costs]:
        """None: the γ policy's chain model does not describe trees; this drafter plans with its own costs."""
        return None

    @property
    def costs(self) -> Optional[Costs]:
        return self._costs

    def reset_row(self, row: int) -> None:
        st = self._rows.get(row)
        if st is not None:
            with torch.inference_mode():  # the state was made while drafting, in inference mode
                st.valid.zero_()
            st.last = None

    def move_row(self, src: int, dst: int) -> None:
        self._rows.pop(dst, None)
        if src in self._rows:
            self._rows[dst] = self._rows.pop(src)

    def on_verified_row(self, row: int, n_accepted: int) -> None:
        """Nothing to roll back: the next proposal reads the accepted path off the tokens themselves."""

    def _observe(self, st: _RowState, ctx: DraftContext) -> None:
        """Calibrate edges with the last draft: walk it along the tokens the target wrote since; every
        child of an accepted node (and of the root) was judged, the one on the path accepted."""
        if st.last is None:
            return
        base, toks, parents, probs = st.last
        st.last = None
        if len(ctx.tokens) <= base:
            return
        children: dict[int, list[int]] = {}
        for i, par in enumerate(parents):
            children.setdefault(par, []).append(i)
        node = -1
        for t in ctx.tokens[base:]:
            kids = children.get(node, [])
            nxt = -1
            for i in kids:
                ok = toks[i] == t
                self.edges.observe(probs[i], ok)
                if ok:
                    nxt = i
            if nxt < 0:
                break
            node = nxt

    # -- the draft layer at run time -----------------------------------------------------------------
    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [m, nh, hd] over keys/values [S, nkv, hd] with mask [m, S] -> [m, nh * hd]."""
        c = self.cfg
        out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
                                             values.transpose(0, 1).unsqueeze(0), attn_mask=mask,
                                             enable_gqa=c.n_kv_heads != c.n_heads)
        return out[0].transpose(0, 1).reshape(q.shape[0], -1)

    def ingest(self, row: int, ctx: DraftContext) -> Optional[torch.Tensor]:
        """Run the draft layer over the newly verified positions; their outputs [k, H] (None: no features)."""
        if ctx.layers is None or ctx.hidden is None:
            return None
        k = len(ctx.hidden)
        n = len(ctx.tokens)
        if k == 0 or k > n - 1:
            return None
        st = self._row(row)
        rt, lin = self._rt, self._lin
        aux = torch.cat([ctx.layers[i][-k:] for i in self.cfg.aux_layers], dim=-1).to(self._x)
        feat = rt.fuse(aux, lin)
        ids = torch.tensor(ctx.tokens[n - k :], dtype=torch.long, device=feat.device)
        emb = self._emb[ids].to(self._x)
        start = n - k - 1
        pos = torch.arange(start, n - 1, device=feat.device)
        q, kk, vv = rt.qkv(feat, emb, pos, lin)
        st.keys[start : n - 1] = kk
        st.values[start : n - 1] = vv
        st.valid[start:] = False
        st.valid[start : n - 1] = True
        slots = torch.arange(n - 1, device=feat.device)
        mask = (slots.unsqueeze(0) <= pos.unsqueeze(1)) & st.valid[: n - 1].unsqueeze(0)
        attn = self._attend(q, st.keys[: n - 1], st.values[: n - 1], mask)
        return rt.finish(feat, attn, lin)

    def _children(self, h: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
        """Top ``topk`` target ids and probabilities of the draft's law after each output h [m, H]."""
        logits = self._rt.logits(h, self._lin).float()
        p, idx = torch.softmax(logits, -1).topk(min(self.topk, logits.shape[-1]), dim=-1)
        return self._rt.draft_ids[idx].tolist(), p.tolist()

    def _speedup(self, values: list[float], spent: float) -> tuple[int, float]:
        """(n, predicted speedup) of the best prefix of ``values`` (sorted) given draft cost ``spent``."""
        assert self._costs is not None
        e, best_n, best_s = 1.0, 0, 0.0
        for n, v in enumerate(values, start=1):
            e += v
            s = e / (spent + self._tree_extra + self._costs.v_at(n))
            if s > best_s:
                best_n, best_s = n, s
        return best_n, best_s

    def grow(self, row: int, ctx: DraftContext, outs: torch.Tensor) -> Draft:
        """The EAGLE-2 tree after ingestion (``outs``: the ingested positions' outputs)."""
        st = self._row(row)
        rt, lin = self._rt, self._lin
        n = len(ctx.tokens)
        cap = min(self.max_nodes, ctx.max_tokens)
        toks, probs = self._children(outs[-1:])
        rate = self.edges.rate
        tree = _Tree(toks[0], [-1] * len(toks[0]), probs[0], [rate(p) for p in probs[0]], [1] * len(toks[0]),
                     [0] * len(toks[0]), [[] for _ in toks[0]])
        feats = [outs[-1]]  # outputs read as features; node i reads feats[tree.feats[i]]
        skeys: list[torch.Tensor] = []
        svals: list[torch.Tensor] = []
        spent = 1.0 * self._level  # the ingestion costs about one level
        depth = 1
        prefix_mask = st.valid[: n - 1]
        while depth < self.max_depth:
            order = sorted(range(len(tree.tokens)), key=lambda i: (-tree.values[i], tree.depths[i]))[:cap]
            best_n, best_s = self._speedup([tree.values[i] for i in order], spent)
            frontier = sorted((i for i in range(len(tree.tokens)) if tree.depths[i] == depth),
                              key=lambda i: -tree.values[i])[: self.expand]
            # optimistic: every frontier node gets one more child, at the running top-1 acceptance
            hyp = sorted([tree.values[i] for i in order] + [tree.values[i] * self._top1 for i in frontier],
                         reverse=True)[:cap]
            if not frontier or self._speedup(hyp, spent + self._level)[1] <= best_s or len(tree.tokens) >= 4 * cap:
                break
            # one level: the frontier nodes through the draft layer, attending to prefix + ancestors
            m = len(frontier)
            feat = torch.stack([feats[tree.feats[i]] for i in frontier])
            ids = torch.tensor([tree.tokens[i] for i in frontier], dtype=torch.long, device=feat.device)
            pos = torch.full((m,), n - 2 + depth, dtype=torch.long, device=feat.device)
            q, kk, vv = rt.qkv(feat, self._emb[ids].to(self._x), pos, lin)
            base = len(skeys)
            skeys.extend(kk.unbind(0))
            svals.extend(vv.unbind(0))
            for j, i in enumerate(frontier):
                tree.ancestors[i] = tree.ancestors[i] + [base + j]
            s = len(skeys)
            anc = torch.zeros(m, s, dtype=torch.bool)
            for j, i in enumerate(frontier):
                anc[j, tree.ancestors[i]] = True
            mask = torch.cat([prefix_mask.unsqueeze(0).expand(m, -1), anc.to(prefix_mask.device)], dim=1)
            keys = torch.cat([st.keys[: n - 1], torch.stack(skeys)])
            values = torch.cat([st.values[: n - 1], torch.stack(svals)])
            out = rt.finish(feat, self._attend(q, keys, values, mask), lin)
            toks, probs = self._children(out)
            top1 = []
            for j, i in enumerate(frontier):
                feats.append(out[j])
                top1.append(rate(probs[j][0]))
                for t, p in zip(toks[j], probs[j]):
                    tree.tokens.append(t)
                    tree.parents.append(i)
                    tree.probs.append(p)
                    tree.values.append(tree.values[i] * rate(p))
                    tree.depths.append(depth + 1)
                    tree.feats.append(len(feats) - 1)
                    tree.ancestors.append(list(tree.ancestors[i]))
            self._top1 = 0.95 * self._top1 + 0.05 * statistics.fmean(top1)
            spent += self._level
            depth += 1
        order = sorted(range(len(tree.tokens)), key=lambda i: (-tree.values[i], tree.depths[i]))[:cap]
        best_n, best_s = self._speedup([tree.values[i] for i in order], spent)
        self.last_sizes = (0, depth)
        # what the levels cost is spent either way (and ingesting is the price of keeping the draft's cache):
        # draft when the tree beats a plain pass after the same spending by the policy's margin
        if best_n == 0 or best_s * (spent + 1.0) < SPECULATION_MARGIN:
            return Draft()
        chosen = order[:best_n]
        index = {node: k for k, node in enumerate(chosen)}
        parents = [index[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in chosen]
        tokens = [tree.tokens[i] for i in chosen]
        st.last = (n, tokens, parents, [tree.probs[i] for i in chosen])
        self.last_sizes = (best_n, depth)
        return Draft(tokens, None, parents)

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        if self._target is None:
            raise RuntimeError("EagleDrafter.prepare(target) must be called before propose()")
        drafts: dict[int, Draft] = {}
        with torch.inference_mode():
            for r, ctx in contexts.items():
                if r in self._rows:
                    self._observe(self._rows[r], ctx)
                outs = self.ingest(r, ctx) if ctx.max_tokens > 0 else None
                drafts[r] = self.grow(r, ctx, outs) if outs is not None else Draft()
        return drafts


# -- costs -----------------------------------------------------------------------------------------
_MEMO: dict[str, tuple[Costs, float, float]] = {}


def measure_eagle_costs(target: "Model", drafter: EagleDrafter, reps: int = 12, context_len: int = 192
                        ) -> tuple[Costs, float, float]:
    """(costs, level cost, tree extra) relative to a one-token target pass in the target's cost clock:
    v(n) for tree passes over n + 1 tokens with the drafter's hidden layers captured (as the core runs
    them), one tree level of ``expand`` nodes (the ingestion of a few positions costs about the same),
    and a tree step's extra over a chain step of the same width."""
    from ..core import tree_mask

    ids = [i % target.vocab_size for i in range(min(context_len, target.max_seq_len - 66))]
    dev, clock = target.device, cost_clock(target)
    samples: dict[int, list[float]] = {n: [] for n in _COST_SIZES}
    level_s: list[float] = []
    chain_s: list[float] = []
    tree_s: list[float] = []
    six = Draft([1, 2, 3, 4, 5], None, [-1, 0, 1, -1, 3])
    probe = torch.tensor([(ids * 2)[:64]], device=dev)
    masks = {n: _tree_mask(n).to(dev) if n > 1 else None for n in _COST_SIZES}
    layers = drafter.hidden_layers
    with torch.inference_mode():
        cache = target.new_cache(1, len(ids) + 64)
        out = target.run(torch.tensor([ids], device=dev), cache, return_hidden=True, hidden_layers=layers)
        ctx = DraftContext(list(ids) + [1], 8, None, None, out.hidden[0], layers={k: v[0] for k, v in out.layers.items()})  # type: ignore[arg-type]
        drafter.reset_row(0)
        outs = drafter.ingest(0, ctx)
        assert outs is not None
        st = drafter._row(0)
        n = len(ctx.tokens)
        feat = outs[-drafter.expand:]
        pos = torch.full((len(feat),), n - 1, dtype=torch.long, device=dev)
        emb = drafter._emb[torch.arange(len(feat), device=dev)].to(drafter._x)
        mask = torch.ones(len(feat), n - 1 + len(feat), dtype=torch.bool, device=dev)
        rt, lin = drafter._rt, drafter._lin
        for r in range(reps + WARMUP_ROUNDS):
            for w in _COST_SIZES if r % 2 == 0 else _COST_SIZES[::-1]:
                t0 = clock()
                float(target.run(probe[:, :w], cache, tree_mask=masks[w], return_hidden=True,
                                 hidden_layers=layers).logits[0, -1, 0])
                dt = clock() - t0
                cache.trim(w)
                if r >= WARMUP_ROUNDS:
                    samples[w].append(dt)
            t0 = clock()  # one level, as ``grow`` runs it
            q, kk, vv = rt.qkv(feat, emb, pos, lin)
            keys = torch.cat([st.keys[: n - 1], kk])
            values = torch.cat([st.values[: n - 1], vv])
            drafter._children(rt.finish(feat, drafter._attend(q, keys, values, mask), lin))
            if r >= WARMUP_ROUNDS:
                level_s.append(clock() - t0)
            for _ in range(PAIRS):
                t0 = clock()
                float(target.run(probe[:, :6], cache, return_hidden=True, hidden_layers=layers).logits[0, -1, 0])
                cache.trim(3)
                t1 = clock()
                cache.trim(3)
                t2 = clock()
                m6 = tree_mask([six], 6, dev)
                float(target.run(probe[:, :6], cache, tree_mask=m6, return_hidden=True,
                                 hidden_layers=layers).logits[0, -1, 0])
                cache.keep([0, 1, 2], row=0)
                t3 = clock()
                cache.trim(3)
                if r >= WARMUP_ROUNDS:
                    chain_s.append(t1 - t0)
                    tree_s.append(t3 - t2)
        drafter.reset_row(0)
    med = {w: statistics.median(s) for w, s in samples.items()}
    times = []
    for w in range(1, 65):
        lo = max(s for s in _COST_SIZES if s <= w)
        hi = min(s for s in _COST_SIZES if s >= w)
        times.append(med[lo] if lo == hi else med[lo] + (med[hi] - med[lo]) * (w - lo) / (hi - lo))
    level = statistics.median(level_s)
    extra = max(0.0, statistics.median(tree_s) - statistics.median(chain_s)) / times[0]
    return Costs.from_times(times, level, len(ids), reps), level / times[0], extra


def load_or_measure_eagle_costs(target: "Model", drafter: EagleDrafter) -> tuple[Costs, float, float]:
    """``measure_eagle_costs``, cached on disk per machine, threads, target and draft shape."""
    c = drafter.cfg
    key = _fingerprint([target], f"eagle-tree-v1|{c.dim}x{c.ffn}|vocab={c.draft_vocab_size}|expand={drafter.expand}"
                                 f"|topk={drafter.topk}|layers={c.aux_layers}")
    if key in _MEMO:
        return _MEMO[key]
    path = cache_dir() / f"eagle-{key}.json"
    if path.is_file():
        try:
            d = json.loads(path.read_text())
            _MEMO[key] = (Costs(c=float(d["c"]), v=tuple(float(x) for x in d["v"])), float(d["level"]),
                          float(d["tree_extra"]))
            return _MEMO[key]
        except (ValueError, KeyError, TypeError):
            pass
    log.info("eagle: measuring target pass costs v(n) for trees of up to 64 tokens and the draft layer's cost "
             "(once per machine, target and draft shape)")
    got = _MEMO[key] = measure_eagle_costs(target, drafter)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**asdict(got[0]), "level": got[1], "tree_extra": got[2]}))
    except OSError:
        pass
    return got


__all__ = ["EagleDrafter", "load_or_measure_eagle_costs", "measure_eagle_costs"]
