"""Drafting with a model whose tokenizer differs from the target's, exactly and batched.

Timor et al., "Accelerating LLM inference with lossless speculative decoding algorithms for
heterogeneous vocabularies" (ICML 2025, arXiv:2502.05202) give two exact schemes: string-level
exact match (SLEM) and token-level intersection (TLI). We implement **SLEM**: the draft writes
text in its own tokens, the text is re-tokenized with the target's tokenizer, and the target
verifies those target tokens. TLI restricts the draft to the shared tokens and needs a
stochastic draft law; SLEM keeps every draft token usable and needs no vocabulary map.

Why it is exact: the proposal is a *deterministic* function of the sequence so far (greedy
draft, no randomness), so the core verifies it like prompt lookup (``Draft.probs is None``):
identity at T = 0, and the one-hot rule at T > 0 (accept x with probability p(x), else draw
from the residual), whose output law is the target's whatever the proposal. A bad proposal
only costs acceptance.

Per row and step: the target's tokens so far are decoded to text and re-encoded with the
draft's tokenizer; the draft's KV cache keeps the longest common prefix with what it already
holds (re-tokenizing the whole text, rather than appending, handles the boundary where the
last target token's text merges differently once extended). The draft then writes γ' tokens
greedily, batched across rows; their text is encoded with the target's tokenizer and only the
*stable* target tokens are proposed: those ending before the last pre-token of the draft text
(and before the one ahead of it when the last is whitespace), which more text cannot merge
into.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Mapping, Optional

import torch

from ..config import ConfigError
from ..draft import Draft, DraftContext
from .base import Acceptance, BatchDrafter, Gamma, RowZeroAdapter, check_gamma, draft_rows
from .plugin import BenchVariant, DrafterOptions, DrafterSpec

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ..cache import KVCache
    from ..sizing.costs import Costs
    from ..models import Model

DEFAULT_GAMMA = 6  # target tokens per step when γ is "auto" (no offline cost model for a pair of tokenizers)
MAX_DRAFT_STEPS = 32  # draft tokens per step at most
RETOKENIZE_CHARS = 32  # characters before the end of the last text that are re-tokenized each step
ANCHOR = 4  # draft tokens decoded ahead of a draft so decoders that drop a leading space keep it


def shares_vocabulary(draft: "Model", target: "Model") -> bool:
    """True when draft token ids mean the same strings to the target (``--drafter model`` can use it)."""
    from .base import VocabularyMismatchError
    from .model import check_vocab_compatible

    try:
        check_vocab_compatible(draft, target)
    except VocabularyMismatchError:
        return False
    return True


def stable_prefix(tok: "Tokenizer", text: str) -> tuple[list[int], int]:
    """Target ids of ``text`` that appending more text cannot change (conservative), and how many
    target tokens the whole text has.

    With a pre-tokenizer, BPE never merges across pre-token boundaries, so tokens that end
    before the last pre-token (or the last two, when the last is whitespace, which may regroup
    with what follows) are final. Without one, all but the last token."""
    enc = tok.encode(text, add_special_tokens=False)
    ids, offsets = enc.ids, enc.offsets
    pre = tok.pre_tokenizer
    if pre is None:
        return ids[:-1], len(ids)
    pieces = pre.pre_tokenize_str(text)
    if len(pieces) < 2:
        return [], len(ids)
    last = len(pieces) - 1
    if not pieces[last][0].strip("Ġ \t\nĊĉ") and last >= 1:  # whitespace (raw or byte-level mapped)
        last -= 1
    cut = pieces[last][1][0]
    n = 0
    while n < len(ids) and offsets[n][1] <= cut:
        n += 1
    return ids[:n], len(ids)


class CrossTokenizerDrafter(RowZeroAdapter):
    """SLEM drafting (arXiv:2502.05202) for every row at once with a draft that has its own tokenizer.

    ``gamma``: target tokens proposed per step at most ("auto": ``DEFAULT_GAMMA``). The draft
    writes about γ times its running draft-tokens-per-target-token ratio, plus one token
    (which usually completes the pre-token before the last), so that γ stable target tokens often remain."""

    wants_hidden = False

    def __init__(self, model: "Model", gamma: Gamma = "auto") -> None:
        check_gamma(gamma)
        if model.tokenizer is None:
            raise ConfigError(f"draft {model.path} has no tokenizer.json; the crosstok drafter exchanges text "
                              "with the target, so the draft needs its own tokenizer")
        self.model = model
        self.gamma: Gamma = DEFAULT_GAMMA if gamma == "auto" else gamma
        self.acceptance = Acceptance()
        self._dtok = model.tokenizer
        self._prefix = self._dtok.encode("", add_special_tokens=True).ids  # the draft's BOS, if it adds one
        self._dvocab = min(model.vocab_size, self._dtok.get_vocab_size(with_added_tokens=True))
        self._stop = set(self._dtok.get_added_tokens_decoder())  # special tokens (EOS among them): text ends
        self._ttok: Optional["Tokenizer"] = None
        self._target: Optional["Model"] = None
        self._cache: Optional["KVCache"] = None
        self._ids: list[list[int]] = []  # per row: the draft ids held in the row's cache
        self._texts: list[tuple[str, list[int], list[int]]] = []  # per row: text, its draft ids, their end offsets
        self.ratio = 1.5  # running draft tokens per target token

    # -- rows -------------------------------------------------------------------------------------
    def prepare_rows(self, target: "Model", rows: int, max_len: int) -> None:
        if target is not self._target:
            if target.tokenizer is None:
                raise ConfigError(f"target {target.path} has no tokenizer.json; the crosstok drafter needs the "
                                  "target's tokenizer to turn draft text into target tokens")
            if self.model.device != target.device:
                raise ConfigError(f"draft is on {self.model.device} but target is on {target.device}; "
                                  "load both on one device")
            self._ttok, self._target = target.tokenizer, target
        if self._cache is None or self._cache.batch_size < rows:
            self._cache = self.model.new_cache(rows, self.model.max_seq_len)
            self._ids = [[] for _ in range(rows)]
            self._texts = [("", [], []) for _ in range(rows)]

    def reset_row(self, row: int) -> None:
        if self._cache is not None:
            self._cache.reset(row)
            self._ids[row] = []
            self._texts[row] = ("", [], [])

    def move_row(self, src: int, dst: int) -> None:
        assert self._cache is not None
        self._cache.move_row(src, dst)
        self._ids[dst] = self._ids[src]
        self._texts[dst] = self._texts[src]
        self.reset_row(src)

    def on_verified_row(self, row: int, n_accepted: int) -> None:
        """Nothing to roll back here: the next proposal re-syncs the cache from the text."""

    def costs_for(self, target: "Model") -> Optional["Costs"]:
        return None


    # -- drafting ---------------------------------------------------------------------------------
    def _encode(self, row: int, text: str) -> list[int]:
        """``text`` in draft tokens, re-encoding only a tail when the text extends the row's last one
        (the text of verified tokens only grows); the tail starts ``RETOKENIZE_CHARS`` characters back, at
        a draft-token boundary, so a token the new text merges differently is re-tokenized."""
        old_text, old_ids, old_ends = self._texts[row]
        j = 0
        if old_ids and text.startswith(old_text):
            j = bisect.bisect_right(old_ends, len(old_text) - RETOKENIZE_CHARS)
        start = old_ends[j - 1] if j else 0
        enc = self._dtok.encode(text[start:], add_special_tokens=False)
        ids = old_ids[:j] + enc.ids
        ends = old_ends[:j] + [start + e for _, e in enc.offsets]
        self._texts[row] = (text, ids, ends)
        return ids

    def _draft_ids(self, row: int, ctx: DraftContext, steps: int) -> list[int]:
        """The row's text so far in draft tokens (the newest part, if the draft's context is short)."""
        assert self._ttok is not None
        text = self._ttok.decode(list(ctx.tokens), skip_special_tokens=True)
        body = self._encode(row, text)
        room = self.model.max_seq_len - steps - len(self._prefix)
        if len(body) > room:
            body = body[len(body) - max(room, 1):]
        return self._prefix + body

    def _sync(self, row: int, ids: list[int]) -> list[int]:
        """Keep the cache's longest common prefix with ``ids``; return what it must be fed (>= 1 token)."""
        assert self._cache is not None
        old = self._ids[row]
        keep = 0
        limit = min(len(old), len(ids) - 1)
        while keep < limit and old[keep] == ids[keep]:
            keep += 1
        self._cache.set_length(keep, row)
        self._ids[row] = ids[:keep]
        return ids[keep:]

    def _forward(self, feeds: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Append each row's tokens (rows between them get padding, dropped after); each fed row's last logits."""
        cache = self._cache
        assert cache is not None
        for r, f in feeds.items():
            self._ids[r] = self._ids[r] + f
        lo, hi = min(feeds), max(feeds) + 1
        width = max(len(f) for f in feeds.values())
        if len(feeds) == 1 or max(cache.lengths[lo:hi]) + width > cache.max_len:
            out = {}
            for r, f in feeds.items():
                x = torch.tensor([f], dtype=torch.long, device=self.model.device)
                out[r] = self.model.forward(x, cache, rows=slice(r, r + 1), last_only=True)[0, -1]
            return out
        real = [cache.lengths[r] + len(feeds.get(r, ())) for r in range(lo, hi)]
        ids = [feeds.get(r, []) + [0] * (width - len(feeds.get(r, ()))) for r in range(lo, hi)]
        logits = self.model.forward(torch.tensor(ids, dtype=torch.long, device=self.model.device), cache,
                                    rows=slice(lo, hi))
        for r, n in zip(range(lo, hi), real):
            cache.set_length(n, r)
        return {r: logits[r - lo, len(f) - 1] for r, f in feeds.items()}

    def _pick(self, logits: torch.Tensor, ctx: DraftContext, probs: list[torch.Tensor], index: int) -> int:
        """Greedy over the tokens the draft's tokenizer knows: proposals stay deterministic (exact by the
        one-hot rule whatever the row's sampling)."""
        return int(logits[: self._dvocab].argmax())

    def _text(self, context: list[int], toks: list[int]) -> str:
        """The text of draft tokens ``toks`` that follow ``context`` (cut at a stop token or a broken character)."""
        for i, t in enumerate(toks):
            if t in self._stop:
                toks = toks[:i]
                break
        if not toks:
            return ""
        anchor = [t for t in context[-ANCHOR:] if t not in self._stop]
        head = self._dtok.decode(anchor, skip_special_tokens=True)
        full = self._dtok.decode(anchor + toks, skip_special_tokens=True)
        text = full[len(head):] if full.startswith(head) else self._dtok.decode(toks, skip_special_tokens=True)
        bad = text.find("\ufffd")
        return text if bad < 0 else text[:bad]

    def propose_rows(self, contexts: Mapping[int, DraftContext]) -> dict[int, Draft]:
        if self._cache is None or self._ttok is None:
            raise RuntimeError("CrossTokenizerDrafter.prepare_rows(target, ...) must be called before proposing")
        drafts = {r: Draft() for r in contexts}
        cap = int(self.gamma)
        wanted = {r: min(cap, ctx.max_tokens) for r, ctx in contexts.items()}
        steps = {r: min(MAX_DRAFT_STEPS, math.ceil(k * self.ratio) + 1) for r, k in wanted.items() if k > 0}
        if not steps:
            return drafts
        with torch.inference_mode():
            context = {r: self._draft_ids(r, contexts[r], g) for r, g in steps.items()}
            feeds = {r: self._sync(r, ids) for r, ids in context.items()}
            tokens, _ = draft_rows(steps, contexts, self._forward(feeds), self._forward, self._pick)
        assert self._ttok is not None
        n_draft = n_target = 0
        for r, toks in tokens.items():
            text = self._text(context[r], toks)
            ids, total = stable_prefix(self._ttok, text) if text else ([], 0)
            n_draft += len(toks)
            n_target += total
            drafts[r] = Draft(ids[: wanted[r]])
        if n_target:
            self.ratio = 0.9 * self.ratio + 0.1 * min(4.0, max(0.25, n_draft / n_target))
        return drafts


def _build(o: DrafterOptions) -> Optional[BatchDrafter]:
    return CrossTokenizerDrafter(o.draft, gamma=o.gamma) if o.draft is not None else None


SPECS = (DrafterSpec(
    "crosstok", "a draft model with its OWN tokenizer (--draft DIR): its text is re-tokenized for the target (SLEM, "
    "arXiv:2502.05202), exact as a deterministic draft", _build, needs_draft_model=True, own_tokenizer=True,
    bench=(BenchVariant("crosstok", "a draft with its own tokenizer (--crosstok-draft DIR, else --draft), "
                        "re-tokenized as text (SLEM), γ from --gammas", sweep="gammas"),)),)
