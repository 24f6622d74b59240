"""Medusa drafting (Cai et al., arXiv:2401.10774, Medusa-1): K heads on the target's own hidden state
propose a token tree, verified by the target in one pass; no second model.

Per step and row: h = the target's final normed hidden state whose logits gave the newest token
x_n (``DraftContext.hidden[-1]``); head k's top candidates guess x_{n+k}. Every head reads the same
h, so a node's children are head (depth + 1)'s candidates whatever the node: a tree is a set of
rank paths (r_1, ..., r_d), node token = head d's rank-r_d candidate. Candidates are deterministic
(``probs=None``): greedy verification follows the target's argmax down the tree; under sampling the
core's tree rule tries children in order against the residual law, which is exact.

**The tree's size and shape come from the cost model.** On a CPU a node is not free: a pass over
n + 1 tokens costs v(n) one-token passes (the target's measured v, ``cost_steps``), and the
heads cost c of one. With p[d][r], the running probability that head d's rank-r candidate is the
target's token given the path to its parent was (``RankAcceptance``), a node's chance to be on the
accepted path is the product of p along its rank path, and

    E[accepted path length + 1] = 1 + Σ_nodes Π_{(d, r) on the node's path} p[d][r].

Taking nodes best-first by that product (a child never beats its parent, so every prefix of the
order is a tree, and the best tree of each size n) gives E(n) for n = 1..63; the drafter proposes
the n maximising E(n) / (c + v(n) + t), and nothing when no n beats plain decoding by the policy's
margin. t is what a tree step costs beyond a chain step of the same width (the core builds its mask
and compacts the accepted path; measured too): the best chain (rank 0 at every depth, t = 0)
competes with the best tree, so a tree is drafted only where its extra candidates pay for it. With
B rows drafting together the pass is [B, n + 1]; its cost is read as v of B(n + 1)
tokens against v of B (plain), so trees narrow as the batch grows. Chain mode (``tree=False``) is
the same rule restricted to rank 0 (the top-1 of each head, ``parents=None``). The acceptance table
and the planning are in ``medusa_tree.py``; the cost model times the steps ``cost_steps`` hands it.

p starts from the held-out table in ``medusa_config.json`` and follows what the target actually
wrote: each proposal remembers every head's top candidates, and once the next K tokens are known
the rank of each true token is counted (for depth d only while depths < d were covered), whether
or not the node was in the tree, so the estimate does not depend on the shapes chosen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ..sizing import measure_context
from ..config import ConfigError
from ..sizing.book import CostSpec
from ..sizing.costs import CostSteps, Costs, Step, cost_clock
from ..sizing.estimate import ProbeSchedule
from ..kernels.quant import QUANT_FORMATS, pack_draft
from ..draft import Draft, DraftContext
from .base import Acceptance, Gamma, RowZeroAdapter, check_gamma
from .medusa_heads import MedusaConfig, check_fits, load_heads
from .medusa_tree import (MAX_NODES, NO_TREE, RANKS, RankAcceptance, TreePlan, best_first, fixed_plan,
                          plan_tree)
from ..sizing.live import Stored, StepTimings, follows, live_v, unit_seconds
from ..sizing.pricer import Pricer
from .tree_steps import PROBE, measured_tree_extra, one_token_pass
from .vocab import VocabSpec, parse_vocab_spec, read_vocab_file
from .plugin import Artifact, AutoMember, BenchVariant, DrafterOptions, DrafterSpec, has_file

if TYPE_CHECKING:
    from ..models import Model

QUANT = "int8"  # the heads' and output rows' format at run time on the fast CPU path (drafts only)
REPLAN_EVERY = 8  # proposals between tree re-plans (a plan costs ~0.1 ms)
# while no tree pays, the heads still run now and then to keep evidence fresh (and, with measured costs, draft the
# best plan, so its width gets timed): after PROBE_FIRST steps, then twice as long after each probe, up to PROBE_MAX
# (a probe every 8 steps cost 3% of plain decoding on SmolLM2, AVX2, where the shipped heads never paid)
PROBE_FIRST, PROBE_MAX = 8, 256
__all__ = ["MAX_NODES", "NO_TREE", "MedusaDrafter", "RankAcceptance", "TreePlan", "best_first", "fixed_plan",
           "tree_costs", "plan_tree"]
log = logging.getLogger(__name__)


# -- costs -----------------------------------------------------------------------------------------
def tree_costs(target: "Model", spec: CostSpec, pricer: Pricer) -> tuple[Costs, float]:
    """(costs, tree_extra) from ``pricer``'s cost book (measured once per machine, target and heads
    shape, then cached): ``costs.v[k]`` of a tree pass over k + 1 tokens, ``costs.c`` of
    one row's heads, ``tree_extra`` of a tree step beyond a chain step, over a one-token pass."""
    return pricer.costs(target, spec), measured_tree_extra(target, pricer)


# -- the drafter -----------------------------------------------------------------------------------
@dataclass
class _Record:
    base: int  # sequence length when proposed (the pending token is tokens[base - 1])
    candidates: list[list[int]]  # [K][RANKS] token ids, best first


class MedusaDrafter(RowZeroAdapter):
    """Medusa heads as a ``BatchDrafter``: tree (default) or chain drafts from one hidden state per row.

    ``gamma``: the most nodes per draft ("auto": up to ``MAX_NODES``; the cost model picks fewer).
    ``vocab``: the proposal vocabulary ("auto": the heads directory's ``draft_vocab.json`` cut,
    "full", or N). ``choices``: a fixed tree as rank paths instead of the cost model's (ablations,
    tests). ``costs`` and ``tree_extra``: measured costs to use instead of measuring (tests). ``quant``:
    the heads' and output rows' format at run time on the fast CPU path ("int8": Q8_0, c 0.130 -> 0.079
    of a target pass on the bundled target; None: the target's weight dtype). Drafts only: outputs stay exact."""

    wants_hidden = True
    sizes_itself = True  # plans its own trees (see BatchDrafter)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, config: MedusaConfig, *, tree: bool = True,
                 gamma: Gamma = "auto", vocab: VocabSpec = "auto", source: Optional[Union[str, Path]] = None,
                 choices: Optional[Sequence[Sequence[int]]] = None, costs: Optional[Costs] = None,
                 tree_extra: float = 0.0, quant: Optional[str] = QUANT) -> None:
        gamma = check_gamma(gamma, "gamma (most Medusa tree nodes)")
        if quant is not None and quant not in QUANT_FORMATS:
            raise ConfigError(f"quant (the Medusa heads' run-time weights) must be None or one of "
                              f"{', '.join(QUANT_FORMATS)}, got {quant!r}")
        self.quant = quant
        self.runtime = "dense"  # the heads' format at run time (the cost cache's key)
        self.config = config
        self.num_heads, self.dim = config.num_heads, config.dim
        self.tree = tree
        self.max_nodes = MAX_NODES if gamma == "auto" else min(int(gamma), MAX_NODES)
        self.gamma: Gamma = self.max_nodes  # a cap, not a γ for the chain policy: the drafter plans its own trees
        self.source = str(source) if source is not None else None
        self.vocab_spec = parse_vocab_spec(vocab)
        self._weight, self._bias = weight, bias
        self.acceptance = Acceptance()  # the core's chain-shaped evidence (reported, not planned with)
        self.stats = RankAcceptance(self.num_heads, RANKS, config.rank_acceptance or None)
        self._fixed = fixed_plan(choices) if choices is not None else None
        if self._fixed is not None and self._fixed.depth > self.num_heads:
            raise ConfigError(f"Medusa tree choices reach depth {self._fixed.depth} but there are only "
                              f"{self.num_heads} heads")
        if self._fixed is not None and not tree and any(r for p in self._fixed.paths for r in p):
            raise ConfigError("chain mode takes rank-0 choices only, e.g. [[0], [0, 0]]")
        self._costs, self._tree_extra = costs, tree_extra
        self._steps: Optional[StepTimings] = None  # the heads timed live (None: costs given, kept fixed)
        self._stored = Stored(None)  # what its cost cache file holds
        self._target: Optional["Model"] = None
        self._records: dict[int, list[_Record]] = {}
        self._plans: dict[tuple[int, int], tuple[int, TreePlan]] = {}
        self._probes = ProbeSchedule(PROBE_FIRST, 2, PROBE_MAX)  # when the heads are probed while nothing pays
        self._said_off = False  # whether the log already says why nothing is drafted (once per target)
        self._probe_nodes: Optional[int] = None  # nodes a probe drafts (fixed per target: see _probe_plan)
        self.last_plan: TreePlan = NO_TREE
        self.vocab_rows = 0

    @classmethod
    def load(cls, path: Union[str, Path], *, tree: bool = True, gamma: Gamma = "auto", vocab: VocabSpec = "auto",
             choices: Optional[Sequence[Sequence[int]]] = None, costs: Optional[Costs] = None,
             quant: Optional[str] = QUANT) -> "MedusaDrafter":
        """Heads from a directory written by ``specdecode distill --method medusa``."""
        config, sd = load_heads(path)
        return cls(sd["weight"], sd["bias"], config, tree=tree, gamma=gamma, vocab=vocab, source=path,
                   choices=choices, costs=costs, quant=quant)

    # -- setup -------------------------------------------------------------------------------------
    def prepare_rows(self, target: "Model", rows: int, max_len: int) -> None:
        """Check the heads fit ``target`` and lay their weights out for its kernels (once per target)."""
        if target is self._target:
            return
        where = self.source or "the given heads"
        check_fits(self.config, target, where)
        fast = target.kernels.fast
        wdt = target.weight_dtype
        self._lin = target.kernels.linear
        self._x_dtype = torch.float32 if fast else target.dtype
        self._w = self._weight.reshape(self.num_heads * self.dim, self.dim).to(target.device, wdt).contiguous()
        self._b = self._bias.reshape(-1).to(target.device, torch.float32 if fast else wdt).contiguous()
        ids = self._vocab_ids(target)
        out = target.output_matrix()
        self._ids = ids
        self._out = out.index_select(0, ids).contiguous() if ids is not None else out
        self.vocab_rows = int(self._out.shape[0])
        self.runtime = "dense"
        if fast and target.device.type == "cpu" and target.quant is None:
            kernels, mats, fmt = pack_draft(target.kernels, self.quant, {"w": self._w, "out": self._out}, "medusa")
            if fmt is not None:
                self._lin, self._w, self._out, self.runtime = kernels.linear, mats["w"], mats["out"], fmt
        self._target = target
        self._said_off, self._probe_nodes = False, None
        if self._costs is None and self._fixed is None:
            self._costs, self._tree_extra = tree_costs(target, self.cost_spec(target), self.pricer)
            self._steps, self._stored = StepTimings(cost_clock(target)), Stored(self._costs)
        self._plans.clear()

    def refine_costs(self, passes: Mapping[int, float]) -> list[Costs]:
        """Follow the live passes and the heads' own timings (``sizing/live.py``); returns the figures to write
        back to the cost cache (when they moved past ``DISAGREE``× from it)."""
        if self._steps is None or self._costs is None:
            return []
        cur = self._costs
        costs = live_v(cur, passes) or cur
        unit = unit_seconds(costs, passes)
        c = self._steps.ratio("draft", unit) if unit is not None else None
        if c is not None and follows(c, cur.c):
            costs = replace(costs, c=c, draft_s=c * unit if unit is not None else cur.draft_s)
        if costs is cur:
            return []
        self._costs = costs
        self._plans.clear()
        return self._stored.changed(costs)

    def _vocab_ids(self, target: "Model") -> Optional[torch.Tensor]:
        spec = self.vocab_spec
        if spec == "full":
            return None
        data = read_vocab_file(self.source) if self.source is not None else None
        if data is None:
            if spec == "auto":
                return None
            raise ConfigError(f"--draft-vocab {spec} for Medusa needs the heads' token ranking draft_vocab.json in "
                              f"{self.source or 'the heads directory'}; retrain the heads or use --draft-vocab full")
        ranked = data["token_ids"]
        n = min(int(data.get("size", len(ranked))) if spec == "auto" else int(spec), len(ranked))
        if n >= target.vocab_size:
            return None
        if any(not 0 <= t < target.vocab_size for t in ranked[:n]):
            raise ConfigError(f"{self.source}/draft_vocab.json lists token ids outside the target's vocabulary")
        return torch.tensor(sorted(ranked[:n]), dtype=torch.long, device=target.device)

    def costs_for(self, target: "Model") -> Optional[Costs]:
        """None: the γ policy's chain model does not describe trees; this drafter plans with its own costs."""
        return None

    def cost_spec(self, target: "Model") -> CostSpec:
        """What the cost book times for this drafter (``cost_steps``) and what else changes those steps' cost."""
        what = f"medusa-tree|heads={self.num_heads}x{self.dim}|vocab={self.vocab_rows}|{self.runtime}"
        return CostSpec(what, (target,), steps=lambda: self.cost_steps(target), label="Medusa's")

    def cost_steps(self, target: "Model") -> CostSteps:
        """The one-token tree pass as the core runs it (``tree_steps``; wider passes: the target's shared
        v(n)) and one row's heads (all K, with their top candidates) as the step named "draft"
        (what the cost book times)."""
        shared = measure_context.borrow(target)
        h = shared.hidden[-1:]  # the heads read one hidden state (its values barely matter)
        return CostSteps(one_token_pass(target, shared.cache, shared.probe(PROBE)), 1, len(shared.ids),
                         {"draft": Step(lambda: self.candidates(h))}, target_v=True)

    @property
    def costs(self) -> Optional[Costs]:
        return self._costs

    @property
    def tree_extra(self) -> float:
        return self._tree_extra

    def reset_row(self, row: int) -> None:
        self._records.pop(row, None)

    def move_row(self, src: int, dst: int) -> None:
        self._records.pop(dst, None)
        if src in self._records:
            self._records[dst] = self._records.pop(src)

    def on_verified_row(self, row: int, n_accepted: int) -> None:
        """Nothing to roll back: the heads keep no cache; evidence is read from the sequence itself."""

    # -- drafting ------------------------------------------------------------------------------------
    def candidates(self, h: torch.Tensor, ranks: int = RANKS) -> torch.Tensor:
        """[B, dim] hidden states -> [B, K, ranks] token ids, each head's best first (one product for all
        heads and rows, then one through the output matrix)."""
        b = h.shape[0]
        x = h.to(self._x_dtype)
        z = self._lin(x, self._w, self._b).view(b, self.num_heads, self.dim)
        feats = (F.silu(z) + x.unsqueeze(1)).reshape(b * self.num_heads, self.dim)
        logits = self._lin(feats, self._out)
        top = logits.topk(min(ranks, logits.shape[-1]), dim=-1).indices
        if self._ids is not None:
            top = self._ids[top]
        return top.view(b, self.num_heads, -1)

    def _observe(self, row: int, tokens: list[int]) -> None:
        """Count the ranks of the true tokens for past proposals whose K next tokens are now known."""
        recs = self._records.get(row)
        if not recs:
            return
        n, k = len(tokens), self.num_heads
        if recs[-1].base > n:  # a different sequence in this row without a reset: start over
            del self._records[row]
            return
        while recs and recs[0].base + k <= n:
            rec = recs.pop(0)
            ranks = []
            for d in range(k):
                true = tokens[rec.base - 1 + d + 1]
                cands = rec.candidates[d]
                ranks.append(cands.index(true) if true in cands else RANKS)
            self.stats.observe(ranks)

    def _plan(self, rows: int, cap: int) -> TreePlan:
        if self._fixed is not None:
            return self._fixed
        assert self._costs is not None
        key = (rows, cap)
        got = self._plans.get(key)
        if got is None or self.stats.version - got[0] >= REPLAN_EVERY:
            plan = plan_tree(self.stats.table(), self._costs, cap, self.pricer.margin, chain=not self.tree, rows=rows,
                             tree_extra=self._tree_extra)
            got = self._plans[key] = (self.stats.version, plan)
        return got[1]

    def _best_plan(self, rows: int, cap: int) -> TreePlan:
        """The plan with the best predicted speedup, whatever the margin (probes, and why nothing pays)."""
        if self._fixed is not None:
            return self._fixed
        assert self._costs is not None
        return plan_tree(self.stats.table(), self._costs, cap, 0.0, chain=not self.tree, rows=rows,
                         tree_extra=self._tree_extra)

    def _probe_plan(self, rows: int, cap: int) -> TreePlan:
        """The best-first tree of the size the first probe's best plan had: one width every probe, so its live
        timing gets trusted (``sizing.live.TRUST`` passes) while the best plan's size drifts with the evidence."""
        if self._probe_nodes is None:
            self._probe_nodes = max(1, len(self._best_plan(rows, cap).paths))
        nodes = best_first(self.stats.table(), min(self._probe_nodes, cap), chain=not self.tree)
        return fixed_plan([path for _, path in nodes]) if nodes else NO_TREE

    def _say_off(self, rows: int, cap: int) -> None:
        """Once per target, why nothing is drafted: a user who asked for Medusa would otherwise see
        0 tokens drafted and no reason (on AVX2 the shipped SmolLM2 heads never pay)."""
        if self._said_off or self._costs is None:
            return
        self._said_off = True
        best = self._best_plan(rows, cap)
        together = f" with {rows} rows drafting together" if rows > 1 else ""
        predicted = f"predicted at {best.speedup:.2f}x" if best.paths else "no faster than"
        log.info("%s: drafting nothing for now (its best draft is %s plain decoding on this target%s, under the "
                 "%.2fx speculation needs: head 1 right %.0f%% of the time, the heads cost %.2f of a target "
                 "pass); a probe every %d-%d steps checks it", "medusa" if self.tree else "medusa-chain",
                 predicted, together, self.pricer.margin, 100 * self.stats.table()[0][0], self._costs.c,
                 PROBE_FIRST, PROBE_MAX)

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        """Candidates for every row that has a hidden state, shaped by one plan for all of them."""
        if self._target is None:
            raise RuntimeError("MedusaDrafter.prepare(target) must be called before propose()")
        drafts = {r: Draft() for r in contexts}
        ready = {r: c for r, c in contexts.items() if c.hidden is not None and len(c.hidden) > 0 and c.max_tokens > 0}
        for r, c in contexts.items():
            self._observe(r, c.tokens)
        if not ready:
            return drafts
        cap = min(self.max_nodes, max(c.max_tokens for c in ready.values()))
        plan = self.last_plan = self._plan(len(ready), cap)
        if not plan.paths:
            self._say_off(len(ready), cap)
            self._probes.plain()
            if not self._probes.due():
                return drafts  # nothing pays: plain decoding, with a probe of the heads now and then
            self._probes.drafted(probe=True)
            if self._steps is not None:
                # with measured costs a probe drafts below the margin too: its pass times a width that a cache timed
                # under load overstates and nothing else would run (Medusa on SmolLM2 drafted 0 tokens for good);
                # ``refine_costs`` then follows the live figure
                plan = self._probe_plan(len(ready), cap)
        else:
            self._probes.drafted()
            self._probes.restart()
        rows = list(ready)
        t0 = self._steps.clock() if self._steps is not None else 0.0
        with torch.inference_mode():
            h = torch.stack([ready[r].hidden[-1] for r in rows])  # type: ignore[index]
            top = self.candidates(h).tolist()
        if self._steps is not None and len(rows) == 1:
            self._steps.add("draft", self._steps.clock() - t0)
        for r, cands in zip(rows, top):
            ctx = ready[r]
            recs = self._records.setdefault(r, [])
            recs.append(_Record(len(ctx.tokens), cands))
            if len(recs) > self.num_heads + 1:
                recs.pop(0)
            n = min(len(plan.paths), ctx.max_tokens)
            if n == 0:
                continue
            paths = plan.paths[:n]  # a prefix of a best-first order is still a tree
            tokens = [cands[len(p) - 1][p[-1]] for p in paths]
            drafts[r] = Draft(tokens, None, None if plan.is_chain else list(plan.parents[:n]))
        return drafts


MEDUSA_HEADS = Artifact("medusa", "a Medusa heads directory", "Medusa heads",
                        "specdecode distill --method medusa --target TARGET --out DIR", has_file("medusa_config.json"),
                        "--medusa-heads", bundled="code-medusa")


def _builder(tree: bool) -> Callable[[DrafterOptions], MedusaDrafter]:
    def build(o: DrafterOptions) -> MedusaDrafter:
        path = o.artifact(MEDUSA_HEADS.name)
        assert path is not None
        return MedusaDrafter.load(path, tree=tree, gamma=o.gamma, vocab=o.vocab)

    return build


SPECS = (
    DrafterSpec("medusa", "Medusa heads on the target's hidden state (--heads DIR): a token tree sized by the cost "
                "model", _builder(True), artifacts=(MEDUSA_HEADS,), auto=AutoMember(2),
                bench=(BenchVariant("medusa", "Medusa heads, a token tree sized each step by the measured v(nodes) "
                                    "and running α by depth"),)),
    DrafterSpec("medusa-chain", "Medusa heads, top-1 of each head as a chain (--heads DIR)", _builder(False),
                artifacts=(MEDUSA_HEADS,),
                bench=(BenchVariant("medusa-chain", "Medusa heads, top-1 of each head as a chain, length by the "
                                    "same cost model"),)),
)
