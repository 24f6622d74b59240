"""The runner's pieces: traces agree with the engine's own stats; prompts are fitted to the context window."""

from __future__ import annotations

from pathlib import Path

import specdecode
from specdecode.bench.runners import OursMethod, prepare_prompts
from specdecode.bench.stats import counts_from_steps
from specdecode.bench.workloads import Workload


def test_trace_matches_engine_stats(tiny_dirs: dict[str, Path]) -> None:
    target = specdecode.load_model(tiny_dirs["llama"])
    draft = specdecode.load_model(tiny_dirs["draft"])
    prompt = target.encode("def fib(n):\n    if n < 2:\n        return n\n")
    for drafter in (specdecode.DraftModelDrafter(draft, gamma=3),
                    specdecode.PromptLookupDrafter(max_ngram=2, num_draft_tokens=4)):
        out = OursMethod("m", "m", 3, target, drafter, ignore_eos=True).run(prompt, 40)
        stats = specdecode.generate(target, prompt, drafter, max_new_tokens=40, ignore_eos=True).stats
        c = counts_from_steps(out.steps or [], len(out.token_ids))
        assert (c.passes, c.drafted, c.accepted, c.generated) == (
            stats.target_passes, stats.drafted, stats.accepted, stats.generated_tokens)
        assert c.drafted_by_position == stats.drafted_by_position
        assert c.accepted_by_position == stats.accepted_by_position
        assert c.tau == stats.tau and c.alpha_hat == stats.alpha


def test_prompts_fit_the_context_window(tiny_dirs: dict[str, Path]) -> None:
    target = specdecode.load_model(tiny_dirs["llama"])  # 256-token window
    long_text = "def f(x):\n    return x\n" * 200
    ws = [Workload("short", "completion", "def add(a, b):\n", 16),
          Workload("long-prompt", "completion", long_text, 64),
          Workload("huge-budget", "long", "class A:\n", 512)]
    short, cut, budget = prepare_prompts(ws, target, None)
    assert short.truncated == 0 and short.max_new_tokens == 16 and short.ids == target.encode("def add(a, b):\n")
    assert len(cut.ids) + cut.max_new_tokens <= 256 and cut.max_new_tokens == 64 and cut.truncated > 0
    assert cut.ids[-5:] == target.encode(long_text)[-5:]  # cut from the left: the end of the prompt stays
    assert budget.truncated == 0 and budget.max_new_tokens == 256 - len(budget.ids)
    assert budget.requested_new_tokens == 512


def test_eager_baseline_runs_beside_the_fast_models(tiny_dirs: dict[str, Path]) -> None:
    """The eager methods load their own models with fast=False; the shared target keeps its kernels."""
    from specdecode.bench.runners import BenchContext, build_methods
    from specdecode.kernels import EAGER

    target = specdecode.load_model(tiny_dirs["llama"])
    draft = specdecode.load_model(tiny_dirs["draft"])
    ctx = BenchContext(target, draft, str(target.path), str(draft.path))
    methods, skipped = build_methods(ctx, ["plain", "eager-plain", "eager-draft"], {"peer_gammas": [2]})
    assert not skipped and [m.name for m in methods] == ["plain", "eager-plain", "eager-draft/g2"]
    by_name = {m.name: m for m in methods}
    assert by_name["eager-plain"].target.kernels is EAGER and by_name["eager-plain"].target is not target
    assert by_name["plain"].target is target and target.kernels.fast == target.fast
    prompt = target.encode("def add(a, b):\n")
    outs = [m.run(prompt, 8).token_ids for m in methods]  # interleaved in one process
    assert all(len(o) == 8 for o in outs)
    assert target.kernels.fast == specdecode.load_model(tiny_dirs["llama"]).fast  # untouched by the eager runs


def test_sampled_bench_runs_token_by_token_beside_block_verification(tiny_dirs: dict[str, Path]) -> None:
    """Under sampling 'draft' verifies chains with block verification (the default rule) and 'draft-token'
    token by token, with the same seeded sampling; greedy has one rule, so 'draft-token' is skipped."""
    from specdecode.bench.runners import BenchContext, build_methods
    from specdecode.config import SamplingConfig

    target = specdecode.load_model(tiny_dirs["llama"])
    draft = specdecode.load_model(tiny_dirs["llama"])  # self-speculation: every draft token is accepted
    sampling = SamplingConfig(temperature=1.0, seed=3)
    ctx = BenchContext(target, draft, str(target.path), str(draft.path), sampling=sampling)
    methods, skipped = build_methods(ctx, ["plain", "draft", "draft-token"], {"gammas": [3]})
    assert not skipped and [m.name for m in methods] == ["plain", "draft/g3", "draft-token/g3"]
    by_name = {m.name: m for m in methods}
    assert by_name["draft/g3"].verify.chain_rule == "block" and by_name["draft-token/g3"].verify.chain_rule == "token"
    prompt = target.encode("def add(a, b):\n")
    outs = {m.name: m.run(prompt, 12) for m in methods}
    ref = specdecode.generate(target, prompt, specdecode.DraftModelDrafter(draft, 3), max_new_tokens=12,
                              temperature=1.0, seed=3, ignore_eos=True, chain_rule="token", accept_rule="rejection")
    assert outs["draft-token/g3"].token_ids == ref.token_ids  # the run's sampling and rule reach generate
    assert all(a == d for d, a in outs["draft/g3"].steps or [])  # draft = target: block keeps every token
    greedy = BenchContext(target, draft, str(target.path), str(draft.path))
    _, skipped = build_methods(greedy, ["draft-token"], {"gammas": [3]})
    assert [s.name for s in skipped] == ["draft-token/3"] and "--temperature" in skipped[0].reason


def test_sampled_bench_runs_the_coupled_rule_beside_rejection(tiny_dirs: dict[str, Path]) -> None:
    """'draft-coupled' verifies by the Gumbel-max coupling (seeded: plain decoding's tokens), 'draft' and
    'draft-token' by rejection sampling even when the run has a seed; greedy skips 'draft-coupled'."""
    from specdecode.bench.runners import BenchContext, build_methods
    from specdecode.config import SamplingConfig

    target, draft = specdecode.load_model(tiny_dirs["llama"]), specdecode.load_model(tiny_dirs["draft"])
    sampling = SamplingConfig(temperature=0.8, seed=5)
    ctx = BenchContext(target, draft, str(target.path), str(draft.path), sampling=sampling)
    methods, skipped = build_methods(ctx, ["draft", "draft-token", "draft-coupled"], {"gammas": [3]})
    by_name = {m.name: m for m in methods}
    assert not skipped and by_name["draft-coupled/g3"].verify.accept_rule == "coupled"
    assert by_name["draft/g3"].verify.accept_rule == by_name["draft-token/g3"].verify.accept_rule == "rejection"
    prompt = target.encode("def add(a, b):\n")
    plain = specdecode.generate(target, prompt, max_new_tokens=12, temperature=0.8, seed=5, ignore_eos=True)
    out = by_name["draft-coupled/g3"].run(prompt, 12)
    assert out.token_ids == plain.token_ids and sum(d for d, _ in out.steps or []) > 0
    greedy = BenchContext(target, draft, str(target.path), str(draft.path))
    _, skipped = build_methods(greedy, ["draft-coupled"], {"gammas": [3]})
    assert [s.name for s in skipped] == ["draft-coupled/3"] and "--temperature" in skipped[0].reason
