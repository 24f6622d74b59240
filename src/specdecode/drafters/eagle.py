"""EAGLE drafting: an EAGLE-3 draft layer (``eagle_model.py``) grows an EAGLE-2 dynamic tree each step.
(Over 450 lines: growing a tree and drafting from it share the per-row state kept here.)

Per step and row the core hands over the target's features of the tokens its last pass verified
(``DraftContext.layers``: the residual after the three ``aux_layers``; after the prefill, the
whole prompt's). With n = len(tokens) and k features, they sit at positions n-k-1 .. n-2, so:

1. **Ingest.** The draft layer runs once over those k positions (feature fused by ``fc``, next
   token's embedding), appending their keys and values to the row's draft KV cache (one slot per
   position whose features came). Its output at position n-2 gives the law of x_n: the depth-1
   candidates (top ``topk``); only that position's attention, MLP and head are computed.
2. **Grow (EAGLE-2).** A node's value is the product of the draft's probabilities along its path
   (its "confidence", which tracks its chance of acceptance). Level by level, up to ``expand``
   best nodes of the newest depth run through the draft layer together, each reading its
   parent's output as its feature and attending to the prefix plus its own ancestors (tree
   attention over the row's draft cache, whose scratch slots after the prefix hold the tree's
   keys), giving ``topk`` children each. On the CPU's fused path a level is one C++ call.
3. **Size from the cost model** (``eagle_sizing.py``): the top-n nodes by calibrated value, n and
   each level's width chosen by predicted speedup against the measured costs.

Candidates are deterministic (``probs=None``): greedy verification follows the target's argmax
through the tree, and the core's sampled tree rule is exact for them. Rows are drafted one after
another (each has its own prefix length); the target pass is still batched.
"""

from __future__ import annotations

import logging
import math
import statistics
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional, Union

import torch
import torch.nn.functional as F

from ..sizing import measure_context
from ..sizing.book import CostSpec
from ..sizing.costs import CostSteps, Costs, Step, cost_clock
from ..config import ConfigError, SamplingConfig
from ..kernels.quant import QUANT_FORMATS, pack_draft
from ..draft import Draft, DraftContext
from .base import Acceptance, Gamma, RowZeroAdapter, check_gamma
from .eagle_model import EagleNet, check_fits, input_embedding, is_eagle_dir, load_eagle, rope_table
from .eagle_sizing import (EagleCosts, EdgeCalibration, GrowingTree, best_prefix, level_cost,
                           eagle_costs, refined_eagle_costs)
from ..sizing.live import Stored, StepTimings
from .plugin import Artifact, AutoMember, BenchVariant, DrafterOptions, DrafterSpec
from .tree_steps import PROBE, one_token_pass

if TYPE_CHECKING:
    from ..models import Model

MAX_NODES = 63  # the fused path's tree-mask limit (64 new tokens with the pending one)
MAX_DEPTH = 10
SCRATCH = 64  # cache slots after the prefix for tree nodes (the kernel's ancestor sets are 64-bit)
QUANT = "int8"  # the draft layer's matrices at run time on the fused path (Q8_0: drafts only, exactness unaffected)
BANK = 64  # feature rows: the ingestion's last output, then every expanded level's outputs
TOPK = 4  # children per expanded node
EXPAND = 4  # nodes expanded per level
log = logging.getLogger(__name__)


@dataclass
class _RowState:
    """A row's draft KV cache: one slot per ingested position (``positions``, increasing; a position
    whose features never came, e.g. after a plain step, has none), then ``SCRATCH`` slots for the
    current tree's nodes. The kernel's layout: [1, nkv, slots, hd]."""

    keys: torch.Tensor
    values: torch.Tensor
    positions: list[int] = field(default_factory=list)
    last: Optional[tuple[int, list[int], list[int], list[float]]] = None  # (len(tokens), tokens, parents, p)


class EagleDrafter(RowZeroAdapter):
    """An EAGLE-3 draft as a ``BatchDrafter`` drafting EAGLE-2 dynamic trees.

    ``gamma``: the most nodes per draft ("auto": up to ``MAX_NODES``; the cost model picks fewer).
    ``topk``/``expand``: children per expanded node and nodes expanded per level. ``costs`` and
    ``level_cost``, ``tree_extra``: measured costs to use instead of measuring (tests; ``level_cost`` is
    a level of ``expand`` nodes, ``level_one`` of one, the same as ``level_cost`` unless given). ``quant``: the
    draft layer's matrices at run time on the fused CPU path ("int8": Q8_0, ~half a level's time,
    which is all weight reads; None: the target's weight dtype). Drafts only: outputs stay exact.

    On the fused path (the target's fused CPU ops, fp32 activations) a level is one C++ call
    (``decode_ops.eagle_layer``) over preallocated state: the row's draft cache (one slot per
    verified position, then scratch slots for the tree), a feature bank for node outputs."""

    wants_hidden = True
    sizes_itself = True  # plans its own trees (see BatchDrafter)

    def __init__(self, net: EagleNet, *, gamma: Gamma = "auto", source: Optional[Union[str, Path]] = None,
                 topk: int = TOPK, expand: int = EXPAND, max_depth: int = MAX_DEPTH, costs: Optional[Costs] = None,
                 level_cost: float = 0.0, tree_extra: float = 0.0, quant: Optional[str] = QUANT,
                 level_one: Optional[float] = None) -> None:
        gamma = check_gamma(gamma, "gamma (most EAGLE tree nodes)")
        if quant is not None and quant not in QUANT_FORMATS:
            raise ConfigError(f"quant (the EAGLE layer's run-time weights) must be None or one of "
                              f"{', '.join(QUANT_FORMATS)}, got {quant!r}")
        self.quant = quant
        self.net = net
        self.cfg = net.cfg
        self.hidden_layers: tuple[int, ...] = tuple(self.cfg.aux_layers)
        self.max_nodes = MAX_NODES if gamma == "auto" else min(int(gamma), MAX_NODES)
        self.gamma: Gamma = self.max_nodes  # a cap: the drafter plans its own trees
        self.source = str(source) if source is not None else None
        self.topk, self.expand, self.max_depth = max(1, topk), max(1, expand), max(1, max_depth)
        self.acceptance = Acceptance()  # the core's chain-shaped evidence (reported, not planned with)
        self._costs, self._level, self._tree_extra = costs, level_cost, tree_extra
        self._steps: Optional[StepTimings] = None  # its own steps timed live (None: costs given, kept fixed)
        self._stored = Stored(None)  # what its cost cache file holds
        self._level_one = level_cost if level_one is None else level_one
        self._ingest = level_cost  # what ingesting a step's positions costs (measured with the rest)
        self._target: Optional["Model"] = None
        self._rows: dict[int, _RowState] = {}
        self._max_len = 0
        self.edges = EdgeCalibration()
        self._top1 = statistics.fmean(self.cfg.depth_acceptance) if self.cfg.depth_acceptance else 0.6
        self.last_sizes: tuple[int, int] = (0, 0)  # (nodes drafted, depth grown) of the last proposal

    @classmethod
    def load(cls, path: Union[str, Path], *, gamma: Gamma = "auto", costs: Optional[Costs] = None,
             level_cost: float = 0.0, tree_extra: float = 0.0, quant: Optional[str] = QUANT,
             level_one: Optional[float] = None) -> "EagleDrafter":
        """A draft directory written by ``specdecode distill --method eagle`` (or exported for an engine)."""
        return cls(load_eagle(path), gamma=gamma, source=path, costs=costs, level_cost=level_cost,
                   tree_extra=tree_extra, quant=quant, level_one=level_one)

    # -- setup -------------------------------------------------------------------------------------
    def prepare_rows(self, target: "Model", rows: int, max_len: int) -> None:
        """Check the draft fits ``target``, lay its weights out for the target's kernels, size the caches."""
        self._max_len = max(self._max_len, max_len, min(target.max_seq_len, 256))  # 256: the cost measurement's
        if target is not self._target:
            check_fits(self.cfg, target, self.source or "the given EAGLE draft")
            kernels = target.kernels
            wdt = target.weight_dtype
            self._lin = kernels.linear
            self._x = torch.float32 if kernels.fast else target.dtype
            net = self.net
            rt = EagleNet(self.cfg, net.draft_ids)
            with torch.no_grad():
                for name, p in net.named_parameters():
                    setattr(rt, name, torch.nn.Parameter(p.detach().to(target.device, wdt if p.dim() == 2 else self._x),
                                                         requires_grad=False))
            rt.draft_ids = net.draft_ids.to(target.device)
            self._rt = rt.eval()
            self._emb = input_embedding(target)
            # the fused path: the whole layer in one C++ call per level (fp32 activations on the CPU)
            ext, native = kernels.fused, kernels.native
            self._fused = (ext is not None and native is not None and hasattr(ext, "eagle_layer")
                           and target.device.type == "cpu" and self._x == torch.float32
                           and self._emb.dtype in (torch.float32, torch.bfloat16) and self._emb.is_contiguous())
            self.runtime = "fused" if self._fused else "eager"  # how a level runs (the cost cache's key)
            if self._fused:
                assert ext is not None and native is not None  # checked in _fused
                self._ext, self._native = ext, native
                mats = {name: getattr(rt, name) for name in ("fc", "wqkv", "wo", "w13", "w2", "lm_head")}
                # a level reads every weight once: half the bytes, about half the time
                qk, mats, fmt = pack_draft(kernels, self.quant, mats, "eagle")
                if fmt is not None:
                    assert qk.native is not None  # quantized kernels are always callable from C++
                    self._lin, self._native = qk.linear, qk.native
                    self.runtime = f"fused-{fmt}"
                self._fc = mats["fc"]
                self._weights = ext.EagleLayer(rt.input_norm, rt.hidden_norm, mats["wqkv"], mats["wo"], rt.post_norm,
                                               mats["w13"], mats["w2"], rt.norm, mats["lm_head"])
                self._draft_list: list[int] = rt.draft_ids.tolist()
            else:
                self._fc = rt.fc
            self._bank = torch.zeros(BANK, self.cfg.dim, dtype=self._x, device=target.device)
            self._target = target
            self._rows.clear()
            self._cos = torch.empty(0)
        if self._fused and self._cos.shape[0] < self._max_len + SCRATCH:
            c = self.cfg
            table = rope_table(c.head_dim, c.rope_theta, self._max_len + SCRATCH, torch.device("cpu"))
            self._cos, self._sin = table[:, 0].contiguous(), table[:, 1].contiguous()
        if self._costs is None:
            self._set_costs(eagle_costs(target, self.cost_spec(target), self.pricer))
            self._steps, self._stored = StepTimings(cost_clock(target)), Stored(self._costs)

    def _set_costs(self, got: EagleCosts) -> None:
        self._costs, self._level, self._tree_extra, self._ingest = got.costs, got.level, got.tree_extra, got.ingest
        self._level_one = got.level_one

    def refine_costs(self, passes: Mapping[int, float]) -> list[Costs]:
        """Follow the live passes and this drafter's own timed steps (``sizing/live.py``); returns the figures to
        write back to the cost cache (when they moved past ``DISAGREE``× from it)."""
        if self._steps is None or self._costs is None:
            return []
        cur = EagleCosts(self._costs, self._level, self._tree_extra, self._ingest, self._level_one)
        got = refined_eagle_costs(cur, self._steps, passes, self.expand)
        if got is None:
            return []
        self._set_costs(got)
        return self._stored.changed(got.costs)

    def _row(self, row: int) -> _RowState:
        st = self._rows.get(row)
        if st is None or st.keys.shape[2] < self._max_len + SCRATCH:
            c, dev = self.cfg, self._target.device  # type: ignore[union-attr]
            z = torch.zeros(1, c.n_kv_heads, self._max_len + SCRATCH, c.head_dim, dtype=self._x, device=dev)
            st = self._rows[row] = _RowState(z, z.clone())
        return st

    def costs_for(self, target: "Model") -> Optional[Costs]:
        """None: the γ policy's chain model does not describe trees; this drafter plans with its own costs."""
        return None

    def cost_spec(self, target: "Model") -> CostSpec:
        """What the cost book times for this drafter (``cost_steps``) and what else changes those steps' cost."""
        c = self.cfg
        what = (f"eagle-tree|{c.dim}x{c.ffn}|vocab={c.draft_vocab_size}|expand={self.expand}|topk={self.topk}"
                f"|layers={c.aux_layers}|{self.runtime}")
        return CostSpec(what, (target,), steps=lambda: self.cost_steps(target), label="EAGLE's")

    def cost_steps(self, target: "Model") -> CostSteps:
        """The steps the cost book times for this drafter: the one-token tree pass with its hidden layers
        captured (``tree_steps``; wider passes: the target's shared v(n)); the ingestion of three positions right
        after a pass ("ingest", the draft's weights cold), then one tree level of ``expand`` nodes ("draft":
        c) and the next level of a chain, one node ("level_one"), as ``grow`` runs them (a tree step's extra
        over a chain step: ``tree_steps.TreeStep``, shared by the tree drafters)."""
        layers = self.hidden_layers
        shared = measure_context.borrow(target, layers)
        ids, cache, hidden = shared.ids, shared.cache, shared.hidden
        states = {k: shared.layers[k] for k in layers}
        with torch.inference_mode():
            ctx = DraftContext(list(ids) + [1], 8, SamplingConfig(), None, hidden, layers=states)
            self.reset_row(0)
            assert self.ingest(0, ctx) is not None
        st = self._row(0)
        n, m = len(ctx.tokens), self.expand
        toks, src, slot0, pos, anc = list(range(1, m + 1)), [0] * m, len(st.positions), [n - 1] * m, [0] * m
        # a step's ingestion: the pending token and two accepted ones, right after the target's pass
        recent = DraftContext(ctx.tokens, 8, ctx.sampling, None, hidden[-3:],
                              layers={k: v[-3:] for k, v in states.items()})

        def ingest() -> None:
            logits = self.ingest(0, recent)
            assert logits is not None
            self._children(logits)

        own = {"ingest": Step(ingest),
               "draft": Step(lambda: self._children(self._layer(st, toks, self._bank, src, 1, slot0, pos, anc))),
               "level_one": Step(lambda: self._children(self._layer(st, toks[:1], self._bank, src[:1], 1 + m,
                                                                    slot0 + m, pos[:1], [1])))}
        return CostSteps(one_token_pass(target, cache, shared.probe(PROBE), layers), 1, len(ids), own,
                         done=lambda: self.reset_row(0), target_v=True)

    @property
    def costs(self) -> Optional[Costs]:
        return self._costs

    def reset_row(self, row: int) -> None:
        st = self._rows.get(row)
        if st is not None:
            st.positions.clear()
            st.last = None

    def move_row(self, src: int, dst: int) -> None:
        self._rows.pop(dst, None)
        if src in self._rows:
            self._rows[dst] = self._rows.pop(src)

    def on_verified_row(self, row: int, n_accepted: int) -> None:
        """Nothing to roll back: the next proposal reads the accepted path off the tokens themselves."""

    def _observe(self, st: _RowState, ctx: DraftContext) -> None:
        """Calibrate edges with the row's last grown tree against the tokens the target wrote since."""
        if st.last is not None:
            base, toks, parents, probs = st.last
            st.last = None
            self.edges.observe_tree(ctx.tokens[base:], toks, parents, probs)

    # -- the draft layer at run time -----------------------------------------------------------------
    def _layer(self, st: _RowState, tokens: list[int], feats: torch.Tensor, src: list[int], dst: int, slot0: int,
               pos: list[int], anc: list[int], last_only: bool = False) -> torch.Tensor:
        """The draft layer over ``tokens``, token t reading feature row src[t] of ``feats`` (empty: row t),
        its key and value going to cache slot slot0 + t (RoPE at pos[t]). Without ``anc`` (ingestion) a
        chain: token t attends slots [0, slot0 + t]; with it, the prefix slots and the scratch slots of
        bit set anc[t] and its own. Outputs go to bank rows dst.. (the last token's only with
        ``last_only``); returns their draft-vocabulary logits."""
        c = self.cfg
        prefix = len(st.positions)
        if self._fused:
            fn, bf16 = self._native
            return self._ext.eagle_layer(self._weights, self._emb, tokens, feats, src, self._bank, dst, self._cos,
                                         self._sin, st.keys, st.values, 0, prefix, slot0, pos, anc, c.n_heads,
                                         c.n_kv_heads, c.head_dim, c.norm_eps, 1.0 / math.sqrt(c.head_dim), last_only,
                                         fn, bf16)
        rt, lin, m = self._rt, self._lin, len(tokens)
        dev = feats.device
        feat = feats[torch.tensor(src, dtype=torch.long, device=dev)] if src else feats
        emb = self._emb[torch.tensor(tokens, dtype=torch.long, device=dev)].to(self._x)
        q, kk, vv = rt.qkv(feat, emb, torch.tensor(pos, dtype=torch.long, device=dev), lin)
        st.keys[0, :, slot0 : slot0 + m] = kk.transpose(0, 1)
        st.values[0, :, slot0 : slot0 + m] = vv.transpose(0, 1)
        q0 = m - 1 if last_only else 0
        if anc:
            width = prefix + SCRATCH
            bits = torch.tensor([[(a | 1 << (slot0 + t - prefix)) >> j & 1 for j in range(SCRATCH)]
                                 for t, a in enumerate(anc)], dtype=torch.bool, device=dev)
            mask = torch.cat([torch.ones(m, prefix, dtype=torch.bool, device=dev), bits], dim=1)
        else:
            width = slot0 + m
            slots = torch.arange(width, device=dev)
            mask = slots.unsqueeze(0) <= (slot0 + torch.arange(m, device=dev)).unsqueeze(1)
        out = F.scaled_dot_product_attention(q[q0:].transpose(0, 1).unsqueeze(0), st.keys[:, :, :width],
                                             st.values[:, :, :width], attn_mask=mask[q0:],
                                             enable_gqa=c.n_kv_heads != c.n_heads)
        h = rt.finish(feat[q0:], out[0].transpose(0, 1).reshape(m - q0, -1), lin)
        self._bank[dst : dst + m - q0] = h
        return rt.logits(h, lin)

    def ingest(self, row: int, ctx: DraftContext) -> Optional[torch.Tensor]:
        """Run the draft layer over the newly verified positions (their keys join the row's cache);
        the draft-vocabulary logits [1, N] after the last one, whose output is bank row 0 (None: no features)."""
        if ctx.layers is None or ctx.hidden is None:
            return None
        k = len(ctx.hidden)
        n = len(ctx.tokens)
        if k == 0 or k > n - 1:
            return None
        st = self._row(row)
        aux = torch.cat([ctx.layers[i][-k:] for i in self.cfg.aux_layers], dim=-1).to(self._x)
        feat = self._lin(aux, self._fc, None)
        start = n - k - 1  # the features' positions: start .. n - 2
        slot0 = bisect_left(st.positions, start)  # a re-ingested position replaces its slot and those after it
        del st.positions[slot0:]
        logits = self._layer(st, ctx.tokens[n - k :], feat, [], 0, slot0, list(range(start, n - 1)), [],
                             last_only=True)
        st.positions.extend(range(start, n - 1))
        return logits

    def _children(self, logits: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
        """Top ``topk`` target ids and probabilities of the draft's law for each row of ``logits``."""
        if self._fused:
            idx, probs = self._ext.topk_softmax(logits, self.topk)
            ids = self._draft_list
            return [[ids[j] for j in row] for row in idx], probs
        p, idx = torch.softmax(logits.float(), -1).topk(min(self.topk, logits.shape[-1]), dim=-1)
        return self._rt.draft_ids[idx].tolist(), p.tolist()

    def _speedup(self, values: list[float], spent: float) -> tuple[int, float]:
        """(n, predicted speedup) of the best prefix of ``values`` (sorted) given draft cost ``spent``."""
        assert self._costs is not None
        return best_prefix(values, spent + self._tree_extra, self._costs)

    def _level_cost(self, m: int) -> float:
        return level_cost(m, self._level_one, self._level, self.expand)

    def _expansion(self, values: list[float], frontier: list[float], spent: float, cap: int) -> tuple[int, float]:
        """(m, predicted speedup) for expanding the m best of ``frontier`` (values, best first) next: each
        expanded node optimistically gets one child at the running top-1 acceptance, against the cost of
        a level of m nodes. The smallest m of the best prediction: a node that adds nothing is not paid for."""
        best_m, best_s = 0, 0.0
        for m in range(1, len(frontier) + 1):
            hyp = sorted(values + [v * self._top1 for v in frontier[:m]], reverse=True)[:cap]
            got = self._speedup(hyp, spent + self._level_cost(m))[1]
            if got > best_s * (1 + 1e-9):
                best_m, best_s = m, got
        return best_m, best_s

    def grow(self, row: int, ctx: DraftContext, logits: torch.Tensor) -> Draft:
        """The EAGLE-2 tree after ingestion (``logits``: the draft's law after the last verified position,
        whose output is bank row 0)."""
        st = self._row(row)
        n = len(ctx.tokens)
        cap = min(self.max_nodes, ctx.max_tokens)
        toks, probs = self._children(logits)
        rate = self.edges.rate
        k0 = len(toks[0])
        tree = GrowingTree(toks[0], [-1] * k0, probs[0], [rate(p, r == 0) for r, p in enumerate(probs[0])], [1] * k0,
                     [0] * k0, [0] * k0)
        used = 1  # bank rows holding features (row 0: the ingestion's output)
        scratch = 0  # scratch slots written by this tree's levels
        spent = self._ingest
        depth = 1
        prefix = len(st.positions)
        while depth < self.max_depth:
            order = sorted(range(len(tree.tokens)), key=lambda i: (-tree.values[i], tree.depths[i]))[:cap]
            now = [tree.values[i] for i in order]
            best_n, best_s = self._speedup(now, spent)
            frontier = sorted((i for i in range(len(tree.tokens)) if tree.depths[i] == depth),
                              key=lambda i: -tree.values[i])[: self.expand]
            m, gain = self._expansion(now, [tree.values[i] for i in frontier], spent, cap)
            frontier = frontier[:m]
            if (not frontier or gain <= best_s or len(tree.tokens) >= 4 * cap
                    or scratch + m > SCRATCH or used + m > BANK):
                break
            # one level: the frontier nodes through the draft layer, attending to prefix + ancestors
            t0 = self._steps.clock() if self._steps is not None else 0.0
            logits = self._layer(st, [tree.tokens[i] for i in frontier], self._bank, [tree.feats[i] for i in frontier],
                                 used, prefix + scratch, [n - 2 + depth] * m, [tree.ancestors[i] for i in frontier])
            toks, probs = self._children(logits)
            if self._steps is not None and m in (1, self.expand):
                self._steps.add("level_one" if m == 1 else "level", self._steps.clock() - t0)
            top1 = []
            for j, i in enumerate(frontier):
                anc = tree.ancestors[i] | 1 << (scratch + j)
                top1.append(rate(probs[j][0]))
                for rank, (t, p) in enumerate(zip(toks[j], probs[j])):
                    tree.tokens.append(t)
                    tree.parents.append(i)
                    tree.probs.append(p)
                    tree.values.append(tree.values[i] * rate(p, rank == 0))
                    tree.depths.append(depth + 1)
                    tree.feats.append(used + j)
                    tree.ancestors.append(anc)
            used += m
            scratch += m
            self._top1 = 0.95 * self._top1 + 0.05 * statistics.fmean(top1)
            spent += self._level_cost(m)
            depth += 1
        order = sorted(range(len(tree.tokens)), key=lambda i: (-tree.values[i], tree.depths[i]))[:cap]
        best_n, best_s = self._speedup([tree.values[i] for i in order], spent)
        self.last_sizes = (0, depth)
        st.last = (n, tree.tokens, tree.parents, tree.probs)  # the whole grown tree is judged, drafted or not
        # what the levels cost is spent either way (and ingesting is the price of keeping the draft's cache):
        # draft when the tree beats a plain pass after the same spending by the policy's margin
        if best_n == 0 or not self.pricer.pays(best_s * (spent + 1.0)):
            return Draft()
        chosen = order[:best_n]
        index = {node: k for k, node in enumerate(chosen)}
        parents = [index[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in chosen]
        tokens = [tree.tokens[i] for i in chosen]
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
                t0 = self._steps.clock() if self._steps is not None else 0.0
                logits = self.ingest(r, ctx) if ctx.max_tokens > 0 else None
                if self._steps is not None and logits is not None:
                    self._steps.add("ingest", self._steps.clock() - t0)
                drafts[r] = self.grow(r, ctx, logits) if logits is not None else Draft()
        return drafts


__all__ = ["EagleCosts", "EagleDrafter", "EdgeCalibration", "eagle_costs"]


EAGLE_DRAFT = Artifact("eagle", "an EAGLE-3 draft directory", "an EAGLE-3 draft directory",
                       "specdecode distill --method eagle --target TARGET --out DIR", lambda p: is_eagle_dir(p),
                       "--eagle-draft", bundled="code-eagle")


def _build(o: DrafterOptions) -> EagleDrafter:
    path = o.artifact(EAGLE_DRAFT.name)
    assert path is not None
    return EagleDrafter.load(path, gamma=o.gamma)


SPECS = (DrafterSpec(
    "eagle", "EAGLE-3 draft layer on the target's low/mid/high features (--heads DIR): an EAGLE-2 dynamic tree "
    "sized by the cost model", _build, artifacts=(EAGLE_DRAFT,), auto=AutoMember(1),
    bench=(BenchVariant("eagle", "EAGLE-3 draft layer, EAGLE-2 dynamic trees sized by the measured costs"),)),)
