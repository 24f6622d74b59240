"""Sampled chain verification for a whole batch on the logits' device, with one host sync.

Why: ``verify.rejection_sample`` and ``verify.block_verify`` judge one row at a time and read their numbers on the
host (``.tolist()`` of the ratios, the uniforms, the residual mass, the drawn token): on a GPU each is a sync
that stalls the stream, several per row and step. Here every sampled chain row of a step is judged together in
tensor code and the step reads back one small tensor: each row's accepted count and next token.

The rules are the same, position for position (``verify.py`` stays the reference these are tested against):
each row consumes its generator exactly as the reference does (its γ uniforms, then one float64 uniform for the
draw), computes the same ratios, weights and residual masses in the same dtypes and order, and draws by the same
inverse CDF, so a row's result equals the reference's for the same generator state (tests check it on random
laws, besides the chi-square tests of the emitted law). Coupled rows (seeded sampling) are judged in the same
read: their draws argmax p · rate on the device, then the greedy walk. Sampled trees: ``verify_tree_batch``; the
step's single read of both: ``verify_step``; greedy rows (one argmax list a step already) stay with ``verify_draft``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .verify import _RESIDUAL_EPS, VerifyResult


@dataclass(frozen=True)
class ChainRow:
    """One sampled chain row: the target's filtered law after each prefix, [≥ g + 1, V] float32 (rows past g + 1
    are ignored), the g draft tokens, the draft's law of each ([g, V], None: a deterministic drafter), the row's
    rule ("block", "token", or "coupled": then ``rates``, the Gumbel-max noise rates of its g + 1 positions, as
    ``verify.coupled_verify`` takes them) and generator."""

    probs: torch.Tensor
    tokens: Sequence[int]
    draft_probs: Optional[torch.Tensor]
    rule: str
    generator: Optional[torch.Generator]
    rates: Optional[torch.Tensor] = None


def chain_outcomes(rows: Sequence[ChainRow]) -> torch.Tensor:
    """[3, B] on the device, unread, in ``rows``' order: accepted count, next token, whether the weights were
    valid."""
    coupled = [i for i, r in enumerate(rows) if r.rule == "coupled"]
    sampled = [i for i, r in enumerate(rows) if r.rule != "coupled"]
    parts = []
    if sampled:
        parts.append(_sampled([rows[i] for i in sampled]))
    if coupled:
        parts.append(_coupled([rows[i] for i in coupled]))
    out = torch.cat(parts, dim=1)
    if coupled and sampled:  # back to the rows' order (an index made on the host: no read)
        where = [0] * len(rows)
        for j, i in enumerate(sampled + coupled):
            where[i] = j
        out = out[:, torch.tensor(where, device=out.device)]
    return out


def read_chains(out: Sequence[Sequence[int]], rows: Sequence[ChainRow]) -> list[VerifyResult]:
    """``chain_outcomes``' columns, read on the host, as ``VerifyResult``s."""
    return [VerifyResult(out[0][j], out[1][j], out[0][j] == len(r.tokens)) for j, r in enumerate(rows)]


def verify_chains(rows: Sequence[ChainRow]) -> list[VerifyResult]:
    """Every row's ``VerifyResult``, computed on the rows' device; one host read for the whole batch."""
    if not rows:
        return []
    out = chain_outcomes(rows).tolist()  # the one host read
    check_valid(out[2])
    return read_chains(out, rows)


def check_valid(valid: Sequence[int]) -> None:
    """The draws' weights were valid in every row (``sampling.draw``'s error otherwise)."""
    if not all(valid):
        raise ValueError("cannot sample: the weights hold a negative, inf or nan entry, or sum to zero")


def _coupled(rows: Sequence[ChainRow]) -> torch.Tensor:
    """The coupled rule (``verify.coupled_verify``): each position's draw is argmax p · rate; the draft is kept
    while it equals the draws, and the first differing (or the bonus) draw comes next. [3, B] on the device."""
    dev = rows[0].probs.device
    lengths = [len(r.tokens) for r in rows]
    g_max = max(lengths)
    draws = torch.stack([_pad((r.probs[: g + 1].float() * _need(r.rates)[: g + 1]).argmax(dim=-1), g_max + 1)
                         for r, g in zip(rows, lengths)])  # [B, G + 1]
    tokens = torch.tensor([list(r.tokens) + [-1] * (g_max - len(r.tokens)) for r in rows], dtype=torch.long,
                          device=dev).view(len(rows), g_max)
    n = (draws[:, :g_max] == tokens).long().cumprod(dim=1).sum(dim=1)
    nxt = draws.gather(1, n.unsqueeze(1)).squeeze(1)
    return torch.stack([n, nxt, torch.ones_like(n)])


def _need(rates: Optional[torch.Tensor]) -> torch.Tensor:
    if rates is None:
        raise ValueError("a coupled row needs its noise rates")
    return rates


def _pad(x: torch.Tensor, n: int) -> torch.Tensor:
    """A 1-D tensor padded with zeros to length n."""
    return x if x.shape[0] == n else torch.cat([x, x.new_zeros(n - x.shape[0])])


def _sampled(rows: Sequence[ChainRow]) -> torch.Tensor:
    """The block and token-by-token rules for ``rows``: [3, B] on the device (count, next token, valid)."""
    dev = rows[0].probs.device
    lengths = [len(r.tokens) for r in rows]
    g_max = max(lengths)
    b = len(rows)
    p = _batch([_rows(r.probs.float(), g_max + 1) for r in rows])  # [B, G + 1, V]
    v = p.shape[-1]
    tokens = torch.tensor([list(r.tokens) + [0] * (g_max - len(r.tokens)) for r in rows], dtype=torch.long,
                          device=dev).view(b, g_max)
    length = torch.tensor(lengths, device=dev)
    dense = [r.draft_probs is not None and len(r.tokens) > 0 for r in rows]  # an empty draft has no law to read
    q = None  # [B, G, V] draft laws (zeros for deterministic rows, which use one-hot formulas instead)
    if any(dense):
        q = _batch([_rows(r.draft_probs.float(), g_max) if d and r.draft_probs is not None
                    else p.new_zeros(g_max, v) for r, d in zip(rows, dense)])
    det = torch.tensor([not d for d in dense], device=dev)
    # each row's γ uniforms, as the reference draws them (float32, one call per row)
    eta = torch.ones(b, g_max, dtype=torch.float32, device=dev)
    for i, r in enumerate(rows):
        if lengths[i]:
            eta[i, : lengths[i]] = torch.rand(lengths[i], generator=r.generator, device=dev)
    p_x = p[:, :g_max].gather(2, tokens.unsqueeze(2)).squeeze(2)  # [B, G]
    q_x = torch.ones_like(p_x) if q is None else torch.where(det.unsqueeze(1), 1.0,
                                                             q.gather(2, tokens.unsqueeze(2)).squeeze(2))
    valid = torch.arange(g_max, device=dev).unsqueeze(0) < length.unsqueeze(1)
    block = torch.tensor([r.rule == "block" for r in rows], device=dev)
    n_tok = _token_counts(p_x, q_x, eta, valid)
    n_blk, w = _block_counts(p, q, det, tokens, p_x, q_x, eta, length) if bool(any(r.rule == "block" for r in rows)) \
        else (n_tok, None)
    n = torch.where(block, n_blk, n_tok)
    # the law of the next token: the target's after the whole draft, else the residual at the stop
    ar = torch.arange(b, device=dev)
    bonus = n == length
    p_n = p[ar, n]  # [B, V]
    scale = torch.ones(b, dtype=torch.float32, device=dev)
    if w is not None:  # block rows scale p by their prefix weight w_τ (rounded to float32, as the reference)
        scale = torch.where(block, w.gather(1, n.unsqueeze(1)).squeeze(1).float(), scale)
    residual = p_n * scale.unsqueeze(1)
    if q is not None:
        residual = residual - torch.where(det.unsqueeze(1), 0.0, q[ar, n.clamp(max=max(g_max - 1, 0))])
    residual = residual.clamp_min(0.0)
    stop_token = tokens[ar, n.clamp(max=max(g_max - 1, 0))] if g_max else torch.zeros_like(n)
    at = stop_token.unsqueeze(1)  # a deterministic draft's rejected token is not drawn again (no bool index: no sync)
    residual.scatter_(1, at, torch.where((det & ~bonus).unsqueeze(1), 0.0, residual.gather(1, at)))
    thin = residual.sum(dim=1) <= _RESIDUAL_EPS  # reachable only by rounding: p and q agree there
    residual = torch.where((bonus | thin).unsqueeze(1), p_n, residual)
    nxt, ok = _draw(residual, [r.generator for r in rows])
    return torch.stack([n, nxt, ok.long()])


def _batch(xs: list[torch.Tensor]) -> torch.Tensor:
    """The rows' tensors stacked; one row's is a view (no copy of its [positions, V] law)."""
    return xs[0].unsqueeze(0) if len(xs) == 1 else torch.stack(xs)


def _rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """The first n rows of ``x`` [rows, V], zero rows appended where it has fewer (positions no rule reads)."""
    if x.shape[0] >= n:
        return x[:n]
    return torch.cat([x, x.new_zeros(n - x.shape[0], x.shape[1])])


def _token_counts(p_x: torch.Tensor, q_x: torch.Tensor, eta: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Token-by-token (``verify.rejection_sample``): accept while u·q(x) < p(x); the count of the accepted prefix."""
    accept = (eta * q_x < p_x) & valid
    return accept.long().cumprod(dim=1).sum(dim=1)


def _block_counts(p: torch.Tensor, q: Optional[torch.Tensor], det: torch.Tensor, tokens: torch.Tensor,
                  p_x: torch.Tensor, q_x: torch.Tensor, eta: torch.Tensor, length: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification (``verify.block_verify``, Algorithm 2 of arXiv:2403.10444): τ per row, and the weights
    w_0..w_G [B, G + 1] in float64 (the reference's Python floats)."""
    b, g_max = p_x.shape
    dev = p_x.device
    a, c = p_x.double(), q_x.double()
    inf = torch.full_like(a, float("inf"))
    ratio = torch.where(c > 0, a / c, torch.where(a > 0, inf, torch.zeros_like(a)))
    w = [torch.ones(b, dtype=torch.float64, device=dev)]
    for i in range(g_max):
        prev = w[-1]
        w.append(torch.where(prev > 0, torch.clamp(prev * ratio[:, i], max=1.0), torch.zeros_like(prev)))
    weights = torch.stack(w, dim=1)  # [B, G + 1]
    # S_i (i = 1..G-1): the residual mass after X_i; one-hot drafts: w_i (1 - p(X_{i+1})) in float64
    s = torch.zeros(b, g_max, dtype=torch.float64, device=dev)  # s[:, i - 1] = S_i
    if g_max > 1:
        s_det = weights[:, 1:g_max] * (1.0 - a[:, 1:g_max])
        if q is not None:
            w32 = weights[:, 1:g_max].float().unsqueeze(2)
            s_dense = (w32 * p[:, 1:g_max] - q[:, 1:g_max]).clamp_min(0.0).sum(dim=2).double()
            s_det = torch.where(det.unsqueeze(1), s_det, s_dense)
        s[:, : g_max - 1] = s_det
    idx = torch.arange(1, g_max + 1, device=dev).unsqueeze(0)  # i = 1..G
    e = eta.double()
    last = idx == length.unsqueeze(1)
    inner = e * ((s + 1.0) - weights[:, 1:]) < s  # η_i < h_i = S_i / (S_i + 1 - w_i), without dividing
    top = e < weights[:, 1:]  # i = g: h_g = w_g
    cond = torch.where(last, top, inner) & (idx <= length.unsqueeze(1))
    tau = (cond.long() * idx).amax(dim=1) if g_max else torch.zeros(b, dtype=torch.long, device=dev)
    return tau, weights


def _draw(weights: torch.Tensor, generators: Sequence[Optional[torch.Generator]]
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``weights`` [B, V] by ``sampling.draw``'s inverse CDF (float64 sums; the uniform
    drawn from each row's generator as ``draw`` draws it), and whether each row's weights were valid."""
    dev = weights.device
    u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64, device=dev) for g in generators])
    cdf = weights.cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1:].contiguous()
    ok = torch.isfinite(total).squeeze(1) & (total > 0).squeeze(1) & (weights.amin(dim=1) >= 0)
    idx = torch.searchsorted(cdf, u.unsqueeze(1) * total, right=True)
    last = torch.searchsorted(cdf, total)  # the last entry with weight: where the sum first reaches its total
    return torch.minimum(idx, last).squeeze(1), ok
