"""Sampled tree verification for a whole batch on the logits' device, with one host read.

Why: ``verify.rejection_sample_tree`` walks one row's tree node by node and reads its numbers on the host (each
child's r(x) and q(x), each residual mass, the drawn token): on a GPU every read is a sync, several per node.
Here every sampled tree row of a step is walked together in tensor code, level by level and sibling slot by
sibling slot (a fixed loop over the widest tree's depth and fan-out, no host reads), and the step reads back one
small tensor: each row's accepted path, its count and the next token.

The rule is the reference's, node for node (``verify.py`` stays the reference this is tested against): each row
consumes its generator as the reference does (one float32 uniform per node, then one float64 uniform for the
draw), tries a node's children in order with the same comparisons in the same dtypes (float64 products of the
float32 values, the residual mass a float32 sum), and draws by the same inverse CDF (``verify_batch._draw``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from .verify import _RESIDUAL_EPS, VerifyResult, tree_levels
from .verify_batch import _draw, _rows, check_valid


@dataclass(frozen=True)
class TreeRow:
    """One sampled tree row: the target's filtered law after the pending token and after each node along its path
    ([≥ n + 1, V] float32), the n nodes' tokens and parents (parents before children, -1 a root child), the law
    each node was drawn from ([n, V]; None: deterministic candidates) and the row's generator."""

    probs: torch.Tensor
    tokens: Sequence[int]
    parents: Sequence[int]
    draft_probs: Optional[torch.Tensor]
    generator: Optional[torch.Generator]


def tree_outcomes(rows: Sequence[TreeRow]) -> torch.Tensor:
    """[4 + depth, B] on the device, unread: accepted count, next token, weights valid, whether a leaf was reached
    (all of its path accepted), then the accepted nodes level by level (-1 past the count)."""
    dev = rows[0].probs.device
    b = len(rows)
    sizes = [len(r.tokens) for r in rows]
    n_max = max(max(sizes), 1)
    kids_of: list[dict[int, list[int]]] = []
    for row in rows:
        kids: dict[int, list[int]] = {}
        for k, par in enumerate(row.parents):
            kids.setdefault(int(par), []).append(k)
        kids_of.append(kids)
    fan = max([len(c) for k in kids_of for c in k.values()], default=0)
    depth = max((tree_levels(r.parents) for r in rows), default=0)
    table = torch.full((b, n_max + 1, max(fan, 1)), -1, dtype=torch.long)  # table[i, node + 1]: node's children
    for i, kids in enumerate(kids_of):
        for par, cs in kids.items():
            table[i, par + 1, : len(cs)] = torch.tensor(cs)
    table = table.to(dev)
    tokens = torch.tensor([list(r.tokens) + [0] * (n_max - len(r.tokens)) for r in rows], dtype=torch.long,
                          device=dev).view(b, n_max)
    p = torch.stack([_rows(r.probs.float(), n_max + 1) for r in rows])  # [B, N + 1, V]
    v = p.shape[-1]
    kinds = [r.draft_probs is None for r in rows]
    any_det, any_dense = any(kinds), not all(kinds)
    det = torch.tensor(kinds, device=dev)
    q = torch.stack([p.new_zeros(n_max, v) if r.draft_probs is None else _rows(r.draft_probs.float(), n_max)
                     for r in rows]) if any_dense else None  # [B, N, V]
    u = torch.ones(b, n_max, dtype=torch.float32, device=dev)  # each row's uniforms, drawn as the reference draws
    for i, row in enumerate(rows):
        if sizes[i]:
            u[i, : sizes[i]] = torch.rand(sizes[i], generator=row.generator, device=dev)
    ar = torch.arange(b, device=dev)
    node = torch.full((b,), -1, dtype=torch.long, device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    leaf_reached = torch.zeros(b, dtype=torch.bool, device=dev)
    count = torch.zeros(b, dtype=torch.long, device=dev)
    path = torch.full((b, max(depth, 1)), -1, dtype=torch.long, device=dev)
    final = p[:, 0].clone()  # each row's law of the next token, set where it stops
    for level in range(depth + 1):
        law = p[ar, node + 1]  # [B, V]
        children = table[ar, node + 1]  # [B, fan]
        leaf = children[:, 0] < 0
        r, mass = law, torch.ones(b, dtype=torch.float64, device=dev)
        accepted = torch.full((b,), -1, dtype=torch.long, device=dev)
        for s in range(children.shape[1]):
            c = children[:, s]
            active = ~done & (c >= 0) & (accepted < 0)
            cc = c.clamp_min(0)
            x = tokens[ar, cc].unsqueeze(1)
            r_x = r.gather(1, x).squeeze(1).double()
            q_c = q[ar, cc] if q is not None else None
            q_x = torch.where(det, 1.0, q_c.gather(1, x).squeeze(1).double()) if q_c is not None else 1.0
            take = active & (u[ar, cc].double() * q_x * mass < r_x)
            accepted = torch.where(take, c, accepted)
            rejected = active & ~take
            # deterministic rows: r(x) = 0 and its float32 sum; sampled rows: norm(max(0, r - q)) where it has mass
            # (each only where the batch holds such rows: the kinds are known on the host)
            if any_det:
                zeroed = r.scatter(1, x, 0.0)
                upd_det = rejected & det & (r_x > 0)
                mass = torch.where(upd_det, zeroed.sum(dim=1).double(), mass)
                r = torch.where(upd_det.unsqueeze(1), zeroed, r)
            if q_c is not None:
                residual = (r / mass.float().unsqueeze(1) - q_c).clamp_min(0.0)
                r_mass = residual.sum(dim=1).double()
                upd_q = rejected & ~det & (r_mass > _RESIDUAL_EPS)
                mass = torch.where(upd_q, r_mass, mass)
                r = torch.where(upd_q.unsqueeze(1), residual, r)
        stop = ~done & (leaf | (accepted < 0))
        law_next = torch.where((leaf | (mass <= _RESIDUAL_EPS)).unsqueeze(1), law, r)
        final = torch.where(stop.unsqueeze(1), law_next, final)
        leaf_reached = leaf_reached | (stop & leaf & (node >= 0))
        move = ~done & ~stop
        if level < path.shape[1]:
            path[:, level] = torch.where(move, accepted, path[:, level])
        count = count + move.long()
        node = torch.where(move, accepted, node)
        done = done | stop
    nxt, ok = _draw(final, [r.generator for r in rows])
    return torch.cat([torch.stack([count, nxt, ok.long(), leaf_reached.long()]), path.t()])


def read_trees(out: Sequence[Sequence[int]]) -> list[VerifyResult]:
    """``tree_outcomes``' columns, read on the host, as ``VerifyResult``s (``out``: its rows as lists)."""
    res = []
    for j in range(len(out[0])):
        n = int(out[0][j])
        res.append(VerifyResult(n, int(out[1][j]), bool(out[3][j]), tuple(int(out[4 + k][j]) for k in range(n))))
    return res


def verify_trees(rows: Sequence[TreeRow]) -> list[VerifyResult]:
    """Every row's ``VerifyResult`` (its accepted path included), with one host read for the whole batch."""
    if not rows:
        return []
    out = tree_outcomes(rows).tolist()
    check_valid(out[2])
    return read_trees(out)

