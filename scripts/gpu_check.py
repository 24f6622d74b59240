"""The GPU check to run whenever a GPU is lent (issue 26): about two minutes on one GPU.

    PYTHONPATH=src python3 scripts/gpu_check.py [--device cuda] [--target DIR_OR_GGUF] [--out FILE]

1. Greedy identity on the device: every drafter that needs no GPU-only kernel, against plain
   decoding of the same target, bf16 and fp32 (a speedup that changes a token is a bug).
2. Plain against speculative tokens/s on the target (the bundled pair by default; a real model where
   one fits the device tool's 64 MiB transfer: SmolLM2's 98 MB GGUF does not, so pass a path that
   exists on that machine).
3. The results as one JSON object (stdout, and --out), with the device's name.

It runs on the CPU too (`--device cpu`), which is how it is checked where no GPU is lent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["def fib(n):", "class Stack:\n    def __init__(self):", "import os\n\ndef walk(path):"]


def main() -> int:
    import specdecode
    from specdecode.drafters import DrafterOptions, build_drafter

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--target", default=str(ROOT / "models" / "code-target"))
    ap.add_argument("--draft", default=str(ROOT / "models" / "code-draft"))
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    report: dict[str, object] = {"device": args.device, "torch": torch.__version__,
                                 "name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    failures = 0
    for dtype in ("bf16", "fp32"):
        target = specdecode.load_model(args.target, device=args.device, dtype=dtype)
        draft = specdecode.load_model(args.draft, device=args.device, dtype=dtype) if Path(args.draft).exists() else None
        drafters = {"ngram": DrafterOptions(gamma=4), "suffix": DrafterOptions(gamma=4)}
        if draft is not None:
            drafters["model"] = DrafterOptions(draft=draft, gamma=4)
        rows = {}
        for name, opts in {"none": None, **drafters}.items():
            same = True
            for p in PROMPTS:  # identity first (this also warms every path up before the timed pass)
                plain = specdecode.generate(target, p, max_new_tokens=args.tokens, ignore_eos=True)
                if opts is not None:
                    r = specdecode.generate(target, p, drafter=build_drafter(name, opts),
                                            max_new_tokens=args.tokens, ignore_eos=True)
                    same &= r.token_ids == plain.token_ids
            rows[name] = {"greedy_identical": same}
            failures += not same
        for name in rows:  # speed: one timed pass per method after the identity pass warmed it up
            opts = None if name == "none" else drafters[name]
            t0 = time.perf_counter()
            n = sum(len(specdecode.generate(target, p, drafter=None if opts is None else build_drafter(name, opts),
                                            max_new_tokens=args.tokens, ignore_eos=True).token_ids) for p in PROMPTS)
            if args.device == "cuda":
                torch.cuda.synchronize()
            rows[name]["tok_s"] = n / (time.perf_counter() - t0)
        base = rows["none"]["tok_s"]
        for r in rows.values():
            r["speedup"] = r["tok_s"] / base
        report[dtype] = rows
    report["ok"] = failures == 0
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
