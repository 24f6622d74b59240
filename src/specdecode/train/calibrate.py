"""``specdecode calibrate``: find the layers a layer-skip draft should run, on the user's prompts.

Which layers make a good draft depends on the checkpoint (and a little on the machine), so it is
measured, not guessed. In minutes:

1. **Reference.** Plain greedy decoding of each prompt (its tokens and its time).
2. **Costs.** v(k) of the target, and c of every layer count (a partial forward of k layers
   against the full one-token pass, interleaved, on the thread's CPU clock).
3. **Screening, exact and cheap.** For a layer set, one teacher-forced pass over prompt +
   reference continuation gives, at every position, whether the draft's argmax equals the
   target's. Under greedy decoding that *is* the acceptance event of speculative decoding (a
   draft token is judged only after its prefix was accepted, i.e. equals the reference), so the
   verify steps of any γ can be replayed exactly from these matches; with c and v that gives a
   predicted speedup. Every early exit is screened, then skip sets by greedy removal from the
   full stack (SWIFT's search, arXiv:2410.06916, with this objective), while time lasts.
4. **Measurement.** The best few candidates (and plain decoding) generate the prompts for real,
   interleaved; the fastest *measured* one is stored, with its γ, in ``layerskip.json`` beside
   the checkpoint (or in the cache directory when the checkpoint directory is read-only).

When nothing beats plain decoding the best set is still stored and marked as not paying: with
``--gamma auto`` the γ policy then keeps speculation off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import torch
from tqdm import tqdm

from ..bench.workloads import DEFAULT_WORKLOAD, _messages, load_workloads, select
from ..chat import encode_chats
from ..cli import model_loader, resolve_target
from ..config import ConfigError, ModelLoadConfig, add_dataclass_args, from_args
from ..drafters.layerskip import DraftLayers, LayerSkipDrafter, check_family, save_calibration
from ..drafters.registry import target_folder
from ..engine import generate
from ..jsonl import read_jsonl
from ..sizing.book import cpu_name
from ..sizing.costs import Step, cost_clock, measure_costs, time_steps

if TYPE_CHECKING:
    from ..models import Model

MAX_GAMMA = 8  # γ screened per candidate
DEFAULT_PROMPTS_PER_CATEGORY = 2
DEFAULT_NEW_TOKENS = 128
MEASURED = 3  # candidates timed for real
PAYS = 1.02  # measured speedup over plain decoding that counts as a win (run-to-run noise is about 1-2%)


@dataclass
class Candidate:
    """A layer set and what screening and measurement found for it."""

    layers: DraftLayers
    alpha: float = 0.0  # fraction of reference positions where the draft's argmax is the target's
    c: float = 0.0
    gamma: int = 1  # the γ with the best predicted speedup
    predicted: float = 0.0  # predicted speedup over plain decoding at that γ
    measured: Optional[float] = None  # measured speedup (plain seconds / these seconds), same tokens
    tau: Optional[float] = None  # measured tokens per target pass
    measured_alpha: Optional[float] = None  # accepted / drafted in the measured runs
    identical: Optional[bool] = None  # measured runs gave plain decoding's tokens

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "layers"}
        return {**self.layers.to_dict(), **d}


@dataclass
class Prompted:
    ids: list[int]
    reference: list[int]  # plain greedy continuation
    prefill: float  # the target's prefill of the prompt, in one-token decode passes (the reference run's)
    plain_s: list[float] = field(default_factory=list)  # timed plain runs (the reference run is a warm-up)


# -- inputs --------------------------------------------------------------------------------------
Messages = tuple[tuple[str, str], ...]  # (role, content) turns: rendered with the target's chat template
Prompt = Union[str, Messages]
OWN_PROMPTS = Path("data") / "prompts.jsonl"  # a target folder's training prompts (held out from its bench)


def default_prompts_file(folder: Optional[Path]) -> Optional[Path]:
    """The prompts a target was trained on (``TARGET/data/prompts.jsonl``), if it has them: an instruct
    model is calibrated on chats in its template, not on the bundled code workload."""
    path = folder / OWN_PROMPTS if folder is not None else None
    return path if path is not None and path.is_file() else None


def _jsonl_prompts(path: str, per_category: Optional[int]) -> list[Prompt]:
    """JSON lines: strings, or objects with a "prompt" string or "messages" (a chat); with
    ``per_category``, the first that many of each "category"."""
    prompts: list[Prompt] = []
    counts: dict[str, int] = {}
    for i, rec in read_jsonl(path, objects=False):
        if isinstance(rec, dict) and "messages" in rec:
            prompt: object = _messages(rec["messages"], f"{path}:{i}")
        else:
            prompt = rec.get("prompt") if isinstance(rec, dict) else rec
            if not isinstance(prompt, str) or not prompt:
                raise ConfigError(f"{path}:{i}: need a non-empty string or an object with a \"prompt\" string "
                                  "or \"messages\"")
        category = str(rec.get("category", "")) if isinstance(rec, dict) else ""
        if per_category is not None and counts.get(category, 0) >= per_category:
            continue
        counts[category] = counts.get(category, 0) + 1
        prompts.append(prompt)  # type: ignore[arg-type]
    return prompts


def read_prompts(path: Optional[str], max_prompts: Optional[int] = None, per_category: Optional[int] = None
                 ) -> list[Prompt]:
    """Prompts from ``path``: JSON lines (``_jsonl_prompts``: a bench workload, a chat prompt set), else
    plain text with prompts separated by lines holding only ``---``. Without a path: the first prompts
    of each category of the bundled held-out workload."""
    if path is None:
        chosen = select(load_workloads(DEFAULT_WORKLOAD), per_category=per_category or DEFAULT_PROMPTS_PER_CATEGORY)
        prompts: list[Prompt] = [w.messages or w.prompt for w in chosen]
    else:
        if Path(path).suffix == ".jsonl":
            prompts = _jsonl_prompts(path, per_category)
        else:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError as e:
                raise ConfigError(f"cannot read --prompts {path}: {e}") from e
            chunks: list[str] = []
            cur: list[str] = []
            for line in text.splitlines(keepends=True):
                if line.strip() == "---":
                    chunks.append("".join(cur))
                    cur = []
                else:
                    cur.append(line)
            chunks.append("".join(cur))
            prompts = [c for c in chunks if c.strip()]
        if not prompts:
            raise ConfigError(f"--prompts {path} holds no prompts")
    return prompts[:max_prompts] if max_prompts else prompts


def prompt_ids(target: "Model", prompts: Sequence[Prompt]) -> list[list[int]]:
    """Token ids of each prompt: text as ``generate`` encodes it, a chat through the target's template
    as the server and the bench render it."""
    chats = iter(encode_chats(target, [p for p in prompts if not isinstance(p, str)]))
    return [target.encode(p) if isinstance(p, str) else next(chats) for p in prompts]


# -- screening -----------------------------------------------------------------------------------
def matches(target: "Model", data: Sequence[Prompted], layers: Sequence[int]) -> list[list[bool]]:
    """Per prompt, per reference position: does the draft's argmax (teacher-forced) equal the target's?"""
    out = []
    with torch.inference_mode():
        for d in data:
            seq = d.ids + d.reference
            cache = target.new_cache(1, len(seq))
            logits = target.forward(torch.tensor([seq[:-1]], device=target.device), cache, layers=tuple(layers))
            guess = logits[0, len(d.ids) - 1:].argmax(-1).tolist()
            out.append([g == t for g, t in zip(guess, d.reference)])
    return out


def replay(hits: Sequence[Sequence[bool]], gamma: int, c: float, v: Sequence[float],
           prefill: Optional[Sequence[float]] = None, draft_prefill: float = 0.0) -> float:
    """Predicted speedup of greedy speculation with these acceptance events, in one-token target passes:
    each verify step drafts min(γ, tokens left - 1), keeps the run of matches, adds the target's
    token, and costs γc + v(γ) (plain decoding: one per token). ``prefill`` (per prompt, the target's
    prefill) counts on both sides, since a request pays it either way; a draft with layers of its own
    also prefills them (``draft_prefill`` of the target's prefill: the share of layers it runs)."""
    plain, cost = 0.0, 0.0
    for k, h in enumerate(hits):
        n, pos = len(h), 0
        p = prefill[k] if prefill is not None else 0.0
        plain += n + p
        cost += p * (1.0 + draft_prefill)
        while pos < n:
            g = min(gamma, n - pos - 1)
            acc = 0
            while acc < g and h[pos + acc]:
                acc += 1
            cost += g * c + (v[g] if g < len(v) else v[-1])
            pos += acc + 1
    return plain / cost if cost else 0.0


def score(cand: Candidate, hits: Sequence[Sequence[bool]], v: Sequence[float],
          prefill: Optional[Sequence[float]] = None) -> Candidate:
    """α and the best γ's predicted speedup of ``cand`` from its acceptance events."""
    total = sum(len(h) for h in hits)
    cand.alpha = sum(sum(h) for h in hits) / total if total else 0.0
    plan = cand.layers
    extra = 0.0 if plan.is_exit else len(plan.layers) / plan.n_layers  # an early exit shares all it runs
    best = max(range(1, MAX_GAMMA + 1), key=lambda g: replay(hits, g, cand.c, v, prefill, extra))
    cand.gamma, cand.predicted = best, replay(hits, best, cand.c, v, prefill, extra)
    return cand


def layer_costs(target: "Model", context: Sequence[int], reps: int) -> dict[int, float]:
    """c per layer count k = 1..n-1: the median time of a one-token forward through the first k layers over
    the median full one-token pass, timed by the one timing loop (``sizing.costs.time_steps``: interleaved,
    alternating order, the γ policy's clock)."""
    n = target.config.n_layers
    ids = list(context)[: target.max_seq_len - 2]
    probe = torch.tensor([[ids[-1]]], device=target.device)
    with torch.inference_mode():
        cache = target.new_cache(1, len(ids) + 1)
        target.forward(torch.tensor([ids], device=target.device), cache, last_only=True)

    def through(k: int) -> Step:
        layers = None if k == n else tuple(range(k))
        return Step(lambda: float(target.forward(probe, cache, last_only=True, layers=layers)[0, -1, 0]),
                    lambda: cache.trim(1))

    times, _ = time_steps({k: through(k) for k in range(1, n + 1)}, {}, cost_clock(target), target.device, reps)
    return {k: times[k] / times[n] for k in range(1, n)}


# -- the search ----------------------------------------------------------------------------------
@dataclass
class Calibration:
    best: Candidate
    candidates: list[Candidate]
    v: tuple[float, ...]
    plain_tokens_per_s: float
    prompts: int
    new_tokens: int
    seconds: float


def calibrate(target: "Model", prompts: Sequence[Union[str, Sequence[int]]], minutes: float = 3.0,
              max_new_tokens: int = DEFAULT_NEW_TOKENS, progress: Optional[Callable[[str, float], None]] = None
              ) -> Calibration:
    """Search the layer set with the best measured speedup on ``prompts`` (text, or token ids: see
    ``prompt_ids``; the module docstring says how). ``progress(phase, elapsed_s)`` is called as work completes."""
    check_family(target)
    n = target.config.n_layers
    if n < 2:
        raise ConfigError(f"{target.name} has {n} layer; a layer-skip draft needs at least 2")
    t_start = time.perf_counter()
    deadline = t_start + 60.0 * minutes
    clock = cost_clock(target)  # runs are timed on the thread's CPU clock when single-threaded: other load
    # on the machine then cannot favour whichever run it happened to spare

    def tick(phase: str) -> None:
        if progress is not None:
            progress(phase, time.perf_counter() - t_start)

    data: list[Prompted] = []
    for p in prompts:
        ids = (target.encode(p) if isinstance(p, str) else list(p))[-(target.max_seq_len - max_new_tokens - 1):]
        r = generate(target, ids, max_new_tokens=max_new_tokens, ignore_eos=True)
        step = r.stats.decode_s / max(1, r.stats.target_passes)
        data.append(Prompted(ids, r.token_ids, r.stats.prefill_s / step if step > 0 else 0.0))
        tick("reference")
    data = [d for d in data if len(d.reference) > 1]
    if not data:
        raise ConfigError("the prompts leave no room to generate; use shorter prompts")
    context = max((d.ids for d in data), key=len)
    v = measure_costs(target, None, max_gamma=MAX_GAMMA, reps=5, context=context).v
    c_of = layer_costs(target, context, reps=9)
    tick("costs")

    seen: dict[tuple[int, ...], Candidate] = {}

    def evaluate(layers: DraftLayers) -> Candidate:
        if layers.layers not in seen:
            cand = Candidate(layers, c=c_of[len(layers.layers)])
            seen[layers.layers] = score(cand, matches(target, data, layers.layers), v, [d.prefill for d in data])
            tick("screening")
        return seen[layers.layers]

    for k in range(1, n):
        evaluate(DraftLayers.exit(k, n))
    # skip sets: greedy removal from the full stack, keeping the set with the best prediction each round;
    # screening may take until 60% of the budget, the rest is for timing real runs
    screen_end = t_start + 0.6 * (deadline - t_start)
    current = tuple(range(n))
    while len(current) > 1 and time.perf_counter() < screen_end:
        options = []
        for drop in current:
            rest = tuple(i for i in current if i != drop)
            if time.perf_counter() >= screen_end:
                break
            options.append(evaluate(DraftLayers(rest, n)))
        if not options:
            break
        current = max(options, key=lambda cd: cd.predicted).layers.layers

    ranked = sorted(seen.values(), key=lambda cd: cd.predicted, reverse=True)
    finalists = ranked[:MEASURED]
    timed: dict[int, list[float]] = {id(cd): [] for cd in finalists}
    stats = {id(cd): [0, 0, 0] for cd in finalists}  # drafted, accepted, target passes
    identical = {id(cd): True for cd in finalists}
    drafters = {id(cd): LayerSkipDrafter(skip_layers=cd.layers.skipped, gamma=cd.gamma) for cd in finalists}
    rounds = 0
    while rounds == 0 or time.perf_counter() < deadline:
        for d in data:
            order = [None] + finalists if rounds % 2 == 0 else finalists[::-1] + [None]
            for cd in order:
                t0 = clock()
                r = generate(target, d.ids, drafter=drafters[id(cd)] if cd is not None else None,
                             max_new_tokens=len(d.reference), ignore_eos=True)
                dt = clock() - t0
                if cd is None:
                    d.plain_s.append(dt)
                    continue
                timed[id(cd)].append(dt)
                s = stats[id(cd)]
                s[0] += r.stats.drafted
                s[1] += r.stats.accepted
                s[2] += r.stats.target_passes
                identical[id(cd)] &= r.token_ids == d.reference
        rounds += 1
        tick("measuring")
    plain = sum(statistics.median(d.plain_s) for d in data)
    per_round = len(data)
    for cd in finalists:
        ts = timed[id(cd)]
        mine = sum(statistics.median(ts[i::per_round]) for i in range(per_round))
        cd.measured = plain / mine
        drafted, accepted, passes = stats[id(cd)]
        cd.measured_alpha = accepted / drafted if drafted else 0.0
        cd.tau = sum(len(d.reference) for d in data) * rounds / passes if passes else 0.0
        cd.identical = identical[id(cd)]
    best = max(finalists, key=lambda cd: cd.measured or 0.0)
    tokens = sum(len(d.reference) for d in data)
    return Calibration(best, ranked, tuple(v), tokens / plain, len(data), max_new_tokens,
                       time.perf_counter() - t_start)


def record(cal: Calibration, target: "Model") -> dict[str, Any]:
    """What ``layerskip.json`` holds: the choice, how it was measured, and every screened candidate."""
    b = cal.best
    return {**b.layers.to_dict(), "gamma": b.gamma, "measured_speedup": b.measured, "predicted_speedup": b.predicted,
            "alpha": b.alpha, "measured_alpha": b.measured_alpha, "tau": b.tau, "c": b.c,
            "speculation_pays": bool(b.measured and b.measured >= PAYS), "v": list(cal.v),
            "plain_tokens_per_s": cal.plain_tokens_per_s, "prompts": cal.prompts, "new_tokens": cal.new_tokens,
            "seconds": round(cal.seconds, 1), "machine": cpu_name(), "kernels": target.kernels.describe(),
            "threads": torch.get_num_threads(), "dtype": str(target.dtype),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "candidates": [c.to_dict() for c in cal.candidates]}


# -- command line --------------------------------------------------------------------------------
def add_subcommands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("calibrate", help="find the layers a layer-skip draft should run (--drafter layerskip)",
                       description="Search the target's early exits and skip sets for the best measured speedup "
                                   "on your prompts, and store the choice (layerskip.json) beside the checkpoint "
                                   "directory, or for a GGUF file or a catalogued model in TARGET/drafters/"
                                   "layerskip/ (the cache directory if neither can be written). --drafter "
                                   "layerskip then uses it.")
    p.add_argument("--target", help="target model: a directory, a GGUF file or a catalogued name "
                                    "(default: bundled models/code-target)")
    p.add_argument("--prompts", help="prompts to calibrate on: a .jsonl file (strings, or objects with a \"prompt\" "
                                     "string or chat \"messages\", rendered with the target's chat template: a bench "
                                     "workload, a prompt set) or a text file with prompts separated by lines '---' "
                                     f"(default: TARGET/{OWN_PROMPTS} when the target has one, else the bundled "
                                     "held-out workload)")
    p.add_argument("--per-category", type=int, default=None,
                   help="the first N prompts of each category of a .jsonl file (default: all of a file you name, "
                        f"{DEFAULT_PROMPTS_PER_CATEGORY} of a default one)")
    p.add_argument("--max-prompts", type=int, default=None, help="use at most this many prompts")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="store layerskip.json in DIR instead (pass it to --layerskip-calibration)")
    p.add_argument("--minutes", type=float, default=3.0, help="time budget in minutes (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_NEW_TOKENS,
                   help="tokens generated per prompt (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; time with the count you will decode with (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the stored record as JSON")
    add_dataclass_args(p, ModelLoadConfig)
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.minutes <= 0 or args.max_new_tokens < 2:
        raise ConfigError("--minutes must be positive and --max-new-tokens at least 2")
    torch.set_num_threads(max(1, args.threads))
    if args.per_category is not None and args.per_category < 1:
        raise ConfigError("--per-category must be at least 1")
    target = model_loader(from_args(ModelLoadConfig, args))(resolve_target(args))
    folder = target_folder(args.target)
    path = args.prompts or default_prompts_file(folder)
    per_category = args.per_category or (None if args.prompts else DEFAULT_PROMPTS_PER_CATEGORY)
    prompts = prompt_ids(target, read_prompts(str(path) if path else None, args.max_prompts, per_category))
    beside = folder is None or folder.resolve() == Path(str(target.path)).resolve()  # a directory checkpoint
    out = args.out or (None if beside else folder / "drafters" / "layerskip")  # type: ignore[operator]
    budget = 60.0 * args.minutes
    with tqdm(total=round(budget), desc="calibrate", unit="s", file=sys.stderr, disable=args.no_progress,
              bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s {postfix}") as bar:
        def progress(phase: str, elapsed: float) -> None:
            bar.n = min(elapsed, bar.total)
            bar.set_postfix_str(phase)

        cal = calibrate(target, prompts, args.minutes, args.max_new_tokens, progress)
    rec = record(cal, target)
    path = save_calibration(target.path, rec, out)
    if args.json:
        print(json.dumps(rec, indent=2))
        return 0
    print(f"{'layers':<28} {'alpha':>6} {'c':>5} {'gamma':>5} {'predicted':>9} {'measured':>8}")
    for cd in cal.candidates[:12]:
        measured = f"{cd.measured:.2f}x" if cd.measured is not None else ""
        print(f"{cd.layers.describe():<28} {cd.alpha:6.2f} {cd.c:5.2f} {cd.gamma:5d} {cd.predicted:8.2f}x "
              f"{measured:>8}")
    b = cal.best
    verdict = ("pays" if rec["speculation_pays"] else
               "does not beat plain decoding here; --gamma auto keeps speculation off when it does not pay")
    print(f"chose {b.layers.describe()}, gamma {b.gamma}: {b.measured:.2f}x plain measured (tau {b.tau:.2f}, "
          f"alpha {b.measured_alpha:.2f}, c {b.c:.2f}) on {cal.prompts} prompts x {cal.new_tokens} tokens; "
          f"{verdict}\nstored in {path}")
    return 0
