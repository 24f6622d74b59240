"""The decode core's sampled rows of one step judged on the logits' device, with one host read for all of them.

Why: on a GPU every host read is a sync. ``verify_batch`` judges chain rows and ``verify_tree_batch`` tree rows in
tensor code; here both kinds of one step are built, their outcomes joined into one tensor and read once. Greedy
rows (the step reads one argmax list already), coupled trees, trees on the CPU (``judge_step`` says why) and rows
whose grammar failed stay with ``verify.verify_draft``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import torch

from .sampling import probs_from_logits
from .verify import VerifyResult
from .verify_batch import ChainRow, chain_outcomes, check_valid, read_chains
from .verify_tree_batch import TreeRow, read_trees, tree_outcomes

if TYPE_CHECKING:
    from .draft import Draft
    from .rows import Row


def judge_step(logits: torch.Tensor, rows: Sequence["Row"], drafts: Sequence["Draft"],
               batch_trees: Optional[bool] = None) -> dict[int, VerifyResult]:
    """The step's sampled chain rows and (``batch_trees``; default: off the CPU) sampled uncoupled tree rows, by
    row index; ``logits``: the pass's [B, width, V], under the rows' grammars. On the CPU a host read costs
    nothing and the per-row tree walk is cheaper: 0.17-0.29 ms a 8-9 node tree at SmolLM2's vocabulary against
    1.3-2.3 ms batched (full-vocabulary passes per sibling slot), so trees are batched where a read is a sync."""
    if batch_trees is None:
        batch_trees = logits.device.type != "cpu"
    chains: list[tuple[int, ChainRow]] = []
    trees: list[tuple[int, TreeRow]] = []
    for i, (r, d) in enumerate(zip(rows, drafts)):
        if r.sampling.greedy or (r.constraint is not None and r.constraint.error is not None):
            continue
        if d.parents is not None and (not batch_trees or r.noise is not None):
            continue  # per row (coupled trees: their draws follow the walk)
        g = len(d.tokens)
        probs = probs_from_logits(logits[i, : g + 1], r.sampling)
        if d.parents is not None:
            trees.append((i, TreeRow(probs, d.tokens, d.parents, d.probs, r.gen)))
        elif r.noise is not None:  # the coupled rule: the row's noise from its next position on
            chains.append((i, ChainRow(probs, d.tokens, None, "coupled", None, r.noise.window(len(r.tokens), g + 1))))
        else:
            chains.append((i, ChainRow(probs, d.tokens, d.probs, r.request.verify.chain_rule, r.gen)))
    parts = []  # (row indices, outcomes [k, n] unread, how to read their columns)
    if chains:
        rows_c = [c for _, c in chains]
        parts.append(([i for i, _ in chains], chain_outcomes(rows_c),
                      lambda cols: read_chains(cols, rows_c)))
    if trees:
        parts.append(([i for i, _ in trees], tree_outcomes([t for _, t in trees]), read_trees))
    if not parts:
        return {}
    flat = torch.cat([x.reshape(-1) for _, x, _ in parts]).tolist()  # the one host read
    out: dict[int, VerifyResult] = {}
    start = 0
    for index, x, read in parts:
        k, n = x.shape
        cols = [flat[start + j * n: start + (j + 1) * n] for j in range(k)]
        start += k * n
        check_valid(cols[2])
        out.update(zip(index, read(cols)))
    return out
