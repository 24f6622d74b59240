"""The one decode core: batched rows, tree drafts, hidden states for heads, and the drafter registry."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Optional

import pytest
import torch

import specdecode as sd
from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.core import DecodeCore
from specdecode.rows import FinishEvent, Request
from specdecode.draft import Draft, DraftContext
from specdecode.drafters import DrafterOptions, build_drafter, drafter_names
from specdecode.verify import greedy_verify_tree

PROMPTS = ["def fib(n):", "class Point:\n    def __init__(self, x, y):\n", "x = 1\ny = 2\n" * 3]


def run_core(core: DecodeCore, requests: list[Request], join_at: int = 2) -> list[list[int]]:
    """Run requests through one core; the last one joins after ``join_at`` steps (a batch that is running)."""
    rows = [core.add(r) for r in requests[:-1]]
    out: dict[int, list[int]] = {}
    steps = 0
    while core.rows or len(rows) < len(requests):
        if steps == join_at:
            rows.append(core.add(requests[-1]))
        for row, ev in core.step():
            if isinstance(ev, FinishEvent):
                out[id(row)] = ev.token_ids
        steps += 1
    return [out[id(r)] for r in rows]


def test_greedy_rows_give_the_same_tokens_alone_or_batched(tiny_dirs: dict[str, Path]) -> None:
    target, draft = sd.load_model(tiny_dirs["llama"]), sd.load_model(tiny_dirs["draft"])
    gen = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    requests = [Request(target.encode(PROMPTS[0]), SamplingConfig(), gen, "model", 3),
                Request(target.encode(PROMPTS[1]), SamplingConfig(), gen, "ngram", 4),
                Request(target.encode(PROMPTS[2]), SamplingConfig(), gen, None),
                Request(target.encode(PROMPTS[2]), SamplingConfig(), gen, "model", 1)]
    drafters = {"model": sd.DraftModelDrafter(draft, gamma=3),
                "ngram": build_drafter("ngram", DrafterOptions(gamma=4))}
    batched = run_core(DecodeCore(target, drafters, max_rows=4, context_len=128), requests)
    for req, got in zip(requests, batched):
        assert got == sd.generate(target, req.prompt_ids, max_new_tokens=20, ignore_eos=True).token_ids


class OracleTree:
    """Greedy tree drafts around a known greedy continuation: at each depth the right token and a
    wrong sibling (which has a wrong child of its own), in shuffled order, parents before children."""

    def __init__(self, prompt_len: int, reference: list[int], vocab: int, depth: int = 3, seed: int = 0) -> None:
        self.prompt_len, self.reference, self.vocab, self.depth = prompt_len, reference, vocab, depth
        self.rng = random.Random(seed)
        self.proposed = 0

    def prepare(self, target: sd.Model) -> None: ...

    def reset(self) -> None: ...

    def on_verified(self, n_accepted: int) -> None: ...

    def propose(self, ctx: DraftContext) -> Draft:
        done = len(ctx.tokens) - self.prompt_len
        want = self.reference[done : done + self.depth]
        tokens: list[int] = []
        parents: list[int] = []
        right = -1
        for t in want:
            if len(tokens) + 3 > ctx.max_tokens:
                break
            nodes = [(t, right, True), ((t + 1) % self.vocab, right, False)]
            self.rng.shuffle(nodes)
            for tok, par, good in nodes:
                tokens.append(tok)
                parents.append(par)
                if good:
                    right = len(tokens) - 1
                else:  # a wrong branch that continues: verification must not follow it
                    tokens.append((tok + 2) % self.vocab)
                    parents.append(len(tokens) - 2)
        self.proposed += len(tokens)
        return Draft(tokens, None, parents)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tree_drafts_verified_in_one_pass_give_plain_greedy_output(tiny_dirs: dict[str, Path], arch: str) -> None:
    target = sd.load_model(tiny_dirs[arch])
    prompt = target.encode(PROMPTS[1])
    ref = sd.generate(target, prompt, max_new_tokens=24, ignore_eos=True).token_ids
    drafter = OracleTree(len(prompt), ref, target.vocab_size)
    r = sd.generate(target, prompt, drafter=drafter, max_new_tokens=24, ignore_eos=True)
    assert r.token_ids == ref
    assert drafter.proposed > 0 and r.stats.tau > 2.0  # the right branches were accepted, the wrong ones not


def test_tree_drafts_in_a_batch_beside_chain_rows(tiny_dirs: dict[str, Path]) -> None:
    target, draft = sd.load_model(tiny_dirs["llama"]), sd.load_model(tiny_dirs["draft"])
    gen = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    prompt = target.encode(PROMPTS[0])
    ref = sd.generate(target, prompt, max_new_tokens=16, ignore_eos=True).token_ids
    oracle = OracleTree(len(prompt), ref, target.vocab_size)
    drafters = {"tree": sd.drafters.PerRowDrafters(lambda: oracle, 8),
                "model": sd.DraftModelDrafter(draft, gamma=4)}
    requests = [Request(prompt, SamplingConfig(), gen, "tree", 8),
                Request(target.encode(PROMPTS[1]), SamplingConfig(), gen, "model")]
    got = run_core(DecodeCore(target, drafters, max_rows=2, context_len=128), requests, join_at=1)
    assert got[0] == ref
    assert got[1] == sd.generate(target, PROMPTS[1], max_new_tokens=16, ignore_eos=True).token_ids


@pytest.mark.parametrize("argmax,expect_path,expect_next", [
    ([5, 7, 9, 9, 9, 9], (0, 2), 9),  # root -> node 0 (5) -> node 2 (7), then the target's 9
    ([6, 1, 1, 1, 1, 1], (1,), 1),  # root -> node 1 (6): a leaf, then its argmax
    ([4, 0, 0, 0, 0, 0], (), 4),  # nothing matches at the root
])
def test_greedy_tree_rule(argmax: list[int], expect_path: tuple[int, ...], expect_next: int) -> None:
    # tree: root children 5 (node 0), 6 (node 1); node 0 children 7 (node 2), 8 (node 3); node 2 child 3 (node 4)
    res = greedy_verify_tree(argmax, [5, 6, 7, 8, 3], [-1, -1, 0, 0, 2])
    assert res.path == expect_path and res.n_accepted == len(expect_path) and res.next_token == expect_next


class HiddenProbe(sd.BatchDrafterBase):
    """Proposes nothing; records what the core hands a head-style drafter."""

    wants_hidden = True
    gamma = 2

    def __init__(self) -> None:
        self.acceptance = sd.drafters.Acceptance()
        self.seen: list[tuple[list[int], Optional[torch.Tensor]]] = []

    def prepare_rows(self, target: sd.Model, rows: int, max_len: int) -> None: ...

    def costs_for(self, target: sd.Model) -> None:
        return None

    def propose_rows(self, contexts: dict[int, DraftContext]) -> dict[int, Draft]:
        for ctx in contexts.values():
            self.seen.append((list(ctx.tokens), ctx.hidden))
        return {r: Draft() for r in contexts}

    def on_verified_row(self, row: int, n_accepted: int) -> None: ...

    def reset_row(self, row: int) -> None: ...

    def move_row(self, src: int, dst: int) -> None: ...


def test_a_drafter_that_asks_gets_the_targets_hidden_states(tiny_dirs: dict[str, Path]) -> None:
    """ctx.hidden's last row is the final normed state whose logits gave the newest token."""
    target = sd.load_model(tiny_dirs["llama"], fast=False)  # fp32 products: the head below is exact
    probe = HiddenProbe()
    r = sd.generate(target, PROMPTS[0], drafter=probe, max_new_tokens=6, ignore_eos=True)
    assert len(r.token_ids) == 6 and probe.seen[0][1] is None  # nothing verified before the first pass
    head = target.output_matrix().float()
    for tokens, hidden in probe.seen[1:]:
        assert hidden is not None and hidden.shape == (1, target.config.dim)
        assert int((hidden[-1] @ head.T).argmax()) == tokens[-1]


def test_generate_serve_and_bench_list_the_same_registered_drafters() -> None:
    from specdecode.bench import runners
    from specdecode.cli import build_parser

    names = drafter_names()
    assert {"model", "ngram", "none"} <= set(names)
    gen = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for cmd in ("generate", "serve"):
        drafter_flag = next(a for a in gen[cmd]._actions if "--drafter" in a.option_strings)
        assert tuple(drafter_flag.choices) == names
    assert set(runners.method_table()) >= {v.family for s in sd.drafters.registry.REGISTRY.values() for v in s.bench}
    with pytest.raises(sd.ConfigError, match="needs a draft model"):
        build_drafter("model", DrafterOptions())
    with pytest.raises(sd.ConfigError, match="unknown drafter 'nope'"):
        build_drafter("nope", DrafterOptions())
