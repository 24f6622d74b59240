"""Draft with a separate small model that shares the target's tokenizer, for one row or many.

One class serves ``generate`` (one row) and the server (many rows): the draft keeps one
batched KV cache with the target's row layout, and a step costs γ batched forwards whatever
the batch size: one forward catching every row up with what it has not seen (the verified
correction or bonus tokens), then γ − 1 single-token forwards. Per-row drafters would cost γ
forwards *per row*, which alone can make speculation lose at 16 rows.

Row bookkeeping: after a proposal a row's cache holds the sequence plus its first g − 1 draft
tokens; ``on_verified_row`` keeps the accepted ones. Rows that draft fewer tokens than others
in a forward are fed a padding token whose cache entry is dropped right after, so a row's
cache only ever holds its own real tokens. Each row draws from its own generator in the same
order whatever else is in the batch, so sampling stays exact and seeded runs reproduce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

import torch

from ..config import ConfigError
from ..sizing.book import chain_spec
from ..sizing.costs import MAX_GAMMA, Costs
from ..ops import argmax_list
from ..sampling import probs_from_logits
from ..draft import Draft, DraftContext, draw_token
from .base import (Acceptance, BatchDrafter, BatchDrafterBase, Gamma, VocabularyMismatchError, check_gamma,
                   draft_rows)
from .vocab import VocabSpec, draft_vocab_for
from .plugin import AutoMember, BenchVariant, DrafterOptions, DrafterSpec

if TYPE_CHECKING:
    from ..cache import KVCache
    from ..models import Model


def check_vocab_compatible(draft: "Model", target: "Model") -> None:
    """Raise unless a draft token id means the same string to the target."""
    if draft.tokenizer is not None and target.tokenizer is not None:
        dv, tv = draft.tokenizer.get_vocab(with_added_tokens=True), target.tokenizer.get_vocab(with_added_tokens=True)
        if dv != tv:
            diff = len(set(dv.items()) ^ set(tv.items()))
            raise VocabularyMismatchError(
                f"vocab mismatch between draft ({draft.path}, {len(dv)} tokens) and target ({target.path}, "
                f"{len(tv)} tokens): {diff} entries differ. --drafter model needs the target's tokenizer; "
                "use `--drafter crosstok` for a draft with its own tokenizer (exact, re-tokenized as text), "
                "train one with `specdecode distill --target <target>`, or use `--drafter ngram`."
            )
    elif draft.vocab_size != target.vocab_size:
        raise VocabularyMismatchError(
            f"vocab mismatch: draft ({draft.path}) has {draft.vocab_size} tokens, target ({target.path}) has "
            f"{target.vocab_size}; the draft must share the target's tokenizer (`--drafter crosstok` takes a draft "
            "with its own tokenizer.json)"
        )


PROBE_WINDOW = 64  # context tokens a probe after plain-decoding steps feeds the draft (see _catch_up)


class DraftModelDrafter(BatchDrafterBase):
    """Runs γ autoregressive steps of a small model per target pass, for every drafting row at once.

    ``gamma``: draft length, or "auto" (the decode core's γ policy picks 0..``max_gamma`` each
    step from measured costs and the running acceptance). ``vocab`` restricts proposals to the
    most frequent tokens (``drafters/vocab.py``); "auto" uses the cut recommended by the draft's
    ``draft_vocab.json`` when it has one.

    Single-row use (``prepare``/``propose``/``on_verified``/``reset``) is row 0 of the same
    machinery."""

    wants_hidden = False

    def __init__(self, model: "Model", gamma: Gamma = "auto", max_gamma: int = MAX_GAMMA,
                 vocab: VocabSpec = "auto") -> None:
        self.gamma = check_gamma(gamma)
        self.model = model
        self.max_gamma = max_gamma
        self.vocab = draft_vocab_for(model, vocab)
        self._head = self.vocab.head if self.vocab is not None else None
        self._ids = self.vocab.ids.tolist() if self.vocab is not None else None
        self.acceptance = Acceptance()
        self._checked_target: Optional["Model"] = None
        self._target_vocab = model.vocab_size
        self._cache: Optional["KVCache"] = None
        self._n_cached: list[int] = []  # sequence tokens covered by the row's cache (tokens _offset.._n_cached)
        self._offset: list[int] = []  # sequence tokens dropped by a windowed probe (cache position = index - offset)
        self._base: list[int] = []  # sequence length when the row's last draft started
        self._drafted: list[int] = []
        self.last_catch_up = 0  # longest catch-up feed of the last proposal (1-2 in steady state)
        self._costs: Optional[tuple["Model", Costs]] = None

    # -- setup ------------------------------------------------------------------------------------
    def prepare_rows(self, target: "Model", rows: int, max_len: int) -> None:
        """Check the pair once per target; make room for ``rows`` rows of up to ``max_len`` tokens."""
        if target is not self._checked_target:  # comparing two vocabularies costs ~6 ms: once per target
            check_vocab_compatible(self.model, target)
            if self.model.device != target.device:
                raise ConfigError(f"draft is on {self.model.device} but target is on {target.device}; "
                                  "load both on one device")
            self._target_vocab = target.vocab_size
            self._checked_target = target
        length = min(max_len, self.model.max_seq_len)
        if self._cache is None or self._cache.batch_size < rows or self._cache.max_len < length:
            self._cache = self.model.new_cache(rows, length)
            self._n_cached, self._offset, self._base, self._drafted = ([0] * rows for _ in range(4))

    def costs_for(self, target: "Model") -> Optional[Costs]:
        """The measured c and v(k) for the γ policy (cached per machine and pair); None for a fixed γ."""
        if self.gamma != "auto":
            return None
        if self._costs is None or self._costs[0] is not target:  # the cache key costs ~1 ms: once per target
            spec = chain_spec(target, self.model, self._head, label="the draft model's")
            self._costs = (target, self.pricer.costs(target, spec))
        return self._costs[1]

    @property
    def max_len(self) -> int:
        return self._cache.max_len if self._cache is not None else self.model.max_seq_len

    def reset_row(self, row: int) -> None:
        if self._cache is not None:
            self._cache.reset(row)
            self._n_cached[row] = self._offset[row] = self._base[row] = self._drafted[row] = 0

    def move_row(self, src: int, dst: int) -> None:
        """Row ``src`` becomes row ``dst`` (the core keeps its running rows contiguous)."""
        assert self._cache is not None
        self._cache.move_row(src, dst)
        for xs in (self._n_cached, self._offset, self._base, self._drafted):
            xs[dst] = xs[src]
        self.reset_row(src)

    # -- single-row protocol ----------------------------------------------------------------------
    def prepare(self, target: "Model") -> None:
        self.prepare_rows(target, 1, self.model.max_seq_len)
        self.reset_row(0)

    def reset(self) -> None:
        self.reset_row(0)

    def propose(self, ctx: DraftContext) -> Draft:
        return self.propose_rows({0: ctx})[0]

    def on_verified(self, n_accepted: int) -> None:
        self.on_verified_row(0, n_accepted)

    # -- drafting ---------------------------------------------------------------------------------
    def _full(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary (-inf where the draft cannot propose)."""
        if self.vocab is not None:
            logits = self.vocab.expand(logits)
        v = self._target_vocab
        if logits.shape[-1] != v:  # same tokenizer, differently padded embedding matrices
            fixed = torch.full((v,), float("-inf"), device=logits.device)
            m = min(v, logits.shape[-1])
            fixed[:m] = logits[:m]
            logits = fixed
        return logits

    def _pick(self, logits: torch.Tensor, ctx: DraftContext, probs: list[torch.Tensor], index: int) -> int:
        """Draft token ``index`` from a row's last logits (greedy, or drawn from the filtered law)."""
        if ctx.constraint is not None:  # structured output: the masked law, as the target will judge it
            masked = ctx.constraint.mask(self._full(logits))
            if ctx.sampling.greedy:
                t = argmax_list(masked)[0]
            else:
                q = probs_from_logits(masked.unsqueeze(0), ctx.sampling)
                probs.append(q[0])
                t = draw_token(q, ctx, index)
            ctx.constraint.push(t)
            return t
        if ctx.sampling.greedy:
            if self.model.vocab_size == self._target_vocab:
                t = argmax_list(logits)[0]
                return self._ids[t] if self._ids is not None else t
            return argmax_list(self._full(logits))[0]
        q = probs_from_logits(self._full(logits).unsqueeze(0), ctx.sampling)
        probs.append(q[0])
        return draw_token(q, ctx, index)

    def _last_logits(self, feed: list[int], rows: slice) -> torch.Tensor:
        """Append one row's tokens and return its last position's logits."""
        ids = torch.tensor([feed], dtype=torch.long, device=self.model.device)
        assert self._cache is not None  # made by prepare_rows
        return self.model.forward(ids, self._cache, rows=rows, last_only=True, head=self._head)[0, -1]

    def _forward(self, feeds: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Append each row's tokens (rows between them get padding, dropped after) and return each
        fed row's last logits."""
        cache = self._cache
        assert cache is not None
        if len(feeds) == 1:  # one row: no padding, no bookkeeping
            (r, f), = feeds.items()
            return {r: self._last_logits(f, slice(r, r + 1))}
        lo, hi = min(feeds), max(feeds) + 1
        width = max(len(f) for f in feeds.values())
        if max(cache.lengths[lo:hi]) + width > cache.max_len:
            out: dict[int, torch.Tensor] = {}  # padding would overflow a nearly full row: one row at a time
            for r, f in feeds.items():
                out.update(self._forward({r: f}))
            return out
        real = [cache.lengths[r] + len(feeds.get(r, ())) for r in range(lo, hi)]
        ids = [feeds.get(r, []) + [0] * (width - len(feeds.get(r, ()))) for r in range(lo, hi)]
        x = torch.tensor(ids, dtype=torch.long, device=self.model.device)
        logits = self.model.forward(x, cache, rows=slice(lo, hi), head=self._head)
        for r, n in zip(range(lo, hi), real):
            cache.set_length(n, r)
        return {r: logits[r - lo, len(f) - 1] for r, f in feeds.items()}

    def _start(self, row: int, ctx: DraftContext) -> list[int]:
        """Roll the row's cache back if the sequence did, and return the tokens it has not seen.

        A probe after a stretch of plain decoding would have to feed every token since the draft
        last ran, about 1% of a target step per token: most of what a useless drafter costs. So a
        probe that lags by more than ``PROBE_WINDOW`` tokens restarts the row on the last
        ``PROBE_WINDOW`` tokens only (RoPE attention depends on relative positions, so the draft
        sees a shorter context, not a shifted one). Proposals stay exact whatever it saw."""
        cache = self._cache
        assert cache is not None
        n = len(ctx.tokens)
        if self._n_cached[row] >= n:  # nothing new (or a rollback): re-feed the last token for its logits
            self._n_cached[row] = n - 1 if self._n_cached[row] == n else 0
            if self._n_cached[row] < self._offset[row]:  # rolled back past the window: start over
                self._n_cached[row] = self._offset[row] = 0
            cache.set_length(self._n_cached[row] - self._offset[row], row)
        if ctx.probe and n - self._n_cached[row] > PROBE_WINDOW:
            cache.reset(row)
            self._offset[row] = self._n_cached[row] = n - PROBE_WINDOW
        return ctx.tokens[self._n_cached[row]:]

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        """Draft up to ``ctx.max_tokens`` tokens for each row in ``contexts`` (row -> context)."""
        cache = self._cache
        if cache is None:
            raise RuntimeError("DraftModelDrafter.prepare(target) must be called before propose()")
        want: dict[int, int] = {}
        drafts = {r: Draft() for r in contexts}
        for r, ctx in contexts.items():
            n = len(ctx.tokens)
            g = min(ctx.max_tokens, cache.max_len - (n - self._offset[r]))
            if self.gamma != "auto":
                g = min(g, self.gamma)
            self._base[r], self._drafted[r] = n, 0
            if g > 0:
                want[r] = g
        if not want:  # plain decoding this step: the cheap path (no inference-mode switch)
            return drafts
        with torch.inference_mode():  # once per proposal, not once per draft step
            if len(want) == 1:  # generate()'s case: the same steps without the batch bookkeeping
                (r, g), = want.items()
                tokens: dict[int, list[int]] = {r: []}
                probs: dict[int, list[torch.Tensor]] = {r: []}
                self._draft_one(r, g, contexts[r], tokens[r], probs[r])
            else:
                tokens, probs = self._draft_many(want, contexts)
        for r, g in want.items():
            self._drafted[r] = g
            self._n_cached[r] = self._base[r] + g - 1
            drafts[r] = Draft(tokens[r], torch.stack(probs[r]) if probs[r] else None)
        return drafts

    def _draft_one(self, r: int, g: int, ctx: DraftContext, tokens: list[int], probs: list[torch.Tensor]) -> None:
        feed = self._start(r, ctx)
        self.last_catch_up = len(feed)
        rows = slice(r, r + 1)
        logits = self._last_logits(feed, rows)
        for i in range(g):
            t = self._pick(logits, ctx, probs, i)
            tokens.append(t)
            if i < g - 1:
                logits = self._last_logits([t], rows)

    def _draft_many(self, want: dict[int, int], contexts: Mapping[int, DraftContext]
                    ) -> tuple[dict[int, list[int]], dict[int, list[torch.Tensor]]]:
        """γ batched forwards for every drafting row: a catch-up feed, then one token per row at a time."""
        feeds = {r: self._start(r, contexts[r]) for r in want}
        self.last_catch_up = max(len(f) for f in feeds.values())
        return draft_rows(want, contexts, self._forward(feeds), self._forward, self._pick)

    def on_verified_row(self, row: int, n_accepted: int) -> None:
        """Keep the sequence plus the accepted draft tokens that are in the cache (at most g - 1)."""
        if self._cache is None or self._drafted[row] == 0:
            return
        keep = self._base[row] + min(n_accepted, self._drafted[row] - 1)
        self._cache.set_length(keep - self._offset[row], row)
        self._n_cached[row] = keep
        self._drafted[row] = 0


def _build(o: DrafterOptions) -> BatchDrafter:
    assert o.draft is not None
    return DraftModelDrafter(o.draft, gamma=o.gamma, vocab=o.vocab)


SPECS = (DrafterSpec(
    "model", "a separate small draft model (--draft DIR)", _build, needs_draft_model=True, auto=AutoMember(0),
    bench=(BenchVariant("draft", "draft model, γ from --gammas", sweep="gammas"),)),)
