"""Held-out acceptance rate α of a draft against a target (Leviathan et al., 2023).

α is the expected probability that speculative sampling accepts a draft token:
at T=0, how often the draft's argmax equals the target's along the target's
greedy path; at T=1, the mean of Σx min(p(x), q(x)) = 1 - TV(p, q) along a path
the target samples. Prompts come from held-out files only. Unigram and bigram
drafters fitted on the training split give the floor any real draft should beat.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from ..drafters import VocabularyMismatchError, check_vocab_compatible
from ..drafters.vocab import draft_vocab_for
from ..models import Model, load_model
from . import data as D
from .common import fmt_count
from .rollout import full_logits, generate, sample_windows
from .tokenizer import EOT, encode_batch_fn


EVAL_SEED = 1234  # eval-draft's default and distill's final report use the same prompts and samples


@dataclass
class AlphaRow:
    drafter: str
    alpha_t0: float  # greedy: P(draft argmax == target argmax)
    alpha_t1: float  # sampling: E[sum_x min(p, q)]
    params: Optional[int] = None


@dataclass
class DraftEvalResult:
    target: str
    draft: str
    rows: list[AlphaRow]
    prompts: int
    prompt_len: int
    new_tokens: int
    positions_t0: int
    positions_t1: int
    held_out_files: int
    extra: dict = field(default_factory=dict)

    def row(self, name: str) -> AlphaRow:
        return next(r for r in self.rows if r.drafter == name)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def __str__(self) -> str:
        lines = [f"held-out acceptance rate α: target {self.target}, draft {self.draft}",
                 f"  {self.prompts} prompts x {self.prompt_len} tokens from {self.held_out_files} held-out files, "
                 f"{self.new_tokens} target tokens each ({self.positions_t0} positions at T=0, "
                 f"{self.positions_t1} at T=1)",
                 f"  {'drafter':<14} {'params':>9} {'α (T=0)':>9} {'α (T=1)':>9}"]
        for r in self.rows:
            params = fmt_count(r.params) if r.params else "-"
            lines.append(f"  {r.drafter:<14} {params:>9} {r.alpha_t0:>9.3f} {r.alpha_t1:>9.3f}")
        return "\n".join(lines)


# A drafter maps token sequences [B, T] to float32 logits or log-probs [B, T, V].
Drafter = Callable[[torch.Tensor], torch.Tensor]


def check_compatible(target: Model, draft: Model) -> None:
    """The drafters' check (one tokenizer), plus equal output sizes: α compares whole distributions.
    Raises ``VocabularyMismatchError``, which the CLI prints as one line."""
    check_vocab_compatible(draft, target)
    if draft.vocab_size != target.vocab_size:
        raise VocabularyMismatchError(
            f"vocab mismatch: draft ({draft.path}) has {draft.vocab_size} output tokens, target ({target.path}) has "
            f"{target.vocab_size}; eval-draft compares whole distributions, so the sizes must match")


class NGramDrafter:
    """Unigram (order 1) or bigram (order 2, add-β backed off to the unigram) fitted on a token stream."""

    def __init__(self, stream: np.ndarray, vocab_size: int, order: int, beta: float = 1.0) -> None:
        if order not in (1, 2):
            raise ValueError("order must be 1 (unigram) or 2 (bigram)")
        self.order, self.vocab, self.beta = order, vocab_size, beta
        counts = np.bincount(stream, minlength=vocab_size)[:vocab_size].astype(np.float64) + 0.5
        self.unigram = torch.from_numpy(counts / counts.sum()).float()
        if order == 2:
            pairs = stream[:-1].astype(np.int64) * vocab_size + stream[1:].astype(np.int64)
            keys, c = np.unique(pairs, return_counts=True)
            self.keys, self.counts = keys, c.astype(np.float32)
            self.row_start = np.searchsorted(keys, np.arange(vocab_size + 1, dtype=np.int64) * vocab_size)

    def _bigram_row(self, prev: int) -> torch.Tensor:
        row = self.beta * self.unigram.clone()
        a, b = self.row_start[prev], self.row_start[prev + 1]
        if b > a:
            row[torch.from_numpy(self.keys[a:b] % self.vocab)] += torch.from_numpy(self.counts[a:b])
        return row / row.sum()

    def __call__(self, seqs: torch.Tensor) -> torch.Tensor:
        b, t = seqs.shape
        if self.order == 1:
            return self.unigram.log().expand(b, t, self.vocab)
        rows = {int(x): self._bigram_row(int(x)).log() for x in torch.unique(seqs).tolist()}
        return torch.stack([torch.stack([rows[int(x)] for x in seq]) for seq in seqs])

    def num_parameters(self) -> int:
        return self.vocab if self.order == 1 else self.vocab + len(self.keys)


def _alpha_parts(p_logits: torch.Tensor, q_logits: torch.Tensor, greedy: bool) -> torch.Tensor:
    """Per-position acceptance: argmax agreement (greedy) or Σ min(p, q)."""
    if greedy:
        return (p_logits.argmax(-1) == q_logits.argmax(-1)).float()
    p = torch.softmax(p_logits.float(), -1)
    q = torch.softmax(q_logits.float(), -1)
    return torch.minimum(p, q).sum(-1)


def measure_alpha(target: Model, drafters: dict[str, Drafter], prompts: torch.Tensor, new_tokens: int,
                  seed: int = 0, batch_size: int = 16) -> tuple[dict[str, tuple[float, float]], int]:
    """α at T=0 and T=1 for each drafter along the target's own greedy and sampled paths."""
    sums = {name: [0.0, 0.0] for name in drafters}
    n_pos = 0
    p_len = prompts.shape[1]
    gen = torch.Generator().manual_seed(seed)
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        for mode, temp in ((0, 0.0), (1, 1.0)):
            seqs = generate(target, chunk, new_tokens, temp, gen)
            # Position j's logits predict token j+1: score the predictions of the generated tokens.
            p = full_logits(target, seqs)[:, p_len - 1:-1]
            for name, drafter in drafters.items():
                q = drafter(seqs)[:, p_len - 1:-1].to(p.device)
                sums[name][mode] += _alpha_parts(p, q, greedy=mode == 0).sum().item()
            del p
        n_pos += chunk.shape[0] * new_tokens
    return {name: (s[0] / n_pos, s[1] / n_pos) for name, s in sums.items()}, n_pos


def chain_tau(ok: torch.Tensor, gammas: Sequence[int]) -> dict[int, float]:
    """τ(γ) of a greedy top-1 chain from per-position hits ``ok`` [rows, positions]: at every anchor with
    γ positions after it, 1 + the leading run of hits capped at γ, averaged."""
    n = ok.shape[1]
    tau = {}
    for g in gammas:
        run = torch.stack([ok[:, a: a + g].long().cumprod(-1).sum(-1) for a in range(n - g + 1)], -1)
        tau[g] = 1.0 + float(run.float().mean())
    return tau


def doc_separator(m: Model) -> int:
    """The id that separates documents: BOS if the config names one, else EOS, else <|endoftext|>."""
    if m.config.bos_token_id is not None:
        return int(m.config.bos_token_id)
    if m.eos_token_ids:
        return min(m.eos_token_ids)
    eot = m.tokenizer.token_to_id(EOT) if m.tokenizer is not None else None
    if eot is not None:
        return eot
    raise ValueError(f"{m.path} names no BOS/EOS token to separate documents with")


def model_drafter(m: Model) -> Drafter:
    return lambda seqs: full_logits(m, seqs)


def restricted_drafters(m: Model) -> dict[str, Drafter]:
    """The draft over its full vocabulary and, when it ships draft_vocab.json, over the restricted one
    the runtime uses by default (``draft/topN``); one forward pass serves both."""
    vocab = draft_vocab_for(m, "auto")
    if vocab is None:
        return {"draft": model_drafter(m)}
    memo: dict[str, torch.Tensor] = {}

    def full(seqs: torch.Tensor) -> torch.Tensor:
        if memo.get("seqs") is not seqs:
            memo["seqs"], memo["logits"] = seqs, full_logits(m, seqs)
        return memo["logits"]

    mask = torch.full((m.vocab_size,), float("-inf"), device=m.device)
    mask[vocab.ids] = 0.0
    return {"draft": full, f"draft/top{vocab.size}": lambda seqs: full(seqs) + mask}


def evaluate_draft(target: str | Model, draft: Optional[str | Model], corpus: Optional[Sequence[str]] = None,
                   prompts: int = 64, prompt_len: int = 64, new_tokens: int = 128, seed: int = EVAL_SEED,
                   device: str = "cpu", dtype: str = "auto", ngrams: bool = True,
                   batch_size: int = 16) -> DraftEvalResult:
    """Held-out α of ``draft`` (and unigram/bigram baselines) against ``target``."""
    tgt = target if isinstance(target, Model) else load_model(target, device=device, dtype=dtype)
    drafters: dict[str, Drafter] = {}
    params: dict[str, int] = {}
    if draft is not None:
        drf = draft if isinstance(draft, Model) else load_model(draft, device=device, dtype=dtype)
        check_compatible(tgt, drf)
        for name, fn in restricted_drafters(drf).items():
            drafters[name] = fn
            params[name] = drf.num_parameters()
    if tgt.tokenizer is None:
        raise ValueError(f"target {tgt.path} has no tokenizer.json; α is measured on held-out corpus text")
    train, held = D.split_corpus(D.list_corpus(corpus or None))
    enc, eot = encode_batch_fn(tgt.tokenizer), doc_separator(tgt)
    held_stream = D.token_stream(held, enc, eot)
    if ngrams:
        train_stream = D.token_stream(train, enc, eot)
        for name, order in (("unigram", 1), ("bigram", 2)):
            ng = NGramDrafter(train_stream, tgt.vocab_size, order)
            drafters[name] = ng
            params[name] = ng.num_parameters()
    if not drafters:
        raise ValueError("nothing to evaluate: pass a draft or keep the n-gram baselines")
    max_len = tgt.max_seq_len
    if prompt_len + new_tokens > max_len:
        raise ValueError(f"prompt_len + new_tokens = {prompt_len + new_tokens} exceeds the target's context {max_len}")
    windows = sample_windows(held_stream, prompts, prompt_len, seed)
    alphas, n_pos = measure_alpha(tgt, drafters, windows, new_tokens, seed=seed, batch_size=batch_size)
    rows = [AlphaRow(name, a0, a1, params.get(name)) for name, (a0, a1) in alphas.items()]
    return DraftEvalResult(target=tgt.path, draft=str(getattr(draft, "path", draft)), rows=rows, prompts=prompts,
                           prompt_len=prompt_len, new_tokens=new_tokens, positions_t0=n_pos, positions_t1=n_pos,
                           held_out_files=len(held))


__all__ = ["AlphaRow", "DraftEvalResult", "NGramDrafter", "check_compatible",
           "evaluate_draft", "measure_alpha"]
