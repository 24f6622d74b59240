"""A draft model that drafts for every row of the batch at once.

Per-row ``DraftModelDrafter`` instances cost γ draft forwards *per row*; at 16
rows that is 64 small forwards per step, which alone can make speculation lose.
Here the draft model keeps one batched cache with the same row layout as the
target's, and one step costs γ batched forwards whatever the batch size: one
forward catching every row up with what it has not seen (the verified
correction or bonus tokens), then γ − 1 single-token forwards.

Row bookkeeping is ``DraftModelDrafter``'s, per row: after a proposal a row
holds the sequence plus its first g − 1 draft tokens; ``on_verified`` keeps the
accepted ones. Rows that draft fewer tokens than others in a forward are fed a
padding token whose cache entry is dropped right after (``set_length``), so
every row's cache only ever holds its own real tokens. Each row draws from its
own generator in the same order as ``DraftModelDrafter``, so sampling stays
exact and seeded runs reproduce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..config import ConfigError
from ..drafters import Draft, DraftContext
from ..drafters.model import check_vocab_compatible
from ..drafters.vocab import VocabSpec, draft_vocab_for
from ..ops import argmax_list
from ..sampling import draw, probs_from_logits

if TYPE_CHECKING:
    from ..cache import KVCache
    from ..models import Model


def move_row(cache: "KVCache", src: int, dst: int) -> None:
    """Copy row ``src``'s live keys/values into row ``dst`` (keeps running rows contiguous)."""
    n = cache.lengths[src]
    cache.k[:, dst, :, :n] = cache.k[:, src, :, :n]
    cache.v[:, dst, :, :n] = cache.v[:, src, :, :n]
    cache.lengths[dst] = n
    cache.lengths[src] = 0


class BatchedDraftModel:
    def __init__(self, model: "Model", target: "Model", rows: int, max_len: int, vocab: VocabSpec = "auto") -> None:
        check_vocab_compatible(model, target)
        if model.device != target.device:
            raise ConfigError(f"draft is on {model.device} but target is on {target.device}; load both on one device")
        self.model = model
        self.vocab = target.vocab_size
        self.subset = draft_vocab_for(model, vocab)  # proposals restricted to frequent tokens (FR-Spec)
        self.cache = model.new_cache(rows, min(max_len, model.max_seq_len))
        self.n_cached = [0] * rows  # tokens of the row's sequence in the draft cache
        self.base = [0] * rows  # sequence length when the row's last draft started
        self.drafted = [0] * rows
        self.last_catch_up = 0  # longest catch-up feed of the last proposal (1-2 in steady state)

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    def reset(self, row: int) -> None:
        self.cache.reset(row)
        self.n_cached[row] = self.base[row] = self.drafted[row] = 0

    def move(self, src: int, dst: int) -> None:
        move_row(self.cache, src, dst)
        for xs in (self.n_cached, self.base, self.drafted):
            xs[dst] = xs[src]
        self.reset(src)

    def _forward(self, feeds: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Append each row's tokens (rows absent from ``feeds`` get none) and return each fed row's last logits."""
        lo, hi = min(feeds), max(feeds) + 1
        width = max(len(f) for f in feeds.values())
        if len(feeds) > 1 and max(self.cache.lengths[lo:hi]) + width > self.max_len:
            out: dict[int, torch.Tensor] = {}  # padding would overflow a nearly full row: one row at a time
            for r, f in feeds.items():
                out.update(self._forward({r: f}))
            return out
        real = [self.cache.lengths[r] + len(feeds.get(r, [])) for r in range(lo, hi)]
        ids = [feeds.get(r, []) + [0] * (width - len(feeds.get(r, []))) for r in range(lo, hi)]
        x = torch.tensor(ids, dtype=torch.long, device=self.model.device)
        logits = self.model.forward(x, self.cache, rows=slice(lo, hi),
                                    head=self.subset.head if self.subset is not None else None)
        for r, n in zip(range(lo, hi), real):  # drop the padding entries
            self.cache.set_length(n, r)
        out = {}
        for r, f in feeds.items():
            row = logits[r - lo, len(f) - 1]
            if self.subset is not None:
                row = self.subset.expand(row)
            if row.shape[-1] != self.vocab:  # same tokenizer, differently padded embedding matrices
                fixed = torch.full((self.vocab,), float("-inf"), device=row.device)
                m = min(self.vocab, row.shape[-1])
                fixed[:m] = row[:m]
                row = fixed
            out[r] = row
        return out

    @torch.inference_mode()
    def propose(self, contexts: dict[int, DraftContext]) -> dict[int, Draft]:
        """Draft up to ``ctx.max_tokens`` tokens for each row in ``contexts`` (row -> context)."""
        want: dict[int, int] = {}
        for r, ctx in contexts.items():
            n = len(ctx.tokens)
            g = min(ctx.max_tokens, self.max_len - n)
            self.base[r], self.drafted[r] = n, 0
            if g > 0:
                want[r] = g
                if self.n_cached[r] >= n:  # nothing new (or a rollback): re-feed the last token for its logits
                    self.n_cached[r] = n - 1 if self.n_cached[r] == n else 0
                    self.cache.set_length(self.n_cached[r], r)
        drafts = {r: Draft() for r in contexts}
        if not want:
            return drafts
        feeds = {r: contexts[r].tokens[self.n_cached[r]:] for r in want}
        self.last_catch_up = max(len(f) for f in feeds.values())
        logits = self._forward(feeds)
        tokens: dict[int, list[int]] = {r: [] for r in want}
        probs: dict[int, list[torch.Tensor]] = {r: [] for r in want}
        for i in range(max(want.values())):
            nxt: dict[int, list[int]] = {}
            for r, g in want.items():
                if i >= g:
                    continue
                ctx = contexts[r]
                if ctx.sampling.greedy:
                    t = argmax_list(logits[r])[0]
                else:
                    q = probs_from_logits(logits[r].unsqueeze(0), ctx.sampling)
                    t = int(draw(q, ctx.generator)[0])
                    probs[r].append(q[0])
                tokens[r].append(t)
                if i < g - 1:
                    nxt[r] = [t]
            if nxt:
                logits = self._forward(nxt)
        for r, g in want.items():
            self.drafted[r] = g
            self.n_cached[r] = self.base[r] + g - 1
            drafts[r] = Draft(tokens[r], torch.stack(probs[r]) if probs[r] else None)
        return drafts

    def on_verified(self, row: int, n_accepted: int) -> None:
        """Keep the sequence plus the accepted draft tokens that are in the cache (at most g - 1)."""
        if self.drafted[row] == 0:
            return
        keep = self.base[row] + min(n_accepted, self.drafted[row] - 1)
        self.cache.set_length(keep, row)
        self.n_cached[row] = keep
        self.drafted[row] = 0

    def proposed(self, row: int) -> int:
        return self.drafted[row]


__all__ = ["BatchedDraftModel", "move_row"]
