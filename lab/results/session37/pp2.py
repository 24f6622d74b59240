"""Attention walks A/B in one process: passes of n tokens alternating avx2 / avx512 (the same bits), medians."""
import sys, time, statistics, torch
torch.set_num_threads(1)
from specdecode.models.loading import load_model
from specdecode.kernels.fused import load_fused_extension
ext = load_fused_extension()
t = load_model(sys.argv[1]); ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 512
ids = torch.randint(100, 30000, (1, ctx), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    c = t.new_cache(1, ctx + 16); t.forward(ids, c, last_only=True)
    for n in (1, 5, 9):
        probe = ids[:, :n]; ts = {"avx2": [], "avx512": []}
        for k in range(2 * (60 if n == 1 else 30)):
            isa = "avx2" if k % 2 == 0 else "avx512"; ext.set_attention_isa(isa)
            a = time.perf_counter(); float(t.forward(probe, c)[0, -1, 0]); ts[isa].append(time.perf_counter() - a); c.trim(n)
        m = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
        print(f"ctx={ctx} n={n}: avx2 {m['avx2']:.2f} ms  avx512 {m['avx512']:.2f} ms  ratio {m['avx2']/m['avx512']:.3f}", flush=True)
