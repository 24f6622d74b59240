"""Logits -> filtered probabilities -> a token, split so the verifier sees the same law as the sampler.

Filters run in transformers' order and with its semantics: temperature, then
top-k, then top-p, then min-p (each keeps at least one token). The same function
is applied to target and draft logits: applying a filter to only one side
breaks exactness (vLLM once shipped that bug).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .config import SamplingConfig
from .kernels.fused import loaded_fused_extension


def filter_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature-scaled logits with filtered-out entries set to -inf. ``logits``: [N, V] float32."""
    scores = logits / cfg.temperature if cfg.temperature not in (0.0, 1.0) else logits.clone()
    if cfg.top_k is not None and cfg.top_k < scores.shape[-1]:
        kth = torch.topk(scores, cfg.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        scores = scores.masked_fill(_outside_nucleus(scores, cfg.top_p), float("-inf"))
    if cfg.min_p is not None and cfg.min_p > 0.0:
        probs = scores.softmax(dim=-1)
        remove = probs < cfg.min_p * probs.amax(dim=-1, keepdim=True)
        top = scores.argmax(dim=-1, keepdim=True)
        remove.scatter_(-1, top, False)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


NUCLEUS_PROBE = 256  # top-p looks at a row's best this many tokens first (a full sort only when they fall short)


def _outside_nucleus(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask of the tokens top-p removes: a token stays while the tokens ranked above it hold less than
    ``top_p`` of the mass (the best one always stays), as transformers' ``TopPLogitsWarper``.

    Why not sort every row on the CPU: sorting a 49k vocabulary takes ~3.5 ms on a core, more than half a
    135M model's decode step, and verification filters every drafted position. A row whose best
    ``NUCLEUS_PROBE`` tokens hold at least ``top_p`` has its nucleus among them (~0.1 ms); only the
    other rows are sorted. Picking those rows reads the device, so off the CPU (where a sort costs
    microseconds and a read stalls the stream) every row is sorted. Each row's mask depends on that row
    alone, so the sampler and the verifier, one row or a batch, apply the same law."""
    shape = scores.shape
    v = shape[-1]
    scores = scores.reshape(-1, v)  # any leading dims: rows
    if scores.device.type != "cpu" or NUCLEUS_PROBE >= v:
        return sorted_outside_nucleus(scores, top_p).view(shape)
    remove = torch.ones_like(scores, dtype=torch.bool)
    vals, idx = torch.topk(scores, NUCLEUS_PROBE, dim=-1)  # best first
    p = (vals - torch.logsumexp(scores, dim=-1, keepdim=True)).exp()
    keep = (p.cumsum(dim=-1) - p) < top_p  # the mass ranked above each token
    keep[:, 0] = True
    covered = p.sum(dim=-1) >= top_p
    remove[covered] = remove[covered].scatter(-1, idx[covered], ~keep[covered])
    todo = torch.arange(scores.shape[0], device=scores.device)[~covered]
    if len(todo):
        remove[todo] = sorted_outside_nucleus(scores[todo], top_p)
    return remove.view(shape)


def sorted_outside_nucleus(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """``_outside_nucleus`` of rows [N, V] by a full sort of each (the same mask, no host read)."""
    sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
    cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1.0 - top_p)
    remove_sorted[..., -1:] = False
    return remove_sorted.scatter(-1, order, remove_sorted)


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution a token is drawn from: softmax of the filtered logits, float32, [N, V]."""
    return filter_logits(logits.float(), cfg).softmax(dim=-1)


def draw(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One token per row of ``probs`` [N, V] (non-negative weights, not necessarily normalised) -> [N] int64.

    Inverse-CDF sampling: the first index whose cumulative weight exceeds u * total, with u ~ U[0, 1)
    from ``generator`` and the sum in float64 (so the law is the weights' up to ~1e-16; a zero-weight
    token is never drawn). Why not ``torch.multinomial``: on the CPU it costs ~180 µs for 8192
    categories, more than a draft step and a sixth of a target step; the fused CPU op costs ~5 µs.
    """
    if probs.dim() != 2 or probs.shape[-1] == 0:
        raise ValueError(f"draw needs weights [rows, categories], got shape {tuple(probs.shape)}")
    u = torch.rand(probs.shape[0], generator=generator, dtype=torch.float64, device=probs.device)
    ext = loaded_fused_extension()  # exact either way: no model's kernel choice applies
    if ext is not None and probs.device.type == "cpu" and probs.dtype == torch.float32 and probs.stride(-1) == 1:
        idx = ext.sample_rows(probs, u.tolist())
        if min(idx) < 0:
            raise ValueError("cannot sample: the weights hold a negative, inf or nan entry, or sum to zero")
        return torch.tensor(idx, dtype=torch.long)
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    if not bool(torch.isfinite(total).all() and (total > 0).all() and (probs >= 0).all()):
        raise ValueError("cannot sample: the weights hold a negative, inf or nan entry, or sum to zero")
    idx = torch.searchsorted(cdf, u.unsqueeze(-1) * total, right=True).squeeze(-1)
    last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).int().argmax(dim=-1)  # u * total rounded up to total
    return torch.minimum(idx, last)


def make_generator(seed: Optional[int], device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


_U64 = (1 << 64) - 1


class CoupledNoise:
    """The shared randomness of the Gumbel-max coupling (Daliri, Musco & Suresh, arXiv:2408.07978): one
    vector of Exp(1) variables E_i[x] per sequence position i, a pure function of (seed, i).

    The token at position i is ``argmax_x p_i(x) / E_i[x]`` (an exponential race; with g = -log E it is
    ``argmax log p_i + g``, the Gumbel-max trick), which is a draw from p_i whatever p_i is. A drafter
    draws its token at position i with the same E_i from its own law q_i, and the verifier keeps a
    draft token exactly when it equals the target's own draw there (``verify.coupled_verify``): the
    output is then the same tokens plain decoding with this seed writes, whatever the drafter, γ,
    tree or batch, and the agreement rate is at least (1 - TV(p, q)) / (1 + TV(p, q)).

    Why a counter-based generator: E_i must not depend on how many draws came before (that count
    changes with γ and acceptance). Philox4x64 keyed by the seed with counter word 1 = i gives each
    position its own stream (word 0 counts within it), so no two positions share noise; numpy's
    ziggurat turns it into float64 exponentials. A position's noise is made once and cached (the
    draft and the verifier read it, and a rejected position is read again at the next pass); it is
    kept as float32 rates 1/E, so a draw is one multiply and an argmax over the vocabulary; its law
    is p's up to the float32 rounding of p / E (relative 6e-8), the precision of p itself.
    """

    def __init__(self, seed: int, vocab: int, device: torch.device | str = "cpu", keep: int = 128) -> None:
        if vocab < 1:
            raise ValueError(f"vocab must be positive, got {vocab}")
        self.seed, self.vocab, self.device, self.keep = int(seed), vocab, torch.device(device), keep
        key = self.seed % (1 << 128)  # Philox's 128-bit key; any int seed (negative too) maps to one
        self._bits = np.random.Philox(0)  # seeded, so no OS entropy is read; key and counter are set below
        self._gen = np.random.Generator(self._bits)
        self._state = self._bits.state
        self._state["state"]["key"] = np.array([key & _U64, key >> 64], dtype=np.uint64)
        self._e = np.empty(vocab)  # float64 scratch
        self._rates: dict[int, torch.Tensor] = {}

    def rate(self, position: int) -> torch.Tensor:
        """[V] float32: 1 / E_position (cached)."""
        r = self._rates.get(position)
        if r is None:
            if position < 0:
                raise ValueError(f"positions start at 0, got {position}")
            st = self._state  # the stream of counter (0, position, 0, 0), from its start
            st["state"]["counter"] = np.array([0, position, 0, 0], dtype=np.uint64)
            st["buffer_pos"], st["has_uint32"], st["uinteger"] = 4, 0, 0
            self._bits.state = st
            e = self._gen.standard_exponential(self.vocab, out=self._e)
            np.maximum(e, 1e-30, out=e)  # E = 0 (probability 2^-53 each) would make 0 * inf = nan
            r = torch.from_numpy(np.reciprocal(e, out=np.empty(self.vocab, np.float32), casting="same_kind"))
            r = r.to(self.device)
            if len(self._rates) >= self.keep:  # a bound for callers that never call window()
                del self._rates[min(self._rates)]
            self._rates[position] = r
        return r

    def window(self, start: int, count: int) -> torch.Tensor:
        """[count, V] float32: the rates of positions start .. start + count - 1. Positions before
        ``start`` are forgotten: the caller (the verifier) says the sequence has passed them."""
        for p in [p for p in self._rates if p < start]:
            del self._rates[p]
        if count == 1:  # plain decoding: a view, no copy
            return self.rate(start).unsqueeze(0)
        return torch.stack([self.rate(p) for p in range(start, start + count)])

    def draw(self, probs: torch.Tensor, position: int) -> int:
        """The coupled draw at ``position`` from weights ``probs`` ([V] or [1, V])."""
        return coupled_draws(probs.reshape(1, -1), self.rate(position).unsqueeze(0))[0]


def coupled_draws(probs: torch.Tensor, rates: torch.Tensor) -> list[int]:
    """Row-wise ``argmax probs * rates``: the exponential race, a draw from each row of ``probs``
    [N, V] (non-negative weights) given the rates 1/E [N, V] of its position. A zero-weight token
    never wins (every rate is positive and at least one weight is)."""
    if probs.shape != rates.shape:
        raise ValueError(f"coupled draws need weights and rates of one shape, got {tuple(probs.shape)} and "
                         f"{tuple(rates.shape)} (a drafter's law must cover the target's vocabulary)")
    return (probs.float() * rates).argmax(dim=-1).tolist()
