"""Suffix drafting across requests (SuffixDecoding, Oliaro et al., arXiv:2411.04975): no model, no training.

Agents and editors repeat themselves: the same tool-call format, the same file with one line
changed, the same answer skeleton. The drafter matches the sequence's current suffix against

* the row's own sequence (prompt + output so far),
* every earlier output this drafter has seen (all rows of the instance: the server's requests),
* and, when the target has one, a datastore of its own answers to other prompts (``suffix_store.py``),
  used where it matches more than ``STORE_LEAD`` tokens longer than the live text (or the live text does
  not match at all): a longer live match is the better guess, the row's own text being about this request;

and proposes a TREE of the most frequent continuations of the longest match: a node's frequency
is the share of matched occurrences that continue with its path. Candidates are deterministic
(``probs=None``), so greedy verification follows the target's argmax down the tree and the sampled
tree rule (``verify.rejection_sample_tree``) stays exact.

**The structure** (``SuffixIndex``, in ``suffix_index.py``) is a hashed suffix index with bounded memory.

**The tree's size** follows the paper's adaptive rule (at most ``spec_factor`` x match length
nodes, nodes below ``min_prob`` dropped) and the cost model: nodes are taken best-first by
frequency, a node at depth d worth frequency x q^d expected accepted tokens, where q (``conf``) is the
running rate at which a verified depth is accepted, per match-length bucket: accepted tokens over the
depths the target examined (the accepted ones and the first rejected one), each weighted by the
tree's frequency there. It is the chain α of the cost model, so one rejected 15-node chain counts as
one failed depth, not 15 (a ratio of accepted to predicted nodes read a long-match bucket at 0.1
after one such miss and kept auto plain for 115 steps of a verbatim copy on SmolLM2's code prompts).
The drafter proposes the prefix maximising E(n) / (c + v(n) [+ tree overhead]) and nothing unless that
beats plain decoding by the policy's margin. With no match it proposes nothing (a plain step) at the cost of
one dictionary lookup, which is why it does not slow down non-repetitive text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config import ConfigError
from ..sizing.book import target_spec
from ..sizing.costs import Costs, cost_clock, expected_tokens
from ..sizing.estimate import Estimate
from ..draft import Draft, DraftContext
from .base import Acceptance, Gamma, RowZeroAdapter, check_gamma
from ..sizing.live import Stored, Timings, live_v
from .plugin import Artifact, AutoMember, BenchVariant, DrafterOptions, DrafterSpec
from .suffix_index import DEFAULT_MAX_TOKENS, SuffixIndex, SuffixTree, continuation_tree, top_chain
from .suffix_store import StoreIndex, is_store_dir, load_store

if TYPE_CHECKING:
    from ..models import Model

MAX_NODES = 15  # default most nodes per tree ("auto"): v(k) is measured up to 16 tokens a pass
# a tree step's extra cost over a chain of the same width (mask, compaction), in passes (Medusa measures 0.07-0.12
# on the bundled target)
TREE_EXTRA = 0.1
BUCKETS = (1, 2, 3, 4, 6, 10, 16)  # match-length buckets for the calibration
# q's prior per bucket: a longer match continues more reliably (rounded from the per-bucket acceptance measured
# on SmolLM2-135M's real-workload chats)
CONF_PRIOR = (0.4, 0.6, 0.7, 0.7, 0.8, 0.9, 0.95)
CONF_WEIGHT, CONF_MEMORY = 4.0, 200.0  # the prior is worth 4 examined depths; the memory, in examined depths
Q_MAX = 0.99  # q is capped below 1: E(n) of a certain chain then still grows with n, but not without bound
# share of the way back to the prior a bucket's figures go at each match it does not draft on: a bucket that
# read low (a few early rejections) would otherwise never draft, so never gather the evidence to recover; it
# drafts again after a few hundred such matches, and new rejections bring it down at once (a faster return
# drafts more, but the extra drafts are marginal)
IDLE_AGE = 1.0 / 128
OWN_WINDOW = 16  # the drafter's own step cost: the median of this many recent steps
# the datastore's match must beat the live text's (own sequence, earlier outputs) by more than this many tokens:
# a long answer's own repeats predict it better than other answers' phrases, and past a lead of 2 acceptance no
# longer rises
STORE_LEAD = 2


def _bucket(match_len: int) -> int:
    b = 0
    for i, lo in enumerate(BUCKETS):
        if match_len >= lo:
            b = i
    return b


def _slot(match_len: int, stored: bool) -> int:
    """The calibration slot: the match-length bucket, the datastore's after the live text's."""
    return _bucket(match_len) + (len(BUCKETS) if stored else 0)


# -- the drafter -----------------------------------------------------------------------------------
@dataclass
class _RowState:
    local: SuffixIndex  # the row's own sequence (prompt + output)
    doc: int  # the row's own document in the local index
    out_doc: int  # the row's output in the shared index
    synced: int  # tokens of the sequence already indexed
    prompt_len: int
    pending: tuple[int, list[float]] | None = None  # (calibration slot, Σ frequency per depth) of the proposal
    chain: list[int] | None = None  # that proposal's tokens when it is a chain (accepted ones are known then)


class SuffixDrafter(RowZeroAdapter):
    """A ``BatchDrafter`` proposing frequency-ranked continuation trees from a suffix index shared by
    all of its rows (the server's requests), plus each row's own sequence.

    ``gamma``: most nodes per proposal ("auto": ``MAX_NODES``; the cost model picks fewer).
    ``max_tokens``: the shared index's bound. ``tree=False``: chains only (the most frequent path).
    ``costs``: v(k) of the target to plan with instead of measuring (tests). ``store``: a datastore directory
    (``suffix_store``), loaded when the target is known; its matches are calibrated apart from the live ones."""

    wants_hidden = False
    sizes_itself = True  # plans its own trees (see BatchDrafter)

    def __init__(self, gamma: Gamma = "auto", *, max_tokens: int = DEFAULT_MAX_TOKENS, tree: bool = True,
                 spec_factor: float = 4.0, min_prob: float = 0.1,
                 costs: Costs | None = None, store: str | None = None) -> None:
        gamma = check_gamma(gamma, "gamma (most suffix tree nodes)")
        if spec_factor <= 0 or not 0.0 <= min_prob <= 1.0:
            raise ConfigError("suffix drafting needs spec_factor > 0 and min_prob in [0, 1]")
        self.max_nodes = MAX_NODES if gamma == "auto" else int(gamma)
        self.gamma: Gamma = self.max_nodes  # a cap: the drafter sizes its own trees
        self.shared = SuffixIndex(max_tokens)
        self.tree, self.spec_factor, self.min_prob = tree, spec_factor, min_prob
        self.acceptance = Acceptance()  # the core's chain-shaped evidence (reported, not planned with)
        self._costs, self._costs_fixed = costs, costs is not None
        self._stored = Stored(None)  # what the target's cost cache file holds
        self._rows: dict[int, _RowState] = {}
        # q per match-length bucket (accepted over examined depths): the live text's, then the datastore's; the
        # prior is a starting guess the evidence replaces
        self._conf = [Estimate(q, CONF_WEIGHT, CONF_MEMORY, forgets_prior=True) for q in CONF_PRIOR + CONF_PRIOR]
        self.store_dir = store
        self.store: StoreIndex | SuffixIndex | None = None  # loaded with the target (its vocabulary is checked)
        # its own cost per row and step, in one-token target passes: the median of its recent steps
        self._own = Timings(OWN_WINDOW, 0.5)
        self._clock: Callable[[], float] = time.perf_counter
        self._t1 = 0.0
        self._target: Model | None = None
        self._pays: dict[tuple[int, int, int], tuple[float, float, bool]] = {}  # _may_pay's memo

    # -- setup -------------------------------------------------------------------------------------
    def prepare_rows(self, target: Model, rows: int, max_len: int) -> None:
        """Costs once per target. The index is per model: another checkpoint's token ids mean other text,
        so a new target (by path and vocabulary) starts it afresh."""
        if target is self._target:
            return
        if self._target is not None and (str(self._target.path), self._target.vocab_size) != \
                (str(target.path), target.vocab_size):
            self.forget()
        self._target = target
        if self.store_dir is not None:
            self.store = load_store(self.store_dir, target.vocab_size)
        if self._costs is None:
            self._costs = self.pricer.costs(target, target_spec(target))
        if not self._costs_fixed:
            self._stored = Stored(self._costs)
        self._clock = cost_clock(target)
        self._t1 = self._costs.target_s[0] if self._costs.target_s else 0.0

    def costs_for(self, target: Model) -> Costs | None:
        """None: the chain γ policy does not describe these trees; the drafter plans its own."""
        return None

    def refine_costs(self, passes: Mapping[int, float]) -> list[Costs]:
        """The target's v(n) following the live passes (``sizing/live.py``; this drafter's own cost is timed on
        every step already); returns the figures to write back to the cost cache (past ``DISAGREE``×)."""
        new = live_v(self._costs, passes) if self._costs is not None and not self._costs_fixed else None
        if new is None:
            return []
        self._costs, self._t1 = new, new.target_s[0]
        self._pays.clear()
        return self._stored.changed(new)

    @property
    def _c(self) -> float:
        return self._own.estimate if self._own.n else 0.0

    def reset_row(self, row: int) -> None:
        self._rows.pop(row, None)

    def move_row(self, src: int, dst: int) -> None:
        self.reset_row(dst)
        if src in self._rows:
            self._rows[dst] = self._rows.pop(src)

    def forget(self) -> None:
        """Drop every earlier output (a benchmark's next repetition must not see the previous one's); the
        datastore stays: it holds no request's text."""
        self.shared.clear()
        self._rows.clear()

    # -- evidence ------------------------------------------------------------------------------------
    def on_verified_row(self, row: int, n_accepted: int) -> None:
        """Calibration: accepted tokens against the depths the target examined (those accepted and the first
        rejected one, each weighted by the tree's frequency there) for the proposal's match-length bucket.
        The verified tokens themselves are indexed at the row's next proposal (the context holds them)."""
        st = self._rows.get(row)
        if st is None or st.pending is None:
            return
        b, per_depth = st.pending
        st.pending = None
        if st.chain is not None and n_accepted:  # index them now: a request's last step is seen nowhere else
            self._index(st, st.chain[:n_accepted])
            st.chain = None
        self._conf[b].add(n_accepted, sum(per_depth[:n_accepted + 1]))

    def _age(self, b: int) -> None:
        """A match not drafted on: slot ``b``'s evidence ages toward the prior (``IDLE_AGE``)."""
        self._conf[b].age(IDLE_AGE)

    def conf(self, match_len: int, stored: bool = False) -> float:
        """q: the chance that a depth of this match length's tree is accepted, given its parent was
        (``stored``: a match in the datastore)."""
        return min(Q_MAX, max(0.02, self._conf[_slot(match_len, stored)].mean))

    def _sync(self, row: int, tokens: list[int]) -> _RowState:
        st = self._rows.get(row)
        if st is None or len(tokens) < st.synced:  # a new sequence in this row
            local = SuffixIndex(max_tokens=1 << 30)
            st = self._rows[row] = _RowState(local, local.new_doc(), self.shared.new_doc(), 0, len(tokens))
        if len(tokens) > st.synced:
            self._index(st, tokens[st.synced:])
        return st

    def _index(self, st: _RowState, new: Sequence[int]) -> None:
        """Append the row's next tokens to its own index and, past the prompt, to the shared one."""
        st.local.append(st.doc, new)
        skip = max(0, st.prompt_len - st.synced)
        if len(new) > skip:
            self.shared.append(st.out_doc, new[skip:])
        st.synced += len(new)

    # -- drafting ------------------------------------------------------------------------------------
    def _may_pay(self, match_len: int, stored: bool, cap: int, rows: int) -> bool:
        """Whether a tree of at most ``cap`` nodes at this match's confidence could beat the margin."""
        assert self._costs is not None
        key = (_slot(match_len, stored), cap, rows)
        got = self._pays.get(key)
        conf = self.conf(match_len, stored)
        if got is None or abs(got[0] - conf) > 0.01 or abs(got[1] - self._c) > 0.01:
            costs = self._costs
            plain = costs.v_at(rows - 1)
            # the best tree of n nodes is a certain chain: E = 1 + q + ... + q^n
            pays = any(expected_tokens(conf, n) * plain / (rows * self._c + costs.v_at(rows * (n + 1) - 1))
                       > self.pricer.margin for n in range(1, cap + 1))
            got = self._pays[key] = (conf, self._c, pays)
        return got[2]

    def candidates(self, row: int, tokens: list[int], max_nodes: int, rows: int = 1) -> SuffixTree | None:
        """The continuation tree of the row's longest match (its own sequence, earlier outputs, the datastore)."""
        st = self._sync(row, tokens)
        found = [st.local.lookup(tokens), self.shared.lookup(tokens, exclude=st.out_doc)]
        sources: list[StoreIndex | SuffixIndex] = [st.local, self.shared]
        m = max(found[0][0], found[1][0])
        stored = False
        if self.store is not None:
            m_store, hits_store = self.store.lookup(tokens)
            if m_store > 0 and (m == 0 or m_store > m + STORE_LEAD):
                found, sources, m, stored = [(m_store, hits_store)], [self.store], m_store, True
        if m == 0:
            return None
        cap = min(max_nodes, max(1, int(self.spec_factor * m)))
        if not self._may_pay(m, stored, cap, rows):
            self._age(_slot(m, stored))
            return None  # even if every node were certain, this match's calibration could not pay
        conts = [src.continuation(d, e, cap) for src, (mi, hits) in zip(sources, found) if mi == m for d, e in hits]
        conts = [c for c in conts if c]
        if not conts:
            return None
        tree = (continuation_tree if self.tree else top_chain)(conts, cap, self.min_prob, m)
        tree.stored = stored
        return tree

    def plan(self, tree: SuffixTree, rows: int = 1) -> tuple[int, float]:
        """(nodes, predicted tokens per pass) of the best-paying prefix of ``tree``; (0, 1.0) if none pays."""
        assert self._costs is not None
        costs, conf = self._costs, self.conf(tree.match_len, tree.stored)
        plain = costs.v_at(rows - 1)
        best_n, best_s, best_e, e = 0, self.pricer.margin, 1.0, 1.0
        chain = True
        for n, (f, p, d) in enumerate(zip(tree.freqs, tree.parents, tree.depths), start=1):
            e += f * conf ** d
            chain = chain and p == n - 2
            extra = 0.0 if chain else TREE_EXTRA
            s = e * plain / (rows * (self._c + extra) + costs.v_at(rows * (n + 1) - 1))
            if s > best_s:
                best_n, best_s, best_e = n, s, e
        return best_n, best_e

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        if self._costs is None:
            raise RuntimeError("SuffixDrafter.prepare_rows(target, ...) must be called before proposing")
        out: dict[int, Draft] = {}
        rows = max(1, len(contexts))
        for r, ctx in contexts.items():
            st = self._rows.get(r)
            steady = st is not None and len(ctx.tokens) - st.synced <= MAX_NODES + 1  # not a prompt's indexing
            t0 = self._clock()
            out[r] = self._propose_one(r, ctx, rows)
            if self._t1 > 0 and steady:  # c is the per-step cost; indexing a prompt is once per request
                self._own.add((self._clock() - t0) / self._t1)
        return out

    def _propose_one(self, row: int, ctx: DraftContext, rows: int) -> Draft:
        st = self._rows.get(row)
        if st is not None:
            st.pending = st.chain = None  # an earlier proposal nobody verified (auto chose another drafter)
        k = min(self.max_nodes, ctx.max_tokens)
        if k <= 0:
            self._sync(row, ctx.tokens)
            return Draft()
        tree = self.candidates(row, ctx.tokens, k, rows)
        if tree is None or not tree.tokens:
            return Draft()
        n, e = self.plan(tree, rows)
        if n == 0:
            self._age(_slot(tree.match_len, tree.stored))
            return Draft()
        parents = tree.parents[:n]
        chain = all(p == i - 1 for i, p in enumerate(parents))
        st = self._rows[row]
        per_depth = [0.0] * max(tree.depths[:n])
        for f, d in zip(tree.freqs[:n], tree.depths[:n]):
            per_depth[d - 1] += f
        st.pending = (_slot(tree.match_len, tree.stored), per_depth)
        st.chain = tree.tokens[:n] if chain else None
        return Draft(tree.tokens[:n], None, None if chain else parents, expected=e)


STORE = Artifact("suffix", "a suffix datastore directory (holding datastore.safetensors)", "a suffix datastore",
                 "specdecode datastore --target TARGET --out TARGET/drafters/suffix", is_store_dir,
                 "--suffix-datastore", required=False)


def _build(o: DrafterOptions) -> SuffixDrafter:
    return SuffixDrafter(o.gamma, store=o.artifact(STORE.name))


SPECS = (DrafterSpec(
    "suffix", "suffix drafting: trees of the most frequent continuations of the longest match in the sequence, "
    "in earlier outputs (shared by all requests) and in the target's datastore when it has one", _build,
    artifacts=(STORE,), auto=AutoMember(5),
    bench=(BenchVariant("suffix", "suffix drafting: frequency-ranked trees from the sequence and earlier outputs "
                        "(history restarts per repetition)", history=True),)),)
