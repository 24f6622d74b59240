"""Decode-step speed and verification cost v(k) per weight format and thread count (no prefill in it).

For each ``--weight-dtype`` and ``--threads`` value: the median single-token decode step with a warm
KV cache (``costmodel.measure_costs``, the numbers ``gamma="auto"`` uses), as tok/s, and
v(k) = time of a pass over k + 1 new tokens / time of a one-token pass. With ``--drafter-c`` also
c of the int4 self-draft (``--drafter quant``) against each format's target.

    python scripts/quant_speed.py --target runs/qwen05b-shape [--formats bf16,int8,int4] [--threads 1,2]

Goals (issue 14, 0.5B shape): int8 / int4 tok/s against llama.cpp's Q8_0 / Q4_0 ``llama-bench`` tg
figures at the same thread counts; v(4) <= 1.3 on int8. Timings on a busy CPU are noise.
"""

from __future__ import annotations

import argparse
import json

import torch

from specdecode.costmodel import measure_costs
from specdecode.models import load_model
from specdecode.models.loading import quantized_copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--formats", default="bf16,int8,int4")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--drafter-c", action="store_true", help="also measure c of the int4 self-draft")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print(f"{'format':<8}{'threads':>8}{'step ms':>9}{'tok/s':>8}   v(1..5){'':<22}{'c(int4 draft)':>14}")
    for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
        model = load_model(args.target, weight_dtype=fmt)
        copy = quantized_copy(model, "int4") if args.drafter_c else None
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            costs = measure_costs(model, copy, max_gamma=5, reps=args.reps)
            step = costs.target_s[0]
            row = {"format": model.weight_format, "threads": threads, "step_s": step, "tok_s": 1 / step,
                   "v": list(costs.v[1:6]), "c": costs.c if copy is not None else None,
                   "kernels": model.kernels.describe()}
            rows.append(row)
            c = f"{row['c']:.3f}" if row["c"] is not None else "-"
            print(f"{row['format']:<8}{threads:>8}{1e3 * step:>9.2f}{1 / step:>8.1f}   "
                  f"{' '.join(f'{v:.2f}' for v in row['v']):<29}{c:>14}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
