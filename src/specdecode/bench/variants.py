"""`specdecode bench variants`: drafters and drafter settings side by side against plain decoding, in one process.

The bench compares its method families; this compares any registered drafters with any values of
their declared options (the settings a user would pass as flags), on the same prompts: each prompt
is run by plain decoding and then by every variant in turn (order reversed on odd repetitions), the
drafters kept across prompts as a server keeps them (and reset at the start of each repetition).
Greedy, EOS ignored unless ``--stop-at-eos``; chat records are rendered with the target's template as the
bench renders them. Every output is checked against plain decoding's (exit status 1 if one differs). Prints
per category tok/s, the speedup over plain, τ (tokens per target pass) and, for drafters that combine others,
which member the accepted tokens came from.

    specdecode bench variants auto quant suffix --workload mixed
    specdecode bench variants NAME NAME:key=value NAME:key=value,key2=value --per-category 3 --reps 2

A variant is ``NAME`` (a registered drafter, built with its declared defaults and this command's
drafter flags) or ``NAME:key=value,...`` with keys from that drafter's options (``--help`` lists
them under ``--drafter NAME``; dashes or underscores alike) or a trained directory's flag, so two
trainings of one drafter run side by side on the same prompts:

    specdecode bench variants eagle eagle:eagle-draft=runs/eagle2/out auto auto:eagle-draft=runs/eagle2/out
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from ..cli import model_loader, resolve_draft_path, resolve_target
from ..config import ConfigError, ModelLoadConfig, add_dataclass_args, from_args
from ..drafters.plugin import DrafterOptions
from ..drafters.registry import (add_drafter_args, all_artifacts, artifacts_from_args, build_drafter, get_spec,
                                 options_from_args)
from ..engine import generate
from ..sizing.gamma import parse_gamma
from .flags import parse_per_category
from .real import prepare_real_prompts
from .workloads import load_workloads, resolve_workload, select

PLAIN = "plain"


@dataclass
class Variant:
    label: str  # as given on the command line
    drafter: str
    options: dict[str, object]
    artifacts: dict[str, str] = field(default_factory=dict)  # artifact name -> directory, over the flags'


@dataclass
class Tally:
    tokens: int = 0
    passes: int = 0
    seconds: float = 0.0
    accepted_by: collections.Counter = field(default_factory=collections.Counter)


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("variants", help="registered drafters and their option values against plain decoding, "
                                        "prompt by prompt in one process",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_variant_args(p)
    p.add_argument("--reps", type=int, default=2, help="passes over the prompts (default: 2)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    p.set_defaults(func=cmd_variants)


def add_variant_args(p: argparse.ArgumentParser) -> None:
    """The variants, the models and the prompts: what ``variants`` and ``replay`` both take."""
    p.add_argument("variants", nargs="+", metavar="VARIANT",
                   help="NAME (a registered drafter) or NAME:key=value,... with keys from its options (the "
                        "--drafter NAME groups below)")
    p.add_argument("--target", help="target model (default: the bundled one)")
    p.add_argument("--draft", help="draft model directory, for drafters that take one (default: the bundled one "
                                   "beside the bundled target)")
    p.add_argument("--gamma", default="auto", help="as generate's --gamma: N tokens every pass, or auto (the cost "
                                                   "policy picks 0 to each drafter's cap) (default: auto)")
    p.add_argument("--workload", help="JSONL file or a shipped workload's name (default: stdlib)")
    p.add_argument("--per-category", type=parse_per_category, default=3,
                   help="first N prompts of each category, or 'all' (default: 3)")
    p.add_argument("--max-new-tokens", type=int, default=384, help="cap on each prompt's own budget (default: 384)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="end each answer at the model's end of turn, as a user sees it (default: EOS ignored, every "
                        "run writes its whole budget)")
    add_dataclass_args(p, ModelLoadConfig)
    add_drafter_args(p)


def parse_variant(text: str) -> Variant:
    """``NAME[:key=value,...]`` -> a Variant, each value parsed by the drafter's declared option."""
    name, _, rest = text.partition(":")
    spec = get_spec(name.strip())
    declared = {o.key: o for o in spec.options}
    trained = {a.flag.lstrip("-").replace("-", "_"): a for a in all_artifacts().values()}
    options: dict[str, object] = {}
    artifacts: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if eq and key in trained and key not in declared:
            a = trained[key]
            if not a.accepts(Path(value.strip())):
                raise ConfigError(f"variant {text!r}: {key}: {value.strip()!r} is not {a.what}")
            artifacts[a.name] = value.strip()
            continue
        if not eq or key not in declared:
            known = ", ".join([*declared, *trained]) or "none"
            raise ConfigError(f"variant {text!r}: expected key=value with a key among {spec.name!r}'s options "
                              f"and the trained directories' flags ({known}); got {item!r}")
        try:
            options[key] = declared[key].parse(value.strip())
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            raise ConfigError(f"variant {text!r}: {key}: {e}") from None
    return Variant(text, spec.name, options, artifacts)


@dataclass
class Setup:
    target: Any  # Model
    drafters: dict[str, Any]  # label -> BatchDrafter (None: plain decoding, under PLAIN)
    prompts: list[Any]  # PreparedPrompt (ids, workload, max_new_tokens)
    gamma: Any = None  # --gamma as a Gamma: every variant runs by the rule generate's --gamma follows


def setup(args: argparse.Namespace) -> Setup:
    """Load the models, build each variant's drafter (plain first) and render the prompts."""
    variants = [parse_variant(v) for v in args.variants]
    torch.set_num_threads(args.threads)
    load = model_loader(from_args(ModelLoadConfig, args))
    target = load(resolve_target(args))
    specs = [get_spec(v.drafter) for v in variants]
    wants_draft = any(s.needs_draft_model or (s.uses_draft_model and not args.target) for s in specs)
    draft_path = resolve_draft_path(args, wants_draft)
    draft = load(draft_path) if draft_path else None
    shared = options_from_args(args)
    artifacts = artifacts_from_args(args)
    gamma = parse_gamma(args.gamma)
    drafters: dict[str, Any] = {PLAIN: None}
    for v in variants:
        o = DrafterOptions(draft=draft, gamma=gamma, options={**shared, **v.options},
                           artifacts={**artifacts, **v.artifacts})
        drafters[v.label] = build_drafter(v.drafter, o)
    workloads = select(load_workloads(resolve_workload(args.workload)), args.per_category or None,
                       args.max_new_tokens)
    prompts, _ = prepare_real_prompts(workloads, target, draft)
    return Setup(target, drafters, prompts, gamma)


def cmd_variants(args: argparse.Namespace) -> int:
    run = setup(args)
    target, drafters, prompts = run.target, run.drafters, run.prompts
    ignore_eos = not args.stop_at_eos
    categories = list(dict.fromkeys(p.workload.category for p in prompts))
    for d in drafters.values():  # untimed: builds kernels and measures each drafter's costs once (cached on disk)
        generate(target, prompts[0].ids, drafter=d, max_new_tokens=8, ignore_eos=True, gamma=run.gamma)
    stat = {(v, c): Tally() for v in drafters for c in categories}
    mismatches = 0
    for rep in range(args.reps):
        for d in drafters.values():
            forget = getattr(d, "forget", None)  # drafters that remember earlier requests start afresh
            if callable(forget):
                forget()
        for p in prompts:
            ref: Optional[list[int]] = None
            for label in (list(drafters) if rep % 2 == 0 else list(reversed(drafters))):
                t0 = time.perf_counter()
                r = generate(target, p.ids, drafter=drafters[label], max_new_tokens=p.max_new_tokens,
                             ignore_eos=ignore_eos, gamma=run.gamma)
                s = stat[(label, p.workload.category)]
                s.seconds += time.perf_counter() - t0
                s.tokens += len(r.token_ids)
                s.passes += r.stats.target_passes
                s.accepted_by.update(r.stats.accepted_by)
                if ref is None:
                    ref = r.token_ids
                elif r.token_ids != ref:
                    mismatches += 1
                    print(f"{label} changed the output of {p.workload.id}: a bug")
    rows = report(stat, list(drafters), categories)
    print(f"outputs differing from plain decoding: {mismatches}")
    if args.json:
        Path(args.json).write_text(json.dumps({"target": target.path, "variants": args.variants,
                                               "prompts": len(prompts), "reps": args.reps, "rows": rows,
                                               "ignore_eos": ignore_eos,
                                               "mismatches": mismatches}, indent=2) + "\n")
    return 1 if mismatches else 0


def report(stat: dict[tuple[str, str], Tally], labels: list[str], categories: list[str]) -> list[dict[str, Any]]:
    """Print and return one row per (category, variant), 'overall' last; speedup over plain's tok/s."""
    rows = []
    width = max(len(v) for v in labels) + 2
    for cat in categories + ["overall"]:
        base: Optional[float] = None
        for v in labels:
            parts = [stat[(v, c)] for c in (categories if cat == "overall" else [cat])]
            toks, passes = sum(t.tokens for t in parts), sum(t.passes for t in parts)
            sec = sum(t.seconds for t in parts)
            acc: collections.Counter = collections.Counter()
            for t in parts:
                acc.update(t.accepted_by)
            rate = toks / sec if sec else 0.0
            base = base or rate
            row = {"category": cat, "variant": v, "tok_s": rate, "speedup": rate / base if base else 0.0,
                   "tau": toks / passes if passes else 0.0, "accepted_by": dict(acc)}
            rows.append(row)
            by = "  accepted by " + ", ".join(f"{n} {c}" for n, c in acc.items()) if len(acc) > 1 else ""
            print(f"{cat:11s} {v:{width}s} {rate:7.1f} tok/s  {row['speedup']:.3f}x  tau {row['tau']:.2f}{by}")
    return rows
