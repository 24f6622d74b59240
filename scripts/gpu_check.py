"""The GPU check to run whenever a GPU is lent (issue 26): about eight minutes on one H200.

    PYTHONPATH=src python3 scripts/gpu_check.py [--device cuda] [--real GGUF_OR_NAME] [--out DIR]

1. **Greedy identity on the device**, for each target given (the bundled pair when its weights are here,
   and ``--real``, e.g. SmolLM2's GGUF), in each of ``--dtypes``: every drafter that can be built from what
   lies beside the target, against plain decoding, on the real workload's prompts with the chat template
   where the target has one. Plain decoding runs every round, so a run-to-run difference is told apart from a
   speculative one (``plain_repeatable``).
2. **Plain against speculative tokens/s** on those prompts, same process, ``--reps`` rounds (3) of plain and
   every drafter in turn; on CUDA with and without CUDA graphs (``--graphs``, ``models/graphs.py``); the eager
   step's ``aten::`` operators (``bench ops``); one table per target in ``speed.md``.
3. **CUDA tests**: the drafter conformance suite with its models on the device, in each of
   ``--test-dtypes`` (`pytest tests/conformance --device cuda --dtype D`, both tiers): every registered
   drafter's greedy identity, batched rows, a streaming server request, bench methods, errors, and the
   chi-square output law (about four minutes a dtype on an H200 with 8 workers); and the fixed-shape tests,
   whose CUDA case checks captured passes against eager ones.
4. **vLLM**: whether it imports there; only then could it load our EAGLE export.
5. ``--profile``: where plain decoding's time goes, per target (torch.profiler over one prompt, after the
   warm-up): ``profile-<dtype>-graphs-<on|off>.txt``, operators by their own host time, and the report's
   host/device totals. Why: CUDA graphs were no faster in session 27, and nothing said why.

``docs/gpu.md`` says how the real model and the wheels travel to a lent machine and what the last run found.

Writes one JSON object (stdout, and ``--out``/gpu_check.json) with the device's name; exit 1 if a test
failed or an output differed. Each drafter's failure is recorded and the check goes on.
It runs on the CPU too (``--device cpu``), which is how it is checked where no GPU is lent.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
CODE_PROMPTS = ["def fib(n):", "class Stack:\n    def __init__(self):", "import os\n\ndef walk(path):"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cuda_tests(device: str, dtype: str, out: Path, workers: int) -> dict[str, Any]:
    """The conformance suite on ``device`` in ``dtype``; counts and the first failures from its JUnit report."""
    xml = out / f"tests-{dtype}.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/conformance", "tests/models/test_fixed_rows.py", "--device", device,
           "--dtype", dtype, "-q",
           "-p", "no:cacheprovider", f"--junitxml={xml}"] + (["-n", str(workers)] if workers > 1 else [])
    if importlib.util.find_spec("pytest_timeout"):
        cmd.append("--timeout=240")  # a hung test fails alone, not the whole check
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    (out / f"tests-{dtype}.log").write_text(proc.stdout + proc.stderr)
    result: dict[str, Any] = {"command": " ".join(cmd[1:]), "returncode": proc.returncode,
                              "seconds": round(time.perf_counter() - t0, 1), "tail": proc.stdout[-600:]}
    if xml.is_file():
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        result.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
        bad = [(c, c.find("failure") if c.find("failure") is not None else c.find("error"))
               for c in suite.iter("testcase")]
        result["failed"] = [{"test": c.get("name"), "why": (e.get("message") or e.text or "")[:300]}
                            for c, e in bad if e is not None][:20]
    return result


Prompt = tuple[str, str, list[int], int]  # id, category, token ids, budget
Runs = list[tuple[list[int], float, int]]  # per prompt: tokens, seconds, target passes


def prompts_for(target: Any, tokens: int, per_category: int) -> list[Prompt]:
    """The real workload rendered with the chat template, or code prompts for a target without one."""
    if getattr(target, "chat_template", None):
        from specdecode.bench.real import prepare_real_prompts
        from specdecode.bench.workloads import load_workloads, resolve_workload, select

        chosen = select(load_workloads(resolve_workload("real")), per_category, tokens)
        prepared, _ = prepare_real_prompts(chosen, target, None)
        return [(p.workload.id, p.workload.category, p.ids, p.max_new_tokens) for p in prepared]
    return [(f"code-{i}", "code", target.encode(p), tokens) for i, p in enumerate(CODE_PROMPTS)]


def timed(target: Any, prompts: list[Prompt], drafter: Any, device: str, stop_at_eos: bool) -> Runs:
    from specdecode import generate

    runs = []
    for _, _, ids, budget in prompts:
        t0 = time.perf_counter()
        r = generate(target, ids, drafter=drafter, max_new_tokens=budget, ignore_eos=not stop_at_eos)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        runs.append((r.token_ids, time.perf_counter() - t0, r.stats.target_passes))
    return runs


def rates(prompts: list[Prompt], *runs: Runs) -> dict[str, float]:
    """tok/s per category and overall, over one or more passes of the prompts."""
    cats = [p[1] for p in prompts]
    out = {}
    for cat in list(dict.fromkeys(cats)) + ["overall"]:
        picked = [r for rs in runs for c, r in zip(cats, rs) if cat in (c, "overall")]
        out[cat] = round(sum(len(t) for t, _, _ in picked) / sum(s for _, s, _ in picked), 1)
    return out


def profile_plain(target: Any, prompt: Prompt, device: str, stop_at_eos: bool, out: Path) -> dict[str, Any]:
    """Plain decoding of one prompt under torch.profiler: the operator table goes to ``out``; returns the
    wall time and the host and device totals, so a step's split between Python, launches and kernels shows."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        (tokens, _, _), = timed(target, [prompt], None, device, stop_at_eos)
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    out.write_text(events.table(sort_by="self_cpu_time_total", row_limit=40))
    device_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in events)
    return {"prompt": prompt[0], "tokens": len(tokens), "wall_s": round(wall, 3),
            "host_ops_s": round(sum(e.self_cpu_time_total for e in events) / 1e6, 3),
            "device_kernels_s": round(device_us / 1e6, 3), "table": out.name}


def check_target(path: str, draft_path: Optional[str], device: str, dtype: str, graphs: bool, tokens: int,
                 per_category: int, stop_at_eos: bool, reps: int, profile_dir: Optional[Path] = None
                 ) -> dict[str, Any]:
    """Every buildable drafter against plain decoding of ``path``: identity first, then tok/s (per category),
    ``reps`` rounds of plain and every drafter in turn, in one process; the eager step's operators."""
    import specdecode
    from specdecode.bench.ops import per_step
    from specdecode.drafters import DrafterOptions
    from specdecode.drafters.registry import PLAIN, REGISTRY, build_drafter, missing, resolve_artifacts

    t0 = time.perf_counter()
    # the CPU's quantized kernels need fp32 activations: there a bf16/fp16 check reads dense weights of its dtype
    weights = dtype if device == "cpu" and dtype not in ("fp32", "auto") else "auto"
    target = specdecode.load_model(path, device=device, dtype=dtype, weight_dtype=weights, cuda_graphs=graphs)
    draft = specdecode.load_model(draft_path, device=device, dtype=dtype, cuda_graphs=graphs) if draft_path else None
    report: dict[str, Any] = {"target": path, "draft": draft_path, "dtype": dtype, "fixed_rows": target.fixed_rows,
                              "cuda_graphs": graphs, "stop_at_eos": stop_at_eos, "reps": reps,
                              "load_s": round(time.perf_counter() - t0, 1)}
    prompts = prompts_for(target, tokens, per_category)
    report["prompts"] = [p[0] for p in prompts]
    timed(target, prompts[:1], None, device, stop_at_eos)  # warm-up (and, with graphs, the captures)
    step = per_step(target, 16)  # the eager step's aten:: operators (a GPU step's launches) and host time
    report["step"] = {k: step[k] for k in ("aten_per_step", "gemm_per_step", "host_ms_per_step")}
    if profile_dir is not None:
        report["profile"] = profile_plain(target, prompts[0], device, stop_at_eos,
                                          profile_dir / f"profile-{dtype}-graphs-{'on' if graphs else 'off'}.txt")
    rows: dict[str, Any] = {}
    drafters: dict[str, Any] = {}
    artifacts = resolve_artifacts({}, None, path)
    for name, spec in REGISTRY.items():
        if name == PLAIN:
            continue
        opts = DrafterOptions(draft=draft if (spec.needs_draft_model or spec.uses_draft_model) else None,
                              gamma="auto", artifacts=artifacts)
        why = missing(name, opts)
        if why:
            rows[name] = {"skipped": why[:200]}
            continue
        try:
            drafters[name] = build_drafter(name, opts)
            timed(target, [prompts[0][:3] + (16,)], drafters[name], device, stop_at_eos)  # warm-up: its costs
        except Exception as e:  # recorded, and the check goes on with the next drafter
            rows[name] = _failure(e)
            drafters.pop(name, None)
    runs: dict[str, list[Runs]] = {PLAIN: [], **{n: [] for n in drafters}}
    for rep in range(reps):  # plain and every drafter in turn, so a slow patch of the machine hits them alike
        for name in runs:
            if name in rows:
                continue
            log(f"{Path(path).name} {dtype}: {name} ({rep + 1}/{reps})")
            try:
                runs[name].append(timed(target, prompts, drafters.get(name), device, stop_at_eos))
            except Exception as e:
                rows[name] = _failure(e)
    plain = runs.pop(PLAIN)
    base = rates(prompts, *plain)
    report["plain_tok_s"] = base
    report["plain_rounds"] = [rates(prompts, r)["overall"] for r in plain]
    report["plain_repeatable"] = all([x[0] for x in r] == [x[0] for x in plain[0]] for r in plain)
    for name, done in runs.items():
        if name in rows:
            continue
        differing = sorted({p[0] for r in done for p, x, y in zip(prompts, r, plain[0]) if x[0] != y[0]})
        tok_s = rates(prompts, *done)
        rows[name] = {"greedy_identical": not differing, "differing_prompts": differing, "tok_s": tok_s,
                      "rounds": [rates(prompts, r)["overall"] for r in done],
                      "speedup": {c: round(v / base[c], 3) for c, v in tok_s.items()},
                      "tau": round(sum(len(t) for r in done for t, _, _ in r)
                                   / max(sum(n for r in done for _, _, n in r), 1), 2)}
    report["drafters"] = rows
    report["table"] = speed_table(report)
    return report


def _failure(e: Exception) -> dict[str, str]:
    return {"error": f"{type(e).__name__}: {e}"[:400], "where": "".join(traceback.format_exception(e)[-3:])[-800:]}


def speed_table(report: dict[str, Any]) -> str:
    """One markdown table: plain and each drafter, overall tok/s over the rounds (each round's in brackets),
    the speedup, τ and whether greedy output was identical to plain's."""
    def rounds(xs: list[float]) -> str:
        return ", ".join(f"{x:.1f}" for x in xs)
    lines = ["| method | tok/s (rounds) | speedup | τ | identical |", "|---|---|---|---|---|",
             f"| plain | {report['plain_tok_s']['overall']} ({rounds(report['plain_rounds'])}) | 1.00 | 1.00 | "
             f"{'yes' if report['plain_repeatable'] else 'NO (plain varies)'} |"]
    for name, r in report["drafters"].items():
        if "tok_s" in r:
            lines.append(f"| {name} | {r['tok_s']['overall']} ({rounds(r['rounds'])}) | {r['speedup']['overall']:.2f} "
                         f"| {r['tau']} | {'yes' if r['greedy_identical'] else 'NO'} |")
        else:
            lines.append(f"| {name} | {r.get('skipped') or r.get('error')} | | | |")
    step = report["step"]
    lines.append(f"\nEager step: {step['aten_per_step']} aten:: operators ({step['gemm_per_step']} GEMMs), "
                 f"{step['host_ms_per_step']} ms host (profiler on).")
    prof = report.get("profile")
    if prof and prof["wall_s"] > 0:
        lines.append(f"Profiled prompt: device busy {prof['device_kernels_s'] / prof['wall_s']:.0%} of the wall time "
                     f"({prof['device_kernels_s']} of {prof['wall_s']} s; host ops {prof['host_ops_s']} s).")
    return "\n".join(lines)


def vllm_status() -> dict[str, Any]:
    """Whether vLLM imports here (it is not in the lent machine's image and cannot be fetched there)."""
    try:
        import vllm  # type: ignore[import-not-found]
    except Exception as e:
        return {"importable": False, "why": f"{type(e).__name__}: {e}"[:300]}
    return {"importable": True, "version": getattr(vllm, "__version__", "?")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--target", default=str(ROOT / "models" / "code-target"),
                    help="the bundled pair's target (skipped when its weights are absent)")
    ap.add_argument("--draft", default=str(ROOT / "models" / "code-draft"))
    ap.add_argument("--real", help="a real model: a GGUF path or a pulled name (smollm2-135m-instruct)")
    ap.add_argument("--dtypes", default="bf16,fp32", help="compute dtypes for every target")
    ap.add_argument("--test-dtypes", default="bf16", help="compute dtypes for the conformance suite")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--per-category", type=int, default=1, help="real-workload prompts per category")
    ap.add_argument("--stop-at-eos", action="store_true", help="stop each answer at its end (the bench's real "
                                                                "workload default); else every budget is used")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="pytest-xdist workers")
    ap.add_argument("--skip-tests", action="store_true", help="no CUDA test run")
    ap.add_argument("--graphs", default="both", choices=("both", "on", "off"),
                    help="on CUDA, run each target with CUDA graphs, without, or both (default: both)")
    ap.add_argument("--reps", type=int, default=3, help="rounds of plain and every drafter in turn (default: 3)")
    ap.add_argument("--profile", action="store_true", help="profile one prompt of plain decoding per target "
                                                           "(profile-*.txt in --out)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-check")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = args.device.startswith("cuda")
    report: dict[str, Any] = {"device": args.device, "torch": torch.__version__,
                              "name": torch.cuda.get_device_name() if cuda else "cpu", "targets": []}
    dtypes = args.dtypes.split(",")
    graph_modes = {"both": [True, False], "on": [True], "off": [False]}[args.graphs] if cuda else [False]
    runs: list[tuple[str, Optional[str], str, bool]] = []
    if (Path(args.target) / "model.safetensors").is_file():
        runs += [(args.target, args.draft if Path(args.draft).is_dir() else None, d, g) for d in dtypes
                 for g in graph_modes]
    else:
        report["bundled_pair"] = f"skipped: no weights at {args.target}"
    if args.real:
        runs += [(args.real, None, d, g) for d in dtypes for g in graph_modes]
    for path, draft, dtype, graphs in runs:
        log(f"target {path} ({dtype}, CUDA graphs {'on' if graphs else 'off'})")
        try:
            report["targets"].append(check_target(path, draft, args.device, dtype, graphs, args.tokens,
                                                  args.per_category, args.stop_at_eos, args.reps,
                                                  args.out if args.profile else None))
        except Exception as e:
            report["targets"].append({"target": path, "dtype": dtype, "cuda_graphs": graphs,
                                      "error": f"{type(e).__name__}: {e}"[:400],
                                      "where": "".join(traceback.format_exception(e)[-3:])[-800:]})
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    if not args.skip_tests:
        report["tests"] = {}
        for dtype in args.test_dtypes.split(","):
            log(f"conformance suite on {args.device}, {dtype}")
            report["tests"][dtype] = cuda_tests(args.device, dtype, args.out, args.workers)
            (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    report["vllm"] = vllm_status()
    rows = [r for t in report["targets"] for r in t.get("drafters", {}).values()]
    differs = any(not r.get("greedy_identical", True) for r in rows)
    broken = any("error" in t for t in report["targets"])
    report["ok"] = not differs and not broken and all(t["returncode"] == 0 for t in report.get("tests", {}).values())
    text = json.dumps(report, indent=1)
    print(text)
    tables = [f"## {Path(t['target']).name}, {t['dtype']}, CUDA graphs {'on' if t['cuda_graphs'] else 'off'}\n\n"
              f"{t['table']}" for t in report["targets"] if "table" in t]
    (args.out / "speed.md").write_text(f"# {report['name']}, torch {report['torch']}\n\n" + "\n\n".join(tables) + "\n")
    print("\n\n".join(tables))
    (args.out / "gpu_check.json").write_text(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
