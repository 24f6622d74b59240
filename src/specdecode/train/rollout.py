"""Batched rollouts with a loaded model's KV cache, and teacher-forced logits on whole sequences.

Both distillation (on-policy data) and draft evaluation (the target's greedy
and sampled paths) need "let the target write" and "score these sequences".
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ..models import Model


def sample_windows(stream: np.ndarray, n: int, length: int, seed: int) -> torch.Tensor:
    """``n`` windows of ``length`` tokens at seeded random offsets of a token stream: [n, length] int64."""
    if len(stream) < length + 1:
        raise ValueError(f"token stream of {len(stream)} tokens is shorter than one window of {length}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - length, (n,), generator=g)
    s = torch.from_numpy(stream.astype(np.int64))
    return s[starts.unsqueeze(1) + torch.arange(length).unsqueeze(0)]


@torch.inference_mode()
def generate(model: Model, prompts: torch.Tensor, n_new: int, temperature: float,
             generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Continue equal-length ``prompts`` [B, P] by ``n_new`` tokens: greedy at T=0, else sampled at T.

    Rows keep going past EOS: documents are separated by EOS in training too,
    so what follows is still in-distribution, and every row has the same length.
    """
    b, p = prompts.shape
    cache = model.new_cache(b, p + n_new)
    out = torch.empty(b, p + n_new, dtype=torch.long)
    out[:, :p] = prompts
    logits = model.forward(prompts.to(model.device), cache, last_only=True)[:, -1]
    for i in range(n_new):
        if temperature <= 0:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1).cpu()
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        out[:, p + i] = nxt.cpu()
        if i + 1 < n_new:
            logits = model.forward(nxt.view(b, 1).to(model.device), cache)[:, -1]
    return out


@torch.inference_mode()
def generate_ragged(model: Model, prompts: Sequence[Sequence[int]], total_len: int, temperature: float,
                    generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Continue prompts of different lengths until each row holds ``total_len`` tokens: [B, total_len].

    Each prompt is prefilled into its own cache row; the rows then decode together, each at its own
    position (the cache's per-row offsets), so row i gets ``total_len - len(prompts[i])`` new tokens
    exactly as a lone ``generate`` would write them. Sort prompts by length first to waste little:
    the batch runs until its shortest prompt is complete, and a longer row's surplus is dropped.
    """
    b = len(prompts)
    lens = [len(p) for p in prompts]
    if not lens or min(lens) < 1 or max(lens) >= total_len:
        raise ValueError(f"prompts must hold 1..{total_len - 1} tokens, got lengths {min(lens, default=0)}.."
                         f"{max(lens, default=0)}")
    n_steps = total_len - min(lens)
    cache = model.new_cache(b, max(lens) + n_steps)
    out = torch.zeros(b, max(lens) + n_steps, dtype=torch.long)
    last = []
    for i, p in enumerate(prompts):
        out[i, : lens[i]] = torch.tensor(list(p), dtype=torch.long)
        ids = out[i : i + 1, : lens[i]].to(model.device)
        last.append(model.forward(ids, cache, rows=slice(i, i + 1), last_only=True)[:, -1])
    logits = torch.cat(last)
    pos = torch.tensor(lens)
    for i in range(n_steps):
        if temperature <= 0:
            nxt = logits.argmax(-1).cpu()
        else:
            probs = torch.softmax(logits / temperature, dim=-1).cpu()
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        out[torch.arange(b), pos + i] = nxt
        if i + 1 < n_steps:
            logits = model.forward(nxt.view(b, 1).to(model.device), cache)[:, -1]
    return out[:, :total_len]


@torch.inference_mode()
def full_logits(model: Model, seqs: torch.Tensor) -> torch.Tensor:
    """Teacher-forced float32 logits [B, T, V] for whole sequences (plain causal attention, no cache)."""
    return model.module(seqs.to(model.device)).float()
