"""The one decode core: a set of rows, one batched step at a time. ``step`` reads top to bottom:

    draft:     plan each row's length (the γ policy), propose (each ``BatchDrafter`` once, for all its rows)
    constrain: cut each draft to its row's grammar (structured output)
    forward:   ONE target pass over the rows, padded to the widest draft (a tree mask if any draft is a
               tree; hidden states if any drafter reads them), timed for the γ policy
    settle:    per row, verify by ``verify.verify_draft`` (greedy; sampled chains: block or token by token;
               trees: per node; seeded rows: the Gumbel-max coupling, plain decoding's tokens whatever was
               drafted); commit (``cache.trim`` a chain, ``cache.keep`` a tree's path); the verdict back
               to the drafter; ``emit.py``: the one place for EOS, stop strings, detokenisation and stats

``engine.generate``/``stream`` run it with one row; the server's scheduler runs it with many
and adds only admission, cancellation, timeouts and HTTP. One invariant holds for every row:
the target's cache holds every token of the sequence except the last, which is fed together
with the draft at the next pass. Every row is computed identically whatever else is in the
batch, so a greedy request gives the same tokens alone or beside others.

Requests, rows and events live in ``rows.py``, the text helpers in ``text.py``.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional, Sequence

import torch

from .sizing import measure_context
from .cache import ContextLengthError
from .config import ConfigError
from .constraints import check_request
from .sizing.book import store_costs
from .sizing.costs import cost_clock
from .draft import Draft, DraftContext
from .drafters.base import BatchDrafter
from .emit import annotate, emit
from .sizing.gamma import Speculation, resolve_gamma
from .logprobs import check_logprobs
from .models import Model
from .ops import argmax_list
from .sizing.policy import GammaPolicy, RowPlan
from .prefill import Filling
from .rows import Event, Failure, Request, Row
from .threads import ThreadGovernor, governor
from .verify import VerifyResult, tree_mask, verify_draft
from .verify_step import judge_step

_NO_DRAFT = Draft()  # shared, never mutated: "this row drafts nothing this step"
_Layers = Mapping[int, torch.Tensor]  # EAGLE-3: the residual after layer i, per row and position
_PLAIN = RowPlan(None, 0, False, 0.0)
REFINE_EVERY = 64  # passes between live checks of the self-sizing drafters' costs (and at every request's end)


# -- the core ------------------------------------------------------------------------------------
class DecodeCore:
    """Owns the target's batched cache and the running rows; ``step`` advances every row once.

    Rows 0..n-1 of the cache are always the running rows (a finished row is filled by moving the
    last one into it, in the target's cache and every drafter's alike). ``drafters`` maps names to
    drafters; a request names the one it uses."""

    def __init__(self, target: Model, drafters: Mapping[str, BatchDrafter], max_rows: int = 1,
                 context_len: Optional[int] = None, policy: Optional[GammaPolicy] = None,
                 prepare: Optional[Sequence[str]] = None, threads: Optional[ThreadGovernor] = None) -> None:
        self.target = target
        self.threads = threads  # None: the stepping thread's own governor (threads.py)
        self.drafters = dict(drafters)
        self.max_rows = max_rows
        self.context_len = min(target.max_seq_len, context_len or target.max_seq_len)
        self.policy = policy or GammaPolicy()
        self.cache = target.new_cache(max_rows, self.context_len)
        self.rows: list[Row] = []
        self.forward_passes = 0
        self._trust_seen = 0  # the policy's trust events the drafters were last refined at
        self.filling: Optional[Filling] = None  # a prompt going in a chunk a step, in cache row len(rows)
        self.prefill_slice_s = 0.1  # how long one chunk of it may hold the running rows' next pass
        self._cost_clock = cost_clock(target)  # online costs: the same clock as the offline ones
        self._clock = time.perf_counter
        self._names = {id(d): name for name, d in self.drafters.items()}
        # ``prepare``: the drafters prepared (buffers, measured costs) now; the rest on their first request,
        # so a server that loads many drafters starts in seconds (a tree's cost measurement takes seconds)
        self._drafter_list: list[BatchDrafter] = []  # the prepared ones, in preparation order
        self.preparing: Optional[str] = None  # the drafter being prepared now (a /health "warming" state)
        for name in self.drafters if prepare is None else prepare:
            self._prepare(name)
        self._want_hidden = any(d.wants_hidden for d in self.drafters.values())
        self._forced: set[int] = set()  # rows whose draft this step is the grammar's forced tokens
        # EAGLE-3 drafters also read intermediate layers; then the prefill keeps the prompt's states too,
        # so the first step can draft
        self._hidden_layers = tuple(sorted({int(i) for d in self.drafters.values() if d.wants_hidden
                                            for i in d.hidden_layers}))

    def unprepared(self) -> list[str]:
        """The drafters no request or warm-up has prepared yet."""
        return [n for n, d in self.drafters.items() if not any(d is p for p in self._drafter_list)]

    def prepare(self, name: str) -> None:
        """Prepare drafter ``name`` now rather than at its first request (a server warming up)."""
        self._prepare(name)

    def _prepare(self, name: str) -> BatchDrafter:
        """Prepare drafter ``name`` for every row (once), with the policy's pricer, and give the policy its costs."""
        d = self.drafters[name]
        if not any(d is p for p in self._drafter_list):
            self.preparing = name
            d.pricer = self.policy.pricer
            try:
                d.prepare_rows(self.target, self.max_rows, self.context_len)
                costs = d.costs_for(self.target)
            finally:
                self.preparing = None
                measure_context.release(self.target)  # the measurements' shared prefill, if any ran
            if costs is not None:
                self.policy.set_offline(name, costs)
            for r in range(self.max_rows):
                d.reset_row(r)
            self._drafter_list.append(d)
        return d

    # -- rows ------------------------------------------------------------------------------------
    def add(self, request: Request, owner: Any = None, chunked: bool = False) -> Row:
        """Prefill a request into the next free row. A failure leaves the core as it was. ``chunked``: while
        other rows run, a long prompt goes in a chunk per ``step`` (``prefill.py``); one at a time."""
        if self.filling is not None:
            raise RuntimeError("a prompt is still being prefilled; add the next request once it is in")
        if len(self.rows) >= self.max_rows:
            raise RuntimeError(f"all {self.max_rows} rows are in use")
        drafter = None
        if request.drafter is not None:
            if request.drafter not in self.drafters:
                raise ConfigError(f"drafter {request.drafter!r} is not loaded here; loaded: "
                                  f"{', '.join(sorted(self.drafters)) or 'none'}")
            drafter = self._prepare(request.drafter)
        spec = (resolve_gamma(request.gamma, drafter.gamma, request.adaptive) if drafter is not None
                else Speculation(0, False))
        if request.constraint is not None or request.logit_bias:
            check_request(request, self.target)
        if request.logprobs is not None:
            check_logprobs(request.logprobs)
        i = len(self.rows)
        max_len = min(self.context_len, len(request.prompt_ids) + request.generation.max_new_tokens)
        row = Row(request, self.target, max_len, drafter, spec, owner)
        if row.n_prompt >= self.context_len:
            raise ContextLengthError(f"prompt has {row.n_prompt} tokens but the context window is "
                                     f"{self.context_len}; shorten it so at least one token can be generated")
        self.cache.reset(i)
        for d in self._drafter_list:
            d.reset_row(i)
        filling = Filling(row, i, self.prefill_slice_s)
        if chunked and self.rows and filling.todo > filling.chunk:
            self.filling = filling  # prefilled a chunk a step (``step``), the running rows' passes in between
            return row
        try:
            filling.feed(self.target, self.cache, self._hidden_layers, everything=True)
        except BaseException:
            self.cache.reset(i)
            raise
        self.rows.append(row)
        return row

    def _fill(self) -> None:
        """The next chunk of the prompt going in (all of it when no row is running); it joins the rows once in."""
        f = self.filling
        assert f is not None
        try:
            done = f.feed(self.target, self.cache, self._hidden_layers, everything=not self.rows)
        except BaseException:
            self.remove(f.row)
            raise
        if done:
            self.filling = None
            self.rows.append(f.row)

    def remove(self, row: Row) -> None:
        """Free a row (finished, cancelled or failed, or still filling): the last row moves into its place,
        and a prompt going in moves down after it, so the rows in use stay 0..n-1 and the filling one n."""
        if self.filling is not None and row is self.filling.row:
            self._free(self.filling.slot)
            self.filling = None
            return
        i = self.rows.index(row)
        last = len(self.rows) - 1
        if i != last:
            self._move(last, i)
            self.rows[i] = self.rows[last]
        self.rows.pop()
        self._free(last)
        if self.filling is not None:
            self._move(self.filling.slot, last)
            self._free(self.filling.slot)
            self.filling.slot = last
        for costs in self.policy.take_refined().values():  # cached costs the live passes contradicted
            store_costs(costs)
        self._refine_drafters()

    def live_rows(self) -> list[Row]:
        """Every request holding a row: the running ones, then the one whose prompt is still going in."""
        return self.rows + ([self.filling.row] if self.filling is not None else [])

    def _move(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)
        for d in self._drafter_list:
            d.move_row(src, dst)

    def _free(self, slot: int) -> None:
        self.cache.reset(slot)
        for d in self._drafter_list:
            d.reset_row(slot)

    def _refine_drafters(self) -> None:
        """Self-sizing drafters check their own measured costs against the live passes (``sizing/live.py``),
        when a request ends, every ``REFINE_EVERY`` passes (a long request does not run on a spoiled file) and as
        soon as a single-row width's timings become trusted (a pessimistic file is overruled inside the request
        that first shows it wrong, not after it)."""
        self._trust_seen = self.policy.trust_events
        passes = self.policy.trusted_passes()
        if not passes:
            return
        for d in self._drafter_list:
            for costs in d.refine_costs(passes):
                store_costs(costs)

    def clear(self) -> None:
        """Drop every row (after an engine error: nothing in the caches is trusted)."""
        self.rows.clear()
        self.filling = None
        self.cache.reset()
        for d in self._drafter_list:
            for r in range(self.max_rows):
                d.reset_row(r)

    # -- one step --------------------------------------------------------------------------------
    def _plan(self) -> list[int]:
        """Each row's draft length this step: the γ policy's choice within its cap and room, or a probe."""
        rows, cache = self.rows, self.cache
        lengths = cache.lengths
        room_ctx = (cache.max_len - max(lengths[: len(rows)])) - 1
        for prepared in self._drafter_list:
            prepared.acceptance.fade()  # once per pass: a switched-off drafter's evidence loses weight
        plans = []
        for r in rows:
            d = r.drafter
            if d is None or r.evidence is None:
                plans.append(_PLAIN)
                continue
            spec = r.speculation
            cap = max(0, min(spec.cap, r.room() - 1, room_ctx))
            alpha = r.evidence.alpha if spec.adaptive else 0.0
            plans.append(RowPlan(self._names[id(d)], cap, spec.adaptive, alpha, d.sizes_itself))
        # online costs only feed the policy's choice for adaptive rows; a clock read is a syscall
        self._clock = self._cost_clock if any(p.auto for p in plans) else time.perf_counter
        lengths = self.policy.choose(plans)
        for i, (r, p) in enumerate(zip(rows, plans)):
            ev = r.evidence
            if ev is None:
                continue
            # a row the policy leaves plain drafts on its own probe schedule (first pass, then sparser)
            r.probing = p.auto and p.cap > 0 and lengths[i] == 0 and ev.probe_due()
            if r.probing:
                lengths[i] = self.policy.probe_length(p, ev.fresh_alpha)
        return lengths

    def _propose(self, lengths: list[int]) -> list[Draft]:
        """Each drafter proposes once for all of its rows (timed for the γ policy); grammar-forced tokens need none."""
        rows = self.rows
        drafts = [_NO_DRAFT] * len(rows)
        groups: dict[str, dict[int, DraftContext]] = {}
        self._forced.clear()
        for i, (r, g) in enumerate(zip(rows, lengths)):
            if r.drafter is not None:
                ev = r.evidence
                resuming = ev is not None and ev.plain > 0  # drafting after plain passes: a probe for the drafter
                if ev is not None:
                    ev.step(g, r.probing)
                group = groups.setdefault(self._names[id(r.drafter)], {})
                if r.constraint is not None:  # tokens the grammar forces: a free draft, no drafter step
                    room = min(r.room() - 1, self.cache.max_len - max(self.cache.lengths[: len(rows)]) - 1)
                    forced = r.constraint.forced(room)
                    if forced:
                        drafts[i] = Draft(forced)
                        self._forced.add(i)
                        continue
                if g > 0:
                    group[i] = DraftContext(r.tokens, g, r.sampling, r.gen, r.hidden, probe=resuming,
                                            target_cache=self.cache, noise=r.noise, constraint=r.constraint,
                                            layers=r.layers)
        for name, contexts in groups.items():
            d = self.drafters[name]
            depth = max((c.max_tokens for c in contexts.values()), default=0)
            d.acceptance.mark(depth)
            if not contexts:
                continue
            t0 = self._clock()
            got = d.propose_rows(contexts)
            dt = self._clock() - t0
            if self._clock is self._cost_clock:
                self.policy.record_draft(name, len(contexts), depth, dt)
            for i, draft in got.items():
                if len(draft) > contexts[i].max_tokens:
                    raise RuntimeError(f"drafter {name!r} proposed {len(draft)} tokens but at most "
                                       f"{contexts[i].max_tokens} were allowed")
                drafts[i] = draft
                rows[i].stats.draft_s += dt / len(contexts)
        return drafts

    def step(self) -> list[tuple[Row, Event]]:
        """Advance every row by one target pass; returns (row, event) pairs in order. Finished rows
        get their ``FinishEvent`` here and are removed."""
        threads = self.threads or governor()
        threads.tick()
        if self.filling is not None:
            self._fill()
        if not self.rows:
            return []
        drafts = self._draft()
        masks = self._constrain(drafts)
        logits, argmax, hidden, layers = self._forward(drafts, masks, threads)
        return self._settle(drafts, logits, argmax, hidden, layers)

    def _draft(self) -> list[Draft]:
        """Every row's draft this step: planned and proposed, or none at all when no drafter is loaded."""
        if self.drafters:
            drafts = self._propose(self._plan())
        else:  # plain decoding: nothing to plan or propose
            drafts = [_NO_DRAFT] * len(self.rows)
            self._clock = time.perf_counter
        if not self.target.exact_trees:  # its kernels would round a tree's rows unlike plain decoding's
            drafts = [d.first_path() if r.sampling.greedy else d for r, d in zip(self.rows, drafts)]
        return drafts

    def _constrain(self, drafts: list[Draft]) -> list[Optional[torch.Tensor]]:
        """Structured output: each constrained row's draft cut to its grammar, and its allowed tokens per position."""
        masks: list[Optional[torch.Tensor]] = [None] * len(drafts)
        for i, r in enumerate(self.rows):
            if r.constraint is not None:
                drafts[i], masks[i] = r.constraint.check_draft(drafts[i])
        return masks

    def _forward(self, drafts: list[Draft], masks: list[Optional[torch.Tensor]], threads: ThreadGovernor
                 ) -> tuple[torch.Tensor, Optional[list[list[int]]], Optional[torch.Tensor], Optional[_Layers]]:
        """ONE target pass over every row, padded to the widest draft, timed for the γ policy and the threads: logits
        [B, width, V] under the grammars, each row's argmax if any is greedy, hidden states if a drafter reads them."""
        rows, batch = self.rows, len(self.rows)
        width, tree = 1, False
        for d in drafts:
            width = max(width, 1 + len(d.tokens))
            tree = tree or d.parents is not None
        ids = torch.tensor([[r.tokens[-1]] + d.tokens + [r.tokens[-1]] * (width - 1 - len(d.tokens))
                            for r, d in zip(rows, drafts)], dtype=torch.long, device=self.target.device)
        mask = tree_mask(drafts, width, ids.device) if tree else None
        t0, tp = self._clock(), time.perf_counter()
        hidden, layers = None, None
        if self._want_hidden:
            out = self.target.run(ids, self.cache, rows=slice(0, batch), tree_mask=mask, return_hidden=True,
                                  hidden_layers=self._hidden_layers)
            logits, hidden, layers = out.logits, out.hidden, out.layers
        elif mask is not None:
            logits = self.target.forward(ids, self.cache, rows=slice(0, batch), tree_mask=mask)
        else:
            logits = self.target.forward(ids, self.cache, rows=slice(0, batch))
        logits = self._mask_logits(logits, masks)
        argmax = None
        if any(r.sampling.greedy for r in rows):
            flat = argmax_list(logits.reshape(batch * width, -1))
            argmax = [flat[i * width : (i + 1) * width] for i in range(batch)]
        threads.observe(width, time.perf_counter() - tp)
        if self._clock is self._cost_clock:
            self.policy.record_target(batch, width, self._clock() - t0)
        self.forward_passes += 1
        if self.forward_passes % REFINE_EVERY == 0 or self.policy.trust_events != self._trust_seen:
            self._refine_drafters()
        return logits, argmax, hidden, layers

    def _mask_logits(self, logits: torch.Tensor, masks: list[Optional[torch.Tensor]]) -> torch.Tensor:
        """The constrained law: forbidden tokens at -inf before any filter, so both sides of verify see it."""
        if all(m is None for m in masks):
            return logits
        logits = logits.clone()  # may be an inference tensor (or a reused buffer): mask a copy
        for i, m in enumerate(masks):
            state = self.rows[i].constraint
            if m is not None and state is not None:
                logits[i, : m.shape[0]] = state.apply(logits[i, : m.shape[0]], m)
        return logits

    def _settle(self, drafts: list[Draft], logits: torch.Tensor, argmax: Optional[list[list[int]]],
                hidden: Optional[torch.Tensor], layers: Optional[_Layers]) -> list[tuple[Row, Event]]:
        """Verify, commit and emit every row in order; rows that finished or whose grammar failed leave."""
        events: list[tuple[Row, Event]] = []
        finished: list[Row] = []
        failed: list[Row] = []  # rows whose grammar engine gave up (constraints.py): they fail alone
        width = logits.shape[1]
        judged = judge_step(logits, self.rows, drafts)
        for i, (r, d) in enumerate(zip(self.rows, drafts)):
            if r.constraint is not None and r.constraint.error is not None:
                failed.append(r)
                continue
            res = judged.get(i) or verify_draft(d, logits[i], argmax[i] if argmax is not None else None, r.sampling,
                                                len(r.tokens), r.noise, r.gen, r.request.verify.chain_rule)
            kept, accepted = self._commit(i, d, res, width)
            if r.constraint is not None:
                r.constraint.commit(accepted + [res.next_token])
                if r.constraint.error is not None:
                    failed.append(r)
                    continue
            self._feedback(i, r, d, res)
            if hidden is not None:
                self._keep_states(i, r, res, kept, hidden, layers)
            n_events = len(events)
            if emit(r, accepted, res, len(d.tokens), events):
                finished.append(r)
            if n_events < len(events) and (d.tokens or r.request.logprobs is not None):
                annotate(events[n_events][1], r, d, res, kept, logits, i)
        for r in failed:
            assert r.constraint is not None and r.constraint.error is not None
            events.append((r, Failure("constraint", r.constraint.error)))
        for r in finished + failed:
            self.remove(r)
        return events

    def _commit(self, i: int, d: Draft, res: VerifyResult, width: int) -> tuple[Optional[list[int]], list[int]]:
        """Row ``i``'s cache keeps a tree's accepted path or drops a chain's rejected tail, so it again holds every
        token but the newest: (the kept positions, root included, for a tree, else None; the accepted tokens)."""
        if d.parents is not None:
            kept = [0] + [k + 1 for k in res.path or ()]
            self.cache.keep(kept, row=i)
            return kept, [d.tokens[k] for k in res.path or ()]
        self.cache.trim(width - 1 - res.n_accepted, row=i)
        return None, d.tokens[: res.n_accepted]

    def _feedback(self, i: int, r: Row, d: Draft, res: VerifyResult) -> None:
        """The verdict goes to the drafter, its evidence (the γ policy's α) and the per-source stats; the grammar's
        forced tokens are judged like a draft but made by no drafter."""
        g = len(d.tokens)
        if r.drafter is not None and g > 0 and i not in self._forced:
            r.drafter.on_verified_row(i, res.n_accepted)
            r.drafter.acceptance.update(g, res.n_accepted)  # the drafter's history: the next rows' prior
            if r.evidence is not None:
                r.evidence.update(g, res.n_accepted)
            name = self._names[id(r.drafter)]
            source = d.source or name  # a composite (auto) names the member that drafted: it only chose
            r.stats.record_source(source, g, res.n_accepted, chooser=name if source != name else None)
        elif g > 0:
            r.stats.record_forced(g, res.n_accepted)

    def _keep_states(self, i: int, r: Row, res: VerifyResult, kept: Optional[list[int]], hidden: torch.Tensor,
                     layers: Optional[_Layers]) -> None:
        """A head drafter's next input: the target's states of the tokens this pass verified and kept."""
        sel = kept if kept is not None else slice(0, res.n_accepted + 1)
        r.hidden = hidden[i, sel]
        if layers:
            r.layers = {k: v[i, sel] for k, v in layers.items()}


__all__ = ["DecodeCore"]
