"""What Medusa's heads cost right after a target pass, dense against int8 (Q8_0) weights.

Each round runs a one-token target pass, then the heads (all K, with their top candidates) for
each format in turn, so the heads' weights come from memory as they do when the core drafts.
Prints medians in milliseconds and as a fraction of the one-token pass, and whether the two
formats' top-1 candidates agree.

    python scripts/draft_head_cost.py --rounds 60
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specdecode
from specdecode.drafters.medusa import MedusaDrafter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--heads", default="models/code-medusa")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = specdecode.load_model(args.target)
    heads = {"dense": MedusaDrafter.load(args.heads, quant=None), "int8": MedusaDrafter.load(args.heads, quant="int8")}
    for d in heads.values():
        d.prepare_rows(target, 1, 512)
    ids = torch.tensor([[i % target.vocab_size for i in range(200)]])
    cache = target.new_cache(1, 300)
    with torch.inference_mode():
        h = target.run(ids, cache, return_hidden=True).hidden[0, -1:]
        times: dict[str, list[float]] = {"target pass": [], **{k: [] for k in heads}}
        for r in range(args.rounds):
            for name, d in (heads.items() if r % 2 == 0 else reversed(heads.items())):
                t0 = time.perf_counter()
                float(target.run(ids[:, :1], cache).logits[0, -1, 0])
                cache.trim(1)
                t1 = time.perf_counter()
                d.candidates(h).tolist()
                times[name].append(time.perf_counter() - t1)
                times["target pass"].append(t1 - t0)
        top = {k: d.candidates(h)[..., 0].tolist() for k, d in heads.items()}
    one = statistics.median(times["target pass"])
    for name, t in times.items():
        print(f"{name:12s} {statistics.median(t) * 1e3:7.3f} ms  {statistics.median(t) / one:.3f} of a target pass")
    print(f"runtime formats: {', '.join(f'{k} -> {d.runtime}' for k, d in heads.items())}; "
          f"top-1 candidates per head equal: {top['dense'] == top['int8']}")


if __name__ == "__main__":
    main()
