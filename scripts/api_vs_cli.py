"""The documented Python API against `specdecode generate`, each as a user runs it, in turns.

A: `specdecode generate --json` (the CLI, with its defaults).
B: a fresh Python process doing exactly what the README's API section shows:
   `load_model(target)`, `load_model(draft)`, `generate(target, prompt, drafter=DraftModelDrafter(draft))`.

Both report the tokens/s of their own `GenerationStats` (generated tokens over prefill + decode
time; model loading is not counted). Runs alternate A B A B ... so drift hits both alike; the
median of each and their ratio are printed, with the machine's ISA, and written as JSON.

    python scripts/api_vs_cli.py --runs 5 --tokens 256 --out docs/results/api_vs_cli.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECDECODE = str(Path(sys.executable).with_name("specdecode"))

API = """
import json, sys, torch
torch.set_num_threads(int(sys.argv[4]))
import specdecode
target = specdecode.load_model(sys.argv[1])
draft = specdecode.load_model(sys.argv[2])
prompt = open(sys.argv[3]).read()
r = specdecode.generate(target, prompt, drafter=specdecode.DraftModelDrafter(draft), max_new_tokens=int(sys.argv[5]),
                        ignore_eos=True)
print(json.dumps({"tokens_per_s": r.stats.tokens_per_s, "tokens": len(r.token_ids), "tau": r.stats.tau,
                  "kernels": target.kernels.describe() if hasattr(target, "kernels") else "build without per-model kernels"}))
"""


def run_cli(args: argparse.Namespace) -> dict:
    cmd = [SPECDECODE, "generate", "--json", "--target", args.target, "--draft", args.draft, "--prompt-file",
           args.prompt, "--max-new-tokens", str(args.tokens), "--ignore-eos"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=_env(args)).stdout
    stats = json.loads(out.strip().splitlines()[-1])["stats"]
    return {"tokens_per_s": stats["tokens_per_s"], "tokens": stats["generated_tokens"], "tau": stats["tau"]}


def run_api(args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-c", API, args.target, args.draft, args.prompt, str(args.threads), str(args.tokens)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=_env(args)).stdout
    return json.loads(out.strip().splitlines()[-1])


def _env(args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(args.threads)  # the CLI takes the thread count from the environment
    return env


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=str(ROOT / "models" / "code-target"))
    p.add_argument("--draft", default=str(ROOT / "models" / "code-draft"))
    p.add_argument("--prompt", default=str(ROOT / "examples" / "prompt.py"))
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--runs", type=int, default=5, help="pairs of runs (after one warm-up pair)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", help="write the result as JSON here")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from specdecode.costmodel import cpu_name
    from specdecode.kernels import kernel_isa

    run_cli(args), run_api(args)  # warm-up: extension builds, cost cache
    cli, api = [], []
    for i in range(args.runs):
        cli.append(run_cli(args))
        api.append(run_api(args))
        print(f"pair {i + 1}: cli {cli[-1]['tokens_per_s']:.1f} tok/s, api {api[-1]['tokens_per_s']:.1f} tok/s",
              file=sys.stderr)
    c = statistics.median(r["tokens_per_s"] for r in cli)
    a = statistics.median(r["tokens_per_s"] for r in api)
    result = {"cpu": cpu_name(), "isa": kernel_isa(), "threads": args.threads, "tokens": args.tokens,
              "cli_tokens_per_s": [r["tokens_per_s"] for r in cli], "api_tokens_per_s": [r["tokens_per_s"] for r in api],
              "cli_median": c, "api_median": a, "api_over_cli": a / c, "api_kernels": api[0].get("kernels")}
    print(f"{result['cpu']} ({result['isa']}), {args.threads} thread(s), {args.tokens} tokens, {args.runs} pairs")
    print(f"CLI  median {c:8.1f} tok/s")
    print(f"API  median {a:8.1f} tok/s   ({result['api_kernels']})")
    print(f"API / CLI   {a / c:8.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
