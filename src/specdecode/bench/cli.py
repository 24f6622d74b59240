"""`specdecode bench` (and the registration of `specdecode theory`, in ``theory_cli``).

bench: every method on the same prompts, token budgets and threads, interleaved
per prompt, repeated; prints a table and writes bench.json plus PNG plots.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import platform
import resource
import sys
import time
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy
import torch
from tqdm import tqdm

from .. import __version__
from ..cli import model_loader, parse_draft_vocab, resolve_draft_path, resolve_target
from ..config import ConfigError, ModelLoadConfig, SamplingConfig, add_dataclass_args, from_args
from ..drafters.registry import (REGISTRY, DrafterOptions, add_drafter_args, artifacts_from_args, get_spec,
                                 options_from_args, with_defaults)
from ..models.loading import resolve_model_path
from ..sizing.book import cpu_name
from ..sizing.costs import measure_costs
from . import llamacpp, llamacpp_gguf
from .flags import parse_gammas, parse_int_list, parse_per_category
from .ours import OursMethod, baseline_family, bench_families
from .real import REAL_PER_CATEGORY, prepare_real_prompts
from .report import finite, format_markdown, format_table, summarize, write_json, write_plots
from .runners import BenchContext, build_methods, default_methods, method_table, run_all, warm_up
from .subcommands import add_subcommands as add_bench_subcommands
from .theory_cli import add_parser as add_theory_parser
from .workloads import load_workloads, resolve_workload, select, stop_at_eos

QUICK_HELP = ("smoke run in under 2 minutes: 1 prompt per category, 32-token budgets, γ in {2,4}, 2 repetitions, "
              "1 thread unless --threads")


@dataclass(frozen=True)
class Defaults:
    gammas: str
    lookup_tokens: str
    peer_gammas: str
    reps: int
    per_category: Optional[int]
    max_new_tokens: Optional[int]
    cost_repeats: int


FULL = Defaults(gammas="1-8,auto", lookup_tokens="2,4,8", peer_gammas="4", reps=3, per_category=None,
                max_new_tokens=None, cost_repeats=20)
QUICK = Defaults(gammas="2,4", lookup_tokens="4", peer_gammas="4", reps=2, per_category=1,
                 max_new_tokens=32, cost_repeats=5)


def add_subcommands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    b = sub.add_parser("bench", help="benchmark speculative decoding against plain decoding and transformers",
                       description="Run plain decoding, draft-model speculation (γ swept) and prompt lookup in "
                                   "our runtime, and transformers' generate as the peer, on the same prompts; "
                                   "print a table and write JSON + plots.",
                       # no prefix matching here: a subcommand's own flag (llamacpp-decode --n) was refused as an
                       # ambiguous prefix of bench's flags before the subcommand could read it
                       allow_abbrev=False)
    b.add_argument("--target", help="target model directory (default: bundled models/code-target)")
    b.add_argument("--draft", help="draft model directory (default: bundled models/code-draft)")
    for spec in REGISTRY.values():  # a drafter taking a draft with its own tokenizer: that draft, beside --draft
        if spec.own_tokenizer:
            b.add_argument(f"--{spec.name}-draft", dest=own_draft_dest(spec.name),
                           help=f"draft with its own tokenizer for the {spec.name} methods (default: --draft)")
    b.add_argument("--workload", help="JSONL file with id, category, prompt (or chat messages), max_new_tokens per "
                                      "line, or a shipped one by name: stdlib, mixed, repetitive, or real (chat "
                                      "prompts in the target's template: code, chat, edit, summarize, reasoning; "
                                      "8 per category unless --per-category) (default: stdlib)")
    b.add_argument("--methods", default=",".join(default_methods()),
                   help=f"comma-separated method families; known: {', '.join(method_table())} (default: %(default)s)")
    b.add_argument("--gammas", help="draft lengths to sweep for the swept methods; 'auto' adds their gamma='auto' "
                                    "methods (chosen every step by the library's cost model) "
                                    f"(default: {FULL.gammas}; quick: {QUICK.gammas})")
    b.add_argument("--lookup-tokens", help=f"prompt-lookup draft lengths, ours and transformers' "
                                           f"(default: {FULL.lookup_tokens}; quick: {QUICK.lookup_tokens})")
    b.add_argument("--peer-gammas", help=f"γ for transformers' assistant_model (default: {FULL.peer_gammas})")
    b.add_argument("--draft-vocab", type=parse_draft_vocab, default="auto",
                   help="output vocabulary of the draft methods: auto (the draft's draft_vocab.json cut, if any), "
                        "full, or N most frequent tokens; a method declaring its own vocabulary keeps it "
                        "(default: auto)")
    b.add_argument("--reps", type=int,
                   help=f"timed repetitions of every run (default: {FULL.reps}; quick: {QUICK.reps})")
    b.add_argument("--per-category", type=parse_per_category,
                   help="use only the first N prompts of each category; 'all' for every one")
    b.add_argument("--max-new-tokens", type=int, help="cap every prompt's token budget at this")
    b.add_argument("--stop-at-eos", action=argparse.BooleanOptionalAction, default=None,
                   help="stop at end-of-sequence (default: on for the chat workload 'real', where text past the "
                        "answer's end would inflate speedups, unless --llama-cpp runs, whose llama-bench always "
                        "writes the full budget; off otherwise, so all methods emit the full budget)")
    b.add_argument("--threads", type=int, default=None,
                   help="torch threads for every method, fixed for the whole run; 0 = decide once at the start: "
                        "all cores if the machine is otherwise idle, else 1 (default: 0; quick: 1)")
    b.add_argument("--llama-cpp", metavar="DIR",
                   help="also run llama.cpp (a build made by scripts/build_llama_cpp.sh, or its bin folder), "
                        "interleaved with ours on the same prompts, budgets and --threads: plain decoding "
                        "(llama-bench) per --llama-cpp-formats, speculative decoding (llama-speculative-simple) per "
                        "format and --peer-gammas when there is a draft, and lookup decoding (llama-lookup) per "
                        "--lookup-tokens when the lookup family runs. A GGUF --target runs as that very file; an HF "
                        "directory is converted to GGUF first (default: not run)")
    b.add_argument("--llama-cpp-formats", default=None,
                   help="GGUF weight formats for the llama.cpp runs: 'file' (a GGUF target as given), bf16, f16, "
                        "q8_0, q4_0 (made by llama-quantize, --allow-requantize from a quantized GGUF), q4_0-pure "
                        "(--pure: the output matrix in Q4_0 too, llama.cpp's fastest file) "
                        "(default: file for a GGUF target, bf16,q8_0,q4_0 for an HF directory)")
    add_dataclass_args(b, ModelLoadConfig)
    add_dataclass_args(b, SamplingConfig)  # every method samples alike; > 0 adds each family's sampled companion
    add_drafter_args(b)  # the drafters' own options and artifacts, as generate and serve take them
    b.add_argument("--cost-repeats", type=int, help="timed rounds when measuring c and v(γ) "
                                                        f"(default: {FULL.cost_repeats}; quick: {QUICK.cost_repeats})")
    b.add_argument("--out", help="output directory (default: runs/bench-<timestamp>)")
    b.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--quick", action="store_true", help=QUICK_HELP)
    b.set_defaults(func=cmd_bench)
    add_bench_subcommands(b)

    add_theory_parser(sub)


# ---------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------

def _maxrss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB, macOS bytes)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024


def _git_commit() -> Optional[str]:
    """HEAD of the source checkout, read from .git without running git (None when installed elsewhere)."""
    git = Path(__file__).resolve().parents[3] / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        packed = git / "packed-refs"
        if packed.is_file():
            for line in packed.read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split()[0]
        return f"{ref} (no commit yet)"
    except OSError:
        return None


def _versions() -> dict[str, Optional[str]]:
    out: dict[str, Optional[str]] = {"python": platform.python_version(), "torch": torch.__version__,
                                     "numpy": numpy.__version__, "specdecode": __version__}
    try:
        import transformers  # lazy: an optional peer (~1 s to import), read only for its version

        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = None
    return out


@dataclass(frozen=True)
class BenchSettings:
    """The flags after --quick defaults are applied and every value is checked."""

    families: list[str]
    gammas: list[int]
    auto_gamma: bool
    lookup_tokens: list[int]
    peer_gammas: list[int]
    reps: int
    per_category: Optional[int]
    max_new_tokens: Optional[int]
    cost_repeats: int
    threads: int  # 0 = adaptive, decided once at the start


def resolve_settings(args: argparse.Namespace) -> BenchSettings:
    """Fail on a bad flag before a minute is spent loading models."""
    table = method_table()
    d = QUICK if args.quick else FULL
    families = [f.strip() for f in args.methods.split(",") if f.strip()]
    unknown = [f for f in families if f not in table]
    if unknown:
        raise ConfigError(f"unknown method(s) {unknown} in --methods; known: {', '.join(table)}")
    baseline = baseline_family()
    if baseline not in families:
        families.insert(0, baseline)  # the baseline every speedup and exact-match check is relative to
    gammas, auto = parse_gammas(args.gammas or d.gammas)
    if auto:  # 'auto' in --gammas: each swept family's gamma='auto' companion
        families += [c for f in list(families) if (c := table[f].with_auto) and c not in families]
    s = BenchSettings(
        families=families,
        gammas=gammas,
        auto_gamma=auto,
        lookup_tokens=parse_int_list(args.lookup_tokens or d.lookup_tokens, "--lookup-tokens"),
        peer_gammas=parse_int_list(args.peer_gammas or d.peer_gammas, "--peer-gammas"),
        reps=args.reps if args.reps is not None else d.reps,
        per_category=_per_category(args, d),
        max_new_tokens=args.max_new_tokens if args.max_new_tokens is not None else d.max_new_tokens,
        cost_repeats=args.cost_repeats if args.cost_repeats is not None else d.cost_repeats,
        threads=args.threads if args.threads is not None else (1 if args.quick else 0),
    )
    if s.threads < 0:
        raise ConfigError(f"--threads must be >= 0 (0 = adaptive), got {s.threads}")
    for name, value in (("--reps", s.reps), ("--cost-repeats", s.cost_repeats),
                        ("--per-category", s.per_category), ("--max-new-tokens", s.max_new_tokens)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    return s


def _per_category(args: argparse.Namespace, d: Defaults) -> Optional[int]:
    """--per-category, 'all' (0) meaning every prompt; the real workload's default keeps a full run in hours."""
    if args.per_category is not None:
        return args.per_category or None
    if d is FULL and getattr(args, "workload", None) == "real":
        return REAL_PER_CATEGORY
    return d.per_category


def adaptive_threads() -> int:
    """All our cores when nothing else runs, else 1: on a contended CPU a multi-threaded op waits for
    its descheduled sibling (we measured plain decoding 5-10x slower with 2 threads than with 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores if os.getloadavg()[0] < 0.75 else 1


def ours_look_up(families: Sequence[str]) -> bool:
    """Whether one of our methods sweeps --lookup-tokens (then llama.cpp's lookup decoding runs beside it)."""
    table = method_table()
    return any(table[f].sweep == "lookup_tokens" and table[f].runtime == OursMethod.runtime for f in families)


def own_draft_dest(drafter: str) -> str:
    return "own_draft_" + drafter.replace("-", "_")


def own_drafts(args: argparse.Namespace, load: Any) -> dict[str, Any]:
    """Each own-tokenizer drafter's --<name>-draft model, loaded (absent: it takes --draft)."""
    paths = {n: getattr(args, own_draft_dest(n), None) for n, s in REGISTRY.items() if s.own_tokenizer}
    return {n: load(p) for n, p in paths.items() if p}


def _draft_families() -> set[str]:
    """The bench families of drafters that need a draft model."""
    return {b.family for b in bench_families() if get_spec(b.drafter).needs_draft_model}


def _peer_source(target: str) -> Path:
    """What --target names on disk (a catalogued name resolves to its GGUF), for choosing llama.cpp's formats."""
    try:
        return resolve_model_path(target)
    except Exception:  # loading the target reports it properly a moment later
        return Path(target)


def cmd_bench(args: argparse.Namespace) -> int:
    started = time.time()
    st = resolve_settings(args)
    peer_build = llamacpp.locate(args.llama_cpp) if args.llama_cpp else None  # a bad path fails before loading
    gammas, lookup_tokens, peer_gammas, reps = st.gammas, st.lookup_tokens, st.peer_gammas, st.reps
    sampling = from_args(SamplingConfig, args)
    families = list(st.families)
    if not sampling.greedy:  # sampled: e.g. token-by-token beside block verification (the default)
        specs = method_table()
        families += [c for f in list(families) if (c := specs[f].with_sampling) and c not in families]
    torch.set_num_threads(st.threads or adaptive_threads())
    threads = torch.get_num_threads()

    artifacts = artifacts_from_args(args)  # a bad artifact flag fails before loading
    workload_path = resolve_workload(args.workload)
    args.stop_at_eos = stop_at_eos(args.stop_at_eos, args.workload, bool(args.llama_cpp))
    workloads = select(load_workloads(workload_path), st.per_category, st.max_new_tokens)
    target_path = resolve_target(args)
    # the bundled pair unless --target is given; then, for the draft methods, the one trained for it (drafters/model/)
    draft_path = resolve_draft_path(args, needed=not args.target, wanted=bool(set(families) & _draft_families()))
    peer_source = str(_peer_source(target_path))  # checked before loading
    peer_formats = llamacpp_gguf.parse_formats(args.llama_cpp_formats or llamacpp_gguf.default_formats(peer_source),
                                               llamacpp_gguf.is_gguf_path(peer_source))
    load_before = os.getloadavg()[0]
    if load_before > (os.cpu_count() or 1):
        print(f"warning: the machine is busy (load average {load_before:.1f} on {os.cpu_count()} CPUs): timings will "
              f"be noisy, and more so with several torch threads (running on {threads}).", file=sys.stderr)
    out_dir = Path(args.out or Path("runs") / f"bench-{dt.datetime.now():%Y%m%d-%H%M%S}")
    out_dir.mkdir(parents=True, exist_ok=True)

    load = model_loader(from_args(ModelLoadConfig, args))
    target = load(target_path)
    draft = load(draft_path) if draft_path else None
    memory: dict[str, Any] = {"after_loading_mib": _maxrss_mib()}
    ctx = BenchContext(target, draft, str(target.path), str(draft.path) if draft else None,
                       ignore_eos=not args.stop_at_eos, draft_vocab=args.draft_vocab, sampling=sampling,
                       options=options_from_args(args), artifacts=artifacts, own_drafts=own_drafts(args, load),
                       auto_draft=bool(args.draft) or not args.target)  # as generate's auto: no draft found beside
    methods, skipped = build_methods(ctx, families, {"gammas": gammas, "lookup_tokens": lookup_tokens,
                                                     "peer_gammas": peer_gammas})
    peer_files: dict[str, str] = {}
    if peer_build is not None:
        peer_methods, peer_skipped, peer_files = llamacpp_gguf.build_methods(
            peer_build, target, draft, peer_formats, peer_gammas, lookup_tokens if ours_look_up(families) else [],
            threads, sampling, log=sys.stderr)
        methods += peer_methods
        skipped += peer_skipped
    memory["after_loading_peers_mib"] = _maxrss_mib()
    prompts, template_info = prepare_real_prompts(workloads, target, draft)  # chat records in the target's template
    window = min(target.max_seq_len, draft.max_seq_len) if draft else target.max_seq_len
    for p in prompts:
        if p.truncated or p.max_new_tokens < p.requested_new_tokens:
            print(f"note: {p.workload.id}: the context window ({window} tokens) is too small: prompt cut by "
                  f"{p.truncated} tokens, budget {p.requested_new_tokens} -> {p.max_new_tokens} new tokens",
                  file=sys.stderr)

    print(f"bench: {len(methods)} methods x {len(prompts)} prompts x {reps} reps on {threads} threads "
          f"({target.name} + {draft.name if draft else 'no draft'}) -> {out_dir}", file=sys.stderr)
    per_method_rss: dict[str, float] = {}
    failures = []
    for m in methods:
        failures += warm_up([m], prompts[0])
        per_method_rss[m.name] = _maxrss_mib()
    healthy = [m for m in methods if m.name not in {f.method for f in failures}]
    llamacpp.start_timed_runs(healthy)
    with tqdm(total=len(healthy) * len(prompts) * reps, desc="bench", unit="run", file=sys.stderr,
              disable=args.no_progress) as bar:
        records, run_failures = run_all(healthy, prompts, reps, bar)
    failures += run_failures
    memory["peak_rss_mib"] = _maxrss_mib()
    # v up to the widest pass any method verified: a tree or an auto γ has no setting to read it from
    widest = max([m.setting or 0 for m in methods] + [d for r in records for d, _ in r.output.steps or []] + [1])
    longest = max(prompts, key=lambda p: len(p.ids))
    mean_len = int(sum(len(p.ids) for p in prompts) / len(prompts))
    costs = measure_costs(target, draft, max_gamma=widest, reps=st.cost_repeats, draft_head=ctx.draft_head(),
                          context=longest.ids[:mean_len] or longest.ids)
    memory["peak_rss_after_each_warmup_mib"] = per_method_rss

    summary = summarize(records, methods, skipped, failures, prompts, costs, greedy=sampling.greedy)
    table = format_table(summary)
    peer_rows = llamacpp.comparison(summary, target.weight_format, methods) if peer_build else []
    peer_best = llamacpp.best_by_category(summary) if peer_build else []
    if peer_build is None:
        table += f"\nllama.cpp: {llamacpp.NOT_RUN}"
    if peer_rows:
        table += "\n\n" + llamacpp.format_comparison(peer_rows, target.weight_format)
    if peer_best:
        table += "\n\n" + llamacpp.format_best_by_category(peer_best)
    print(table)
    config = {
        "command": sys.argv, "started": dt.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        "duration_s": None, "git_commit": _git_commit(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        "threads": threads, "load_average_start_end": [load_before, os.getloadavg()[0]],
        "device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
        "versions": _versions(), "kernels": target.kernels.describe(),
        "weight_dtype": target.weight_format, "target": str(target.path), "draft": str(draft.path) if draft else None,
        "target_parameters": target.num_parameters(), "draft_parameters": draft.num_parameters() if draft else None,
        "workload_file": str(workload_path),
        "workload_sha1": hashlib.sha1(workload_path.read_bytes()).hexdigest(), **template_info,
        "methods": families, "gammas": gammas, "lookup_tokens": lookup_tokens, "peer_gammas": peer_gammas,
        "drafter_options": with_defaults(DrafterOptions(options=options_from_args(args))).options,
        "artifacts": artifacts, "reps": reps, "quick": args.quick,
        "ignore_eos": not args.stop_at_eos, "greedy": sampling.greedy, "sampling": dataclasses.asdict(sampling),
        "speedup_definition": "mean over prompts of tokens/s (prefill included) / same mean for 'plain', "
                              "per repetition; mean ± std over repetitions",
    }
    plots: list[str] = []
    if not args.no_plots:
        plots = [p.name for p in write_plots(summary, out_dir)]
    config["duration_s"] = round(time.time() - started, 1)
    payload = {
        "config": config, "costs": costs.to_dict(), "memory": memory,
        "workloads": [{"id": p.workload.id, "category": p.workload.category, "source": p.workload.source,
                       "prompt_tokens": len(p.ids), "max_new_tokens": p.max_new_tokens,
                       "requested_new_tokens": p.requested_new_tokens, "prompt_tokens_cut": p.truncated}
                      for p in prompts],
        **summary,
        "failures": [f.__dict__ for f in failures],
        "runs": [{"method": r.method, "workload": r.workload, "category": r.category, "rep": r.rep,
                  "new_tokens": len(r.output.token_ids),
                  "seconds": r.output.seconds, "prefill_seconds": r.output.prefill_seconds} for r in records],
        "plots": plots,
        "llama_cpp": ({**peer_build.describe(), "formats": peer_formats, "gammas": peer_gammas, "threads": threads,
                       "gguf": peer_files, "comparison": peer_rows,
                       "best_by_category": peer_best} if peer_build else {"status": llamacpp.NOT_RUN}),
    }
    payload = finite(payload)
    write_json(out_dir / "bench.json", payload)
    (out_dir / "table.txt").write_text(table + "\n")
    (out_dir / "results.md").write_text(format_markdown(payload, table))
    print(f"\nwrote {out_dir / 'bench.json'}, table.txt, results.md{', ' + ', '.join(plots) if plots else ''} "
          f"in {config['duration_s']:.0f}s", file=sys.stderr)
    return 0  # mismatches are findings to read, printed above, not a crash
