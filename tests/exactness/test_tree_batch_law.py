"""The batched sampled-tree verifier (``verify_tree_batch.verify_trees``) against the per-row reference and the laws.

Two kinds of evidence: row for row it returns what ``verify.rejection_sample_tree`` returns for the same
generator state (random trees, laws and drafters, mixed batches), accepted path included; and one step's law of
(accepted path, next token) is the enumerated rule's for deterministic candidates and for sampled children, with
the plausible bugs' laws rejected by the same chi-square tests."""

from __future__ import annotations

from typing import Optional

import torch

from specdecode.verify import VerifyResult, rejection_sample_tree
from specdecode.verify_tree_batch import TreeRow, verify_trees

from .chi2 import gof_pvalue
from .test_batch_verify_law import random_law
from .test_rejection_law import SETTINGS
from .test_tree_law import N, V, candidates_step_law, pair, sampled_step_law, tree_step


def batched(probs: torch.Tensor, tokens: list[int], parents: list[int], draft_probs: Optional[torch.Tensor],
            generator: Optional[torch.Generator] = None) -> VerifyResult:
    """``verify_trees`` on one row, with the reference's call shape (for the law harness)."""
    return verify_trees([TreeRow(probs, tokens, parents, draft_probs, generator)])[0]


def random_tree(n: int, g: torch.Generator) -> list[int]:
    """Parents of n nodes, parents before children (-1: a root child)."""
    return [int(torch.randint(-1, k, (1,), generator=g)) for k in range(n)]


def test_each_row_equals_the_reference_rule() -> None:
    """Mixed batches (deterministic and sampled drafters, 0 to 9 nodes in random shapes, drafts likely or not):
    each row's count, next token, leaf flag and accepted path are the reference's for a clone of its generator."""
    g = torch.Generator().manual_seed(3)
    mismatches, rows_seen, kept = 0, 0, 0
    for trial in range(240):
        v = 6 if trial % 2 else 300
        rows, refs = [], []
        for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
            n = int(torch.randint(0, 10, (1,), generator=g))
            parents = random_tree(n, g)
            p = random_law(n + 1, v, g, sparse=trial % 3 == 0)
            q = random_law(n, v, g, sparse=trial % 4 == 0) if bool(torch.rand(1, generator=g) < 0.6) else None
            if q is not None and n:
                for k, par in enumerate(parents):  # the target after a node's parent resembles the node's law
                    if trial % 5 != 4:
                        p[par + 1] = 0.8 * q[k] + 0.2 * p[par + 1]
                tokens = torch.multinomial(q, 1, generator=g).view(-1).tolist()
            else:
                tokens = [int(t) for t in torch.topk(p[0], min(n, v)).indices.tolist()] + [0] * max(0, n - v)
                tokens = [tokens[k] if parents[k] < 0 else int(torch.argmax(p[parents[k] + 1])) for k in range(n)]
            seed = int(torch.randint(0, 2**31, (1,), generator=g))
            rows.append(TreeRow(p, tokens, parents, q, torch.Generator().manual_seed(seed)))
            refs.append(rejection_sample_tree(p, tokens, parents, q, torch.Generator().manual_seed(seed)))
        for got, want in zip(verify_trees(rows), refs):
            rows_seen += 1
            kept += got.n_accepted
            mismatches += (got.n_accepted, got.next_token, got.bonus, got.path) != \
                (want.n_accepted, want.next_token, want.bonus, want.path)
    assert mismatches == 0, f"{mismatches} of {rows_seen} rows differ from the reference"
    assert kept > rows_seen // 2  # acceptances, deep ones among them, were compared


def test_candidates_step_law() -> None:
    """Deterministic candidates, one step: (accepted path, next token) follows the enumerated rule, and not the same
    rule without renormalisation."""
    p, q = pair(SETTINGS[0], 40)
    g = torch.Generator().manual_seed(8)
    samples = [tree_step(p, q, (), "topk", g, batched) for _ in range(N // 2)]
    assert gof_pvalue([s[0] for s in samples], {t: float(p(())[t]) for t in range(V)}) > 1e-3
    assert gof_pvalue(samples, candidates_step_law(p, q)) > 1e-3
    assert gof_pvalue(samples, candidates_step_law(p, q, renormalise=False)) < 1e-6


def test_sampled_children_step_law() -> None:
    """I.i.d. sampled children, one step: the multi-draft rule's law, not the law without the residual update."""
    p, q = pair(SETTINGS[0], 60)
    g = torch.Generator().manual_seed(9)
    samples = [tree_step(p, q, (), "iid", g, batched) for _ in range(N // 2)]
    assert gof_pvalue([s[0] for s in samples], {t: float(p(())[t]) for t in range(V)}) > 1e-3
    assert gof_pvalue(samples, sampled_step_law(p, q)) > 1e-3
    assert gof_pvalue(samples, sampled_step_law(p, q, update=False)) < 1e-6


def test_one_step_judges_chains_and_trees_in_one_read() -> None:
    """``verify_step.judge_step`` on a step mixing sampled chain rows, sampled tree rows and a greedy row: each
    judged row's result is the batched verifier's for its kind (greedy rows are left to the per-row dispatch)."""
    from types import SimpleNamespace

    from specdecode.config import SamplingConfig, VerifyConfig
    from specdecode.draft import Draft
    from specdecode.sampling import probs_from_logits
    from specdecode.verify_batch import ChainRow, verify_chains
    from specdecode.verify_step import judge_step

    g = torch.Generator().manual_seed(21)
    v, width = 50, 7
    sampled, greedy = SamplingConfig(temperature=1.0), SamplingConfig()
    logits = torch.randn(5, width, v, generator=g) * 3
    drafts = [Draft(tokens=[3, 9, 1]), Draft(tokens=[4, 4, 8, 2], parents=[-1, -1, 0, 2]), Draft(tokens=[7]),
              Draft(tokens=[1, 5, 6, 0, 2, 3], parents=[-1, 0, 0, -1, 3, 1]), Draft(tokens=[2, 2])]
    kinds = [sampled, sampled, greedy, sampled, sampled]

    def rows() -> list[SimpleNamespace]:  # fresh generators for each judgement
        return [SimpleNamespace(sampling=s, constraint=None, noise=None, gen=torch.Generator().manual_seed(100 + i),
                                request=SimpleNamespace(verify=VerifyConfig()), tokens=[0])
                for i, s in enumerate(kinds)]

    assert sorted(judge_step(logits, rows(), drafts)) == [0, 4]  # type: ignore[arg-type]  # trees: per row on the CPU
    judged = judge_step(logits, rows(), drafts, batch_trees=True)  # type: ignore[arg-type]
    assert sorted(judged) == [0, 1, 3, 4]
    for i in (0, 4):
        want = verify_chains([ChainRow(probs_from_logits(logits[i, : len(drafts[i].tokens) + 1], sampled),
                                       drafts[i].tokens, None, "block", torch.Generator().manual_seed(100 + i))])[0]
        assert judged[i] == want
    for i in (1, 3):
        d = drafts[i]
        want = verify_trees([TreeRow(probs_from_logits(logits[i, : len(d.tokens) + 1], sampled), d.tokens,
                                     d.parents, None, torch.Generator().manual_seed(100 + i))])[0]
        assert judged[i] == want
