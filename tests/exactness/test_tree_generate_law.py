"""End to end: sampled tree drafts through ``generate`` (one tree-masked target pass, the accepted path
kept with ``cache.keep``) give the target's exact law of the first 3 tokens; greedy trees stay plain
greedy decoding."""

from __future__ import annotations

import pytest
import torch

import specdecode as sd
from specdecode.config import SamplingConfig
from specdecode.draft import Draft, DraftContext
from specdecode.sampling import draw, probs_from_logits

from .chi2 import gof_pvalue
from .test_generate_law import N, PROMPT, exact_law, models  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow  # full tier: make test-full

WIDTHS = (2, 2)  # 2 children of the pending token, 2 children each: 6 nodes


class TreeDrafter:
    """Trees from a small draft model, breadth first: each node gets ``widths[depth]`` children, drawn
    i.i.d. from the draft's filtered law at the node (``sampled``: with that law as the node's row of
    ``probs``) or its top-k tokens (deterministic candidates, as Medusa heads give; ``probs`` None)."""

    def __init__(self, draft: sd.Model, sampled: bool, widths: tuple[int, ...] = WIDTHS) -> None:
        self.draft, self.sampled, self.widths = draft, sampled, widths
        self.gamma = sum(a * b for a, b in zip(widths, [1, *widths]))  # nodes in the full tree
        self.nodes_proposed = 0

    def prepare(self, target: sd.Model) -> None: ...

    def reset(self) -> None: ...

    def on_verified(self, n_accepted: int) -> None: ...

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> Draft:
        tokens: list[int] = []
        parents: list[int] = []
        rows: list[torch.Tensor] = []
        frontier: list[tuple[int, list[int]]] = [(-1, [])]
        for width in self.widths:
            ids = torch.tensor([ctx.tokens + path for _, path in frontier])
            laws = probs_from_logits(self.draft.module(ids)[:, -1].float(), ctx.sampling)
            nxt = []
            for (parent, path), law in zip(frontier, laws):
                if self.sampled:
                    kids = draw(law.unsqueeze(0).expand(width, -1).contiguous(), ctx.generator).tolist()
                else:
                    kids = torch.topk(law, width).indices.tolist()
                for t in kids:
                    tokens.append(t)
                    parents.append(parent)
                    rows.append(law)
                    nxt.append((len(tokens) - 1, path + [t]))
            frontier = nxt
        n = ctx.max_tokens  # parents come first, so a prefix of the nodes is a tree
        self.nodes_proposed += min(n, len(tokens))
        return Draft(tokens[:n], torch.stack(rows[:n]) if self.sampled else None, parents[:n])


CFGS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)]


@pytest.mark.parametrize("cfg", CFGS, ids=["T1", "T0.8-k5-p0.9"])
@pytest.mark.parametrize("sampled", [True, False], ids=["sampled-children", "topk-candidates"])
def test_tree_generate_law_matches_target(models: tuple[sd.Model, sd.Model], cfg: SamplingConfig,  # noqa: F811
                                          sampled: bool) -> None:
    target, draft = models
    drafter = TreeDrafter(draft, sampled)
    samples = []
    accepted = 0
    for seed in range(N):
        # 7 new tokens so the first pass verifies the whole 6-node tree; the law is of the first 3
        r = sd.generate(target, PROMPT, drafter=drafter, max_new_tokens=7, temperature=cfg.temperature,
                        top_k=cfg.top_k, top_p=cfg.top_p, seed=seed, ignore_eos=True, accept_rule="rejection")
        samples.append(tuple(r.token_ids[:3]))
        accepted += sum(r.from_draft)
    assert drafter.nodes_proposed > 0 and accepted > 0  # trees were drafted and paths through them kept
    law = exact_law(target, cfg)
    assert gof_pvalue(samples, law) > 1e-3
    assert gof_pvalue(samples, exact_law(draft, cfg)) < 1e-6  # power: not the draft's law
    first: dict[int, float] = {}  # the first token's marginal: 8 cells, more power against a slightly wrong rule
    for seq, pr in law.items():
        first[seq[0]] = first.get(seq[0], 0.0) + pr
    assert gof_pvalue([s[0] for s in samples], first) > 1e-3


@pytest.mark.parametrize("sampled", [True, False])
def test_greedy_tree_drafts_are_plain_greedy_decoding(models: tuple[sd.Model, sd.Model],  # noqa: F811
                                                      sampled: bool) -> None:
    target, draft = models
    prompts = [PROMPT, [3, 1, 4, 1, 5], [7]]
    for prompt in prompts:
        plain = sd.generate(target, prompt, max_new_tokens=12, ignore_eos=True)
        tree = sd.generate(target, prompt, drafter=TreeDrafter(draft, sampled), max_new_tokens=12, ignore_eos=True)
        assert tree.token_ids == plain.token_ids
