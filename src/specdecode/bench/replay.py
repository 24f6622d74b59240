"""`specdecode bench replay`: drafters replayed on the target's recorded answers, without timing noise.

A timed run of 20 prompts moves by 3–4% from run to run on a shared machine, more than most drafter
changes are worth. Greedy decoding is deterministic, so each step's outcome can be computed without the
target: the target's answer to each prompt is recorded once (plain decoding, written to ``--record`` and
reused), then each drafter proposes exactly as in a run and its draft is verified against the recording
by the same greedy rule the decode core applies (``verify.greedy_verify`` / ``greedy_verify_tree``), and
the outcome goes back to the drafter (``on_verified_row``, its acceptance history), as the core does.
What a run would accept is therefore reproduced step for step (``tests/bench/test_replay.py`` checks it
against ``generate``), and only the price of each step is modelled: c (the drafter's own time for the
proposal, measured here, over a one-token target pass) plus v(nodes verified) from this target's cost
table on this machine (or ``--v-table``). The predicted speedup is tokens / Σ (c + v) over the decode
steps; prefill, the same for every method, is left out (the bench's own line gives its share).

Drafters that read the target's hidden states (EAGLE, Medusa) get them from one teacher-forced pass over
the prompt and the recorded answer: along the accepted path a run's states are the same numbers (the
kernels give a token's states bit for bit whatever else shares its pass), so what such a drafter is
handed after each step (the pending token's and the accepted tokens' states) is a slice of that pass.
The same pass fills a KV cache that stands in for the target's: drafters that draft on it (the int4
copy, layer skip) see the entries of every verified token, as in a run, and what they write past them
is put back after each proposal, as the next target pass would overwrite it.
Every drafter is replayable at a fixed ``--gamma``, and a self-sizing one (suffix, auto, the trees) at
γ 'auto'; a γ 'auto' drafter that the γ policy sizes is not (the policy weighs live pass timings). A
drafter that plans with its own measured drafting time (suffix's c, auto's per-member c) can choose
differently at the margin from one replay or run to the next; with fixed costs the replay is the run,
step for step.

Sampled answers replay as exactly (``--temperature`` > 0, with ``--seed``; 0 when none is given): a
seeded request samples by the Gumbel-max coupling (``sampling.CoupledNoise``), whose tokens are plain
decoding's whatever was drafted, and which keeps a draft token exactly when it equals the target's own
draw there. So the recording is every drafter's answer, and verifying against it by the greedy rule is
the coupled rule; a drafter that samples draws with the same noise as in a run.

    specdecode bench replay suffix auto --target smollm2-135m-instruct.gguf --workload real --per-category 4 \\
        --max-new-tokens 256 --stop-at-eos --record runs/replay-record.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import torch

from ..config import ConfigError, SamplingConfig, add_dataclass_args, from_args
from ..draft import DraftContext
from ..engine import generate
from ..kernels import kernel_isa
from ..kernels.quant import quant_isa
from ..sampling import CoupledNoise
from ..sizing.book import get_costs, target_spec
from ..sizing.costs import MAX_GAMMA, Costs
from ..sizing.gamma import resolve_gamma
from ..verify import greedy_verify, greedy_verify_tree
from .variants import PLAIN, add_variant_args, setup

if TYPE_CHECKING:
    import torch

    from ..cache import KVCache
    from ..config import SamplingConfig
    from ..sizing.costs import Costs
    from ..draft import Draft
    from ..drafters.base import BatchDrafter
    from ..models import Model


@dataclass
class Trace:
    """One prompt replayed by one drafter."""

    tokens: int = 0  # tokens the answer has (up to its end of turn with --stop-at-eos)
    steps: int = 0  # target passes a run would make
    nodes: list[int] = field(default_factory=list)  # draft nodes verified at each step
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted at each step
    draft_s: list[float] = field(default_factory=list)  # the drafter's seconds at each step (0: no call)
    sources: list[str] = field(default_factory=list)  # which member drafted (auto), "" for none or a lone drafter


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("replay", help="drafters replayed on the target's recorded answers (greedy, or sampled with "
                                      "a seed): exact τ and a predicted speedup from the cost table, without "
                                      "timing noise",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    add_dataclass_args(p, SamplingConfig)
    p.add_argument("--record", metavar="FILE",
                   help="the recorded answers: read when it holds this target's answers to these prompts, else "
                        "written (default: recorded afresh, not kept)")
    p.add_argument("--v-table", metavar="V1,V2,...",
                   help="v(1), v(2), ... (a pass over 2, 3, ... tokens over a one-token pass) to price the steps "
                        "with, e.g. another machine's from `bench costs` (default: this target's measured table)")
    p.add_argument("--json", metavar="FILE", help="also write the rows and each step's figures as JSON")
    p.set_defaults(func=cmd_replay)


def _identity(target: "Model") -> str:
    """What the recorded answers depend on: the model file, its weight format and the kernel paths."""
    return f"{target.path}|{target.weight_dtype}|{target.kv_dtype}|{quant_isa()}|{kernel_isa()}"


def _key(ids: Sequence[int], budget: int, sampling: "SamplingConfig") -> str:
    how: list[Any] = [list(ids), budget]
    if not sampling.greedy:  # greedy keys stay as they were, so older recordings are still read
        how.append([sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.seed])
    return hashlib.sha1(json.dumps(how).encode()).hexdigest()


def replay_sampling(args: argparse.Namespace) -> "SamplingConfig":
    """The command's sampling settings; a sampled replay needs a seed (the coupled rule), 0 by default."""
    sampling = from_args(SamplingConfig, args)
    if not sampling.greedy and sampling.seed is None:
        sampling = replace(sampling, seed=0)
    return sampling


def record(target: "Model", prompts: Sequence[Any], path: Optional[str],
           sampling: Optional["SamplingConfig"] = None) -> list[list[int]]:
    """Each prompt's answer over its whole budget (EOS ignored: a draft may run past the end of turn,
    and a run verifies it against what the target would write there), greedy or by ``sampling`` (seeded:
    the coupled rule's draws), from ``path`` when it has them for this target, else decoded now (and
    written to ``path``)."""
    sampling = sampling or SamplingConfig()
    if not sampling.greedy and sampling.seed is None:
        raise ValueError("a sampled recording needs a seed: only the coupled rule's answers are every drafter's")

    ident = _identity(target)
    stored: dict[str, list[int]] = {}
    if path and Path(path).exists():
        data = json.loads(Path(path).read_text())
        if data.get("target") == ident:
            stored = data["answers"]
    out, fresh = [], 0
    for p in prompts:
        key = _key(p.ids, p.max_new_tokens, sampling)
        if key not in stored:
            r = generate(target, p.ids, max_new_tokens=p.max_new_tokens, ignore_eos=True,
                         temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                         min_p=sampling.min_p, seed=sampling.seed)
            stored[key] = list(r.token_ids)
            fresh += 1
            print(f"recorded {p.workload.id}: {len(r.token_ids)} tokens", flush=True)
        out.append(stored[key])
    if path and fresh:
        Path(path).write_text(json.dumps({"target": ident, "answers": stored}) + "\n")
    return out


def answer_end(answer: Sequence[int], eos: set[int], stop_at_eos: bool) -> int:
    """Tokens a run writes: through the first end-of-turn token with ``stop_at_eos``, else all."""
    if stop_at_eos:
        for i, t in enumerate(answer):
            if t in eos:
                return i + 1
    return len(answer)


def target_choices(draft: "Draft", answer: Sequence[int], t: int) -> list[int]:
    """What the target's pass would pick after the pending token and after each draft node: the
    recorded next token where the node's path is the recording's, else -1 (nothing matches it)."""
    out = [answer[t]]
    depth: list[int] = []
    on: list[bool] = []
    for k, tok in enumerate(draft.tokens):
        parent = draft.parents[k] if draft.parents is not None else k - 1
        d = 1 if parent < 0 else depth[parent] + 1
        ok = (parent < 0 or on[parent]) and t + d - 1 < len(answer) and answer[t + d - 1] == tok
        depth.append(d)
        on.append(ok)
        out.append(answer[t + d] if ok and t + d < len(answer) else -1)
    return out


@dataclass
class States:
    """The target's states over prompt + answer (one pass, position by position): what a hidden-state
    drafter reads. ``hidden``: the final normed states [T, dim]; ``layers``: the residual after each
    captured layer."""

    hidden: "torch.Tensor"
    layers: dict[int, "torch.Tensor"]
    cache: Optional["KVCache"] = None  # the pass's K/V of every token, with room for a draft past the end

    def span(self, a: int, b: int) -> tuple["torch.Tensor", dict[int, "torch.Tensor"]]:
        return self.hidden[a:b], {k: v[a:b] for k, v in self.layers.items()}


def teacher_forced(target: "Model", prompt: Sequence[int], answer: Sequence[int], layers: Sequence[int],
                   room: int = 0) -> States:
    """One pass over prompt + answer (but its last token), keeping the states and the KV cache (``room``
    slots more, for drafts past the answer's end) instead of the logits."""
    ids = list(prompt) + list(answer)
    cache = target.new_cache(1, len(ids) + room)
    x = torch.tensor([ids[:-1]], dtype=torch.long, device=target.device)
    out = target.run(x, cache, rows=slice(0, 1), return_hidden=True, hidden_layers=tuple(layers),
                     head=target.stand_in_head())  # one output row stands in: no logits are wanted
    assert out.hidden is not None
    return States(out.hidden[0], {k: v[0] for k, v in out.layers.items()}, cache)


def _kv(cache: "KVCache") -> list["torch.Tensor"]:
    """Every layer's K and V tensors."""
    return [c for i in range(len(cache.k_layers())) for c in (cache.k_layer(i), cache.v_layer(i))]


def _drafting_on(cache: Optional["KVCache"], length: int, slots: int) -> Optional[list["torch.Tensor"]]:
    """Set the stand-in target cache to ``length`` verified tokens and save the ``slots`` entries after
    them, which a drafter on it may write (``_restore`` puts them back)."""
    if cache is None:
        return None
    cache.lengths[0] = length  # the pass wrote them all: any length up to it is theirs
    end = min(cache.max_len, length + slots)
    return [c[0, :, length:end].clone() for c in _kv(cache)]


def _restore(cache: Optional["KVCache"], length: int, saved: Optional[list["torch.Tensor"]]) -> None:
    if cache is None or saved is None:
        return
    for c, e in zip(_kv(cache), saved):
        c[0, :, length : length + e.shape[1]] = e
    cache.lengths[0] = length


def replay_prompt(drafter: "BatchDrafter", prompt: Sequence[int], answer: Sequence[int], end: int,
                  budget: int, cap: int, states: Optional[States] = None,
                  sampling: Optional["SamplingConfig"] = None, vocab: int = 0) -> Trace:
    """The decode core's single-row loop with the target's passes replaced by the recording: the same
    draft-length cap, the same calls on the drafter (``acceptance.fade``/``mark``/``update``,
    ``propose_rows``, ``on_verified_row``), the same greedy rule, and for a hidden-state drafter the states
    the core would hand it (``states``: the prefill's, then each step's pending and accepted tokens'), and
    ``states.cache`` as the target's KV cache.
    A seeded sampled ``sampling`` (the recording's) hands the drafter the row's coupled noise over a
    ``vocab``-token vocabulary, as the core does; the greedy rule against the recording is then the
    coupled rule."""
    sampling = sampling or SamplingConfig()
    noise = None
    if not sampling.greedy:
        if sampling.seed is None or vocab < 1:
            raise ValueError("a sampled replay needs the recording's seed and the target's vocabulary size")
        noise = CoupledNoise(sampling.seed, vocab)
    tr = Trace(tokens=end)
    drafter.reset_row(0)
    t = 0
    n_prompt = len(prompt)
    # the prefill keeps the prompt's states only for a drafter that reads layers (EAGLE-3), as the core's does
    hands = states is not None and drafter.wants_hidden
    hidden, layers = states.span(0, n_prompt - 1) if hands and states.layers else (None, None)  # type: ignore[union-attr]
    cache = states.cache if states is not None else None
    while t < end:
        drafter.acceptance.fade()
        g = max(0, min(cap, budget - t - 1))
        draft_s = 0.0
        source = ""
        nodes = 0
        accepted = 0
        drafter.acceptance.mark(g)
        if g > 0:
            length = n_prompt + t - 1  # every token but the pending one
            saved = _drafting_on(cache, length, 2 * g + 2)  # untimed: a run's next pass overwrites them
            t0 = time.perf_counter()
            ctx = DraftContext(list(prompt) + list(answer[:t]), g, sampling, None, hidden=hidden, layers=layers,
                               noise=noise, target_cache=cache)
            try:
                draft = drafter.propose_rows({0: ctx})[0]
            finally:
                draft_s = time.perf_counter() - t0
                _restore(cache, length, saved)
            nodes = len(draft.tokens)
            source = draft.source or ""
            if nodes > g:
                raise RuntimeError(f"the drafter proposed {nodes} tokens but at most {g} were allowed")
            if nodes:
                choices = target_choices(draft, answer, t)
                res = (greedy_verify_tree(choices, draft.tokens, draft.parents) if draft.parents is not None
                       else greedy_verify(choices, draft.tokens))
                accepted = res.n_accepted
                drafter.on_verified_row(0, accepted)
                drafter.acceptance.update(nodes, accepted)
        tr.steps += 1
        tr.nodes.append(nodes)
        tr.accepted.append(accepted)
        tr.draft_s.append(draft_s)
        tr.sources.append(source)
        if hands:  # the pass's states of the pending token and the accepted ones
            assert states is not None
            hidden, layers = states.span(n_prompt - 1 + t, n_prompt + t + accepted)
        t += accepted + 1
    return tr


def step_cost(costs: "Costs", t1: float, nodes: int, draft_s: float) -> float:
    """A step's price in one-token target passes: the drafter's time plus a pass over nodes + 1 tokens."""
    return (draft_s / t1 if t1 > 0 else 0.0) + costs.v_at(nodes)


def cmd_replay(args: argparse.Namespace) -> int:
    run = setup(args)
    target, prompts = run.target, run.prompts
    drafters = {k: d for k, d in run.drafters.items() if k != PLAIN}
    measured = get_costs(target, target_spec(target))
    t1 = measured.target_s[0] if measured.target_s else 0.0
    costs = measured
    if args.v_table:
        try:
            v = tuple(float(x) for x in args.v_table.split(","))
        except ValueError:
            raise ConfigError(f"--v-table: expected numbers separated by commas, got {args.v_table!r}") from None
        costs = Costs(c=0.0, v=(1.0,) + v)
    for label, d in drafters.items():
        d.prepare_rows(target, 1, target.max_seq_len)
        d.reset_row(0)
        if not getattr(d, "sizes_itself", False) and not isinstance(d.gamma, int):
            raise ConfigError(f"variant {label!r}: its draft length comes from the γ policy's live timings; "
                              "replay it at a fixed length with --gamma N")
    sampling = replay_sampling(args)
    answers = record(target, prompts, args.record, sampling)
    eos = set(target.eos_token_ids)
    categories = list(dict.fromkeys(p.workload.category for p in prompts))
    by_layers: dict[tuple[int, ...], list[States]] = {}  # one teacher-forced pass per layer set: states, cache
    traces: dict[str, list[Trace]] = {}
    for label, d in drafters.items():
        wanted = tuple(sorted(int(i) for i in getattr(d, "hidden_layers", ()))) if d.wants_hidden else ()
        if wanted not in by_layers:
            by_layers[wanted] = [teacher_forced(target, p.ids, a, wanted, MAX_GAMMA + 2)
                                 for p, a in zip(prompts, answers)]
        st = by_layers[wanted]
        # untimed, as the bench's warm-up: first-use work (a datastore's index, kernels) out of the steps' c
        replay_prompt(d, prompts[0].ids, answers[0], min(8, len(answers[0])), prompts[0].max_new_tokens, 8, st[0],
                      sampling, target.vocab_size)
        forget = getattr(d, "forget", None)
        if callable(forget):
            forget()
        cap = resolve_gamma(None, d.gamma).cap  # what generate caps this drafter's passes at
        traces[label] = [replay_prompt(d, p.ids, a, answer_end(a, eos, args.stop_at_eos), p.max_new_tokens, cap, h,
                                       sampling, target.vocab_size)
                         for p, a, h in zip(prompts, answers, st)]
    source = "--v-table" if args.v_table else "measured for this target"
    table = ", ".join(f"{costs.v_at(n):.2f}" for n in range(1, 9))
    how = "greedy" if sampling.greedy else (f"sampled: T {sampling.temperature:g}, top-k {sampling.top_k}, top-p "
                                            f"{sampling.top_p}, min-p {sampling.min_p}, seed {sampling.seed} (coupled)")
    print(f"v(1..8) {table} ({source}); one-token pass {t1 * 1e3:.2f} ms; answers {how}")
    rows = report(traces, [p.workload.category for p in prompts], categories, costs, t1)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "target": _identity(target), "variants": list(drafters), "prompts": [p.workload.id for p in prompts],
            "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                         "min_p": sampling.min_p, "seed": sampling.seed},
            "stop_at_eos": args.stop_at_eos, "v": list(costs.v), "t1_s": t1, "rows": rows,
            "steps": {label: [{"nodes": tr.nodes, "accepted": tr.accepted, "source": tr.sources,
                               "draft_s": [round(x, 7) for x in tr.draft_s]} for tr in trs]
                      for label, trs in traces.items()}}, separators=(",", ":")) + "\n")  # compact: every step
    return 0


def report(traces: dict[str, list[Trace]], cats_of: Sequence[str], categories: list[str], costs: "Costs",
           t1: float) -> list[dict[str, Any]]:
    """Print and return one row per (category, variant), 'overall' last."""
    rows = []
    width = max(len(v) for v in traces) + 2
    print(f"{'category':11s} {'variant':{width}s} {'pred':>6s}  {'cut':>6s}  {'tau':>5s}  {'nodes':>5s}  {'c':>6s}  "
          "decode steps")
    for cat in categories + ["overall"]:
        for label, trs in traces.items():
            sel = [tr for tr, c in zip(trs, cats_of) if cat in ("overall", c)]
            tokens, steps = sum(tr.tokens for tr in sel), sum(tr.steps for tr in sel)
            cost = sum(step_cost(costs, t1, n, s) for tr in sel for n, s in zip(tr.nodes, tr.draft_s))
            # the same steps had each draft held only its accepted nodes: what the rejected ones cost
            cut = sum(step_cost(costs, t1, a, s) for tr in sel for a, s in zip(tr.accepted, tr.draft_s))
            drafting = [(n, s) for tr in sel for n, s in zip(tr.nodes, tr.draft_s) if s > 0]
            row = {"category": cat, "variant": label, "predicted": tokens / cost if cost else 0.0,
                   "cut": tokens / cut if cut else 0.0,
                   "tau": tokens / steps if steps else 0.0, "tokens": tokens, "steps": steps,
                   "nodes": sum(tr_n for tr in sel for tr_n in tr.nodes) / steps if steps else 0.0,
                   "c": (sum(s for _, s in drafting) / len(drafting) / t1) if drafting and t1 > 0 else 0.0}
            rows.append(row)
            print(f"{cat:11s} {label:{width}s} {row['predicted']:5.3f}x  {row['cut']:5.3f}x  {row['tau']:5.2f}  "
                  f"{row['nodes']:5.2f}  {row['c']:6.3f}  {steps}")
    print("pred: tokens / Σ (c + v(nodes)) over the decode steps (prefill left out); cut: the same had each draft "
          "held only the nodes the target accepted (what the rejected ones cost); tau: tokens per target "
          "pass; nodes: draft nodes verified a step; c: the drafter's time a proposal over a one-token pass")
    return rows
