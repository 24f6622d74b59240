import os, sys, time, torch
torch.set_num_threads(1)
import specdecode
tgt = specdecode.load_model(sys.argv[1], **({"weight_dtype": "bf16"} if "smollm" in sys.argv[1] else {}))
ws = [p for n, p in tgt.module.named_parameters() if p.dim() == 2 and "embed" not in n]
lin = tgt.kernels.linear
Ms = [int(a) for a in os.environ.get("MS", "1,2,3,5,9").split(",")]
res = {M: [] for M in Ms}
xs = {M: {w.shape[1]: torch.randn(M, w.shape[1]) for w in ws} for M in Ms}
for r in range(7):
    for M in Ms:
        t0 = time.perf_counter()
        for w in ws:
            lin(xs[M][w.shape[1]], w)
        res[M].append(time.perf_counter() - t0)
t1 = sorted(res[1])[2]
print(lin.__name__, round(sum(w.numel() * w.element_size() for w in ws) / 1e6), "MB", " ".join(f"M{M}:{sorted(res[M])[2]*1e3:.2f}({sorted(res[M])[2]/t1:.2f})" for M in Ms))
