"""v(n) of the target's verify pass for each code path of the bf16 kernel, interleaved in one process.

A pass over n new tokens costs v(n) one-token passes (``costmodel.measure_costs``: tokens appended to a
prefilled cache, logits read back, rolled back). Past a few tokens a small model's pass is bound by
arithmetic, so the kernel's multiply-add rate sets how fast v(n) rises, and with it how large a draft
tree can pay. This times the passes with each ISA the kernel offers here (``avx512bf16``: vdpbf16ps on
the stored bf16 weights; ``avx512`` / ``avx2``: the weights widened to fp32 and FMAs), the ISAs
alternating round by round, and prints the median seconds per pass and v(n).

    python scripts/verify_cost_by_isa.py --target models/code-target --max-tokens 17 --rounds 4
"""

from __future__ import annotations

import argparse
import statistics

import torch

import specdecode
from specdecode.costmodel import measure_costs
from specdecode.kernels import set_kernel_isa, supported_isas


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--max-tokens", type=int, default=17, help="largest pass timed, in new tokens")
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--isas", default=None, help="comma-separated (default: every SIMD path this CPU has)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    isas = args.isas.split(",") if args.isas else [i for i in supported_isas() if i != "scalar"]
    target = specdecode.load_model(args.target)
    context = [(300 + i) % target.vocab_size for i in range(args.context)]
    times: dict[str, list[tuple[float, ...]]] = {i: [] for i in isas}
    for r in range(args.rounds):
        for isa in isas if r % 2 == 0 else list(reversed(isas)):
            set_kernel_isa(isa)
            c = measure_costs(target, None, max_gamma=args.max_tokens - 1, reps=5, context=context)
            times[isa].append(tuple(c.target_s))
    set_kernel_isa("auto")
    print(f"{target.name}, {args.context}-token context, {args.threads} thread(s), median of {args.rounds} rounds")
    print("new tokens " + " ".join(f"{n:>6d}" for n in range(1, args.max_tokens + 1)))
    med = {i: [statistics.median(t[n] for t in times[i]) for n in range(args.max_tokens)] for i in isas}
    for isa in isas:
        print(f"{isa + ' ms':10s} " + " ".join(f"{m * 1e3:6.2f}" for m in med[isa]))
        print(f"{'  v(n)':10s} " + " ".join(f"{m / med[isa][0]:6.2f}" for m in med[isa]))


if __name__ == "__main__":
    main()
