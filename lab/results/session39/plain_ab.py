import sys, time, torch
torch.set_num_threads(1)
import specdecode
name = sys.argv[1]
tgt = specdecode.load_model(name, **({"weight_dtype": "bf16"} if "smollm" in name else {}))
specdecode.generate(tgt, "def fib(n):", max_new_tokens=16)
best = []
for _ in range(3):
    t0 = time.perf_counter(); r = specdecode.generate(tgt, "def quicksort(xs):", max_new_tokens=128, ignore_eos=True); dt = time.perf_counter() - t0
    best.append(len(r.token_ids) / dt)
print(name.split("/")[-1], tgt.kernels.linear.__name__, "tok/s", round(max(best), 1), round(sorted(best)[1], 1), hash(tuple(r.token_ids)) % 10**8)
