"""Lab script (session 28): plain bf16 decoding of SmolLM2, AVX512_BF16 against AMX, alternating (A B A B ...),
one prompt, 1 thread; then a 9-token verification pass on each path. Prints tok/s per round and the medians."""

import statistics
import sys
import time

import torch

import specdecode as sd
from specdecode import kernels

torch.set_num_threads(1)
target = sd.load_model("smollm2-135m-instruct", weight_dtype="bf16")
prompt = "Explain in a few paragraphs how a hash table handles collisions."
n, rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 128, int(sys.argv[2]) if len(sys.argv) > 2 else 5
rates: dict[str, list[float]] = {"avx512bf16": [], "amx": []}
texts = {}
for r in range(rounds + 1):
    for isa in rates:
        kernels.set_kernel_isa(isa)
        t0 = time.perf_counter()
        out = sd.generate(target, prompt, max_new_tokens=n, ignore_eos=True)
        dt = time.perf_counter() - t0
        texts[isa] = out.token_ids
        if r:  # the first round warms both paths
            rates[isa].append(n / dt)
            print(r, isa, f"{n / dt:.1f} tok/s", flush=True)
for isa, xs in rates.items():
    print(isa, "median", f"{statistics.median(xs):.1f} tok/s", "min", f"{min(xs):.1f}", "max", f"{max(xs):.1f}")
print("amx / avx512bf16", f"{statistics.median(rates['amx']) / statistics.median(rates['avx512bf16']):.3f}")
print("same tokens on both paths:", texts["amx"] == texts["avx512bf16"])
