"""Draft with a separate small model that shares the target's tokenizer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Optional, Union

import torch

from ..config import ConfigError
from ..costmodel import MAX_GAMMA, AdaptiveGamma, load_or_measure_costs
from ..ops import argmax_list
from ..sampling import draw, probs_from_logits
from .base import Draft, DraftContext, VocabularyMismatchError
from .vocab import VocabSpec, draft_vocab_for

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
                f"{len(tv)} tokens): {diff} entries differ. The draft must use the target's tokenizer; "
                "train one with `specdecode distill --target <target>` or use `--drafter ngram`."
            )
    elif draft.vocab_size != target.vocab_size:
        raise VocabularyMismatchError(
            f"vocab mismatch: draft ({draft.path}) has {draft.vocab_size} tokens, target ({target.path}) has "
            f"{target.vocab_size}; the draft must share the target's tokenizer"
        )


PROBE_WINDOW = 64  # context tokens a probe after plain-decoding steps feeds the draft (see _catch_up)


class DraftModelDrafter:
    """Runs ``gamma`` autoregressive steps of a small model per target pass.

    The draft keeps its own KV cache in step with the verified sequence: after a
    step it holds the sequence plus its own accepted tokens, so the next
    proposal feeds only what it has not seen (the target's correction, or the
    last draft token plus the bonus token after a fully accepted block).

    ``vocab`` restricts its proposals to the most frequent tokens (``drafters/vocab.py``):
    "auto" uses the cut recommended by the draft's ``draft_vocab.json`` when it has one.
    """

    def __init__(self, model: "Model", gamma: Union[int, Literal["auto"]] = "auto", max_gamma: int = MAX_GAMMA,
                 vocab: VocabSpec = "auto") -> None:
        if gamma != "auto" and (not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1):
            raise ConfigError(f"gamma (draft length) must be a positive integer or 'auto', got {gamma!r}")
        self.model = model
        self.vocab = draft_vocab_for(model, vocab)
        self._head = self.vocab.head if self.vocab is not None else None
        self._ids = self.vocab.ids.tolist() if self.vocab is not None else None
        self.gamma = gamma
        self.max_gamma = max_gamma
        self.policy: Optional[AdaptiveGamma] = None  # set by prepare() when gamma == "auto"
        self._checked_target: Optional["Model"] = None
        self._cache: Optional["KVCache"] = None
        self._target_vocab = model.vocab_size
        self._n_cached = 0  # sequence tokens covered by the draft cache (it holds tokens _offset.._n_cached)
        self._offset = 0  # sequence tokens dropped by a windowed catch-up (cache position = index - offset)
        self._base = 0  # sequence length when the last draft started
        self._drafted = 0

    def prepare(self, target: "Model") -> None:
        if target is not self._checked_target:  # comparing two vocabularies costs ~6 ms: once per target
            check_vocab_compatible(self.model, target)
            if self.model.device != target.device:
                raise ConfigError(f"draft is on {self.model.device} but target is on {target.device}; "
                                  "load both on one device")
            self._target_vocab = target.vocab_size
            if self.gamma == "auto":
                self.policy = AdaptiveGamma(load_or_measure_costs(target, self.model, self._head), self.max_gamma)
            self._checked_target = target
        if self._cache is None:
            self._cache = self.model.new_cache(1, self.model.max_seq_len)
        self.reset()

    def reset(self) -> None:
        if self._cache is not None:
            self._cache.reset()
        self._n_cached = self._offset = self._base = self._drafted = 0
        if self.policy is not None:
            self.policy.reset()

    def _logits(self, new_tokens: list[int]) -> torch.Tensor:
        """The last position's logits: over the restricted vocabulary when there is one."""
        ids = torch.tensor([new_tokens], dtype=torch.long, device=self.model.device)
        return self.model.forward(ids, self._cache, last_only=True, head=self._head)[0, -1]

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

    def propose(self, ctx: DraftContext) -> Draft:
        if self._cache is None:
            raise RuntimeError("DraftModelDrafter.prepare(target) must be called before propose()")
        n = len(ctx.tokens)
        want = self.policy.choose() if self.policy is not None else int(self.gamma)
        g = min(want, ctx.max_tokens, self._cache.max_len - (n - self._offset))
        self._base, self._drafted = n, 0
        if g <= 0:  # plain decoding this step: the cheap path (no inference-mode switch)
            return Draft()
        with torch.inference_mode():  # once per proposal, not once per draft step
            return self._draft(ctx, n, g)

    def _catch_up(self, tokens: list[int]) -> torch.Tensor:
        """Feed the sequence tokens the cache lacks; return the logits after the last one.

        A probe after a stretch of plain decoding (``policy.resuming``) would have to feed every
        token since the draft last ran, which costs about 1% of a target step per token and
        would be most of what a useless drafter costs. So a probe that lags by more than
        ``PROBE_WINDOW`` tokens restarts the draft on the last ``PROBE_WINDOW`` tokens only (RoPE
        attention depends on relative positions, so the draft sees a shorter context, not a
        shifted one). Proposals stay exact whatever context the draft saw."""
        n = len(tokens)
        lag = n - self._n_cached
        if lag > PROBE_WINDOW and self.policy is not None and self.policy.resuming:
            self._cache.reset()
            self._offset = self._n_cached = n - PROBE_WINDOW
        return self._logits(tokens[self._n_cached :])

    def _draft(self, ctx: DraftContext, n: int, g: int) -> Draft:
        assert self._cache is not None
        if self._n_cached >= n:  # nothing new (or a rollback): re-feed the last token for its logits
            self._n_cached = n - 1 if self._n_cached == n else 0
            if self._n_cached < self._offset:  # rolled back past the window: start over from the sequence start
                self._n_cached = self._offset = 0
            self._cache.set_length(self._n_cached - self._offset)
        logits = self._catch_up(ctx.tokens)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        greedy = ctx.sampling.greedy
        for i in range(g):
            if greedy and self.model.vocab_size == self._target_vocab:
                t = argmax_list(logits)[0]
                if self._ids is not None:
                    t = self._ids[t]
            elif greedy:
                t = argmax_list(self._full(logits))[0]
            else:
                q = probs_from_logits(self._full(logits).unsqueeze(0), ctx.sampling)
                t = int(draw(q, ctx.generator)[0])
                probs.append(q[0])
            tokens.append(t)
            if i < g - 1:
                logits = self._logits([t])
        self._drafted = g
        self._n_cached = n + g - 1
        return Draft(tokens, torch.stack(probs) if probs else None)

    def on_verified(self, n_accepted: int) -> None:
        """Keep the sequence plus the accepted draft tokens that are in the cache (at most gamma - 1)."""
        if self._cache is None or self._drafted == 0:
            return
        if self.policy is not None:
            self.policy.update(self._drafted, n_accepted)
        keep = self._base + min(n_accepted, self._drafted - 1)
        self._cache.set_length(keep - self._offset)
        self._n_cached = keep
        self._drafted = 0
