"""Gemma 3 270M's layer matrices (q 1024x640, k and v 256x640, o 640x1024, gate and up 2048x640, down 640x2048),
18 layers of random weights in one format, one token row, 1 thread: ms a pass over all of them (min, median of 30)."""
import sys, time, statistics
import torch
torch.set_num_threads(1)
from specdecode.bench.kernel_ab import random_packed
from specdecode.kernels.quant import load_quant_extension
ext = load_quant_extension()
fmt = sys.argv[1]
isa = sys.argv[2] if len(sys.argv) > 2 else None
g = torch.Generator().manual_seed(0)
shapes = [(1024, 640), (256, 640), (256, 640), (640, 1024), (2048, 640), (2048, 640), (640, 2048)]
if fmt in ("q4k", "q5k", "q6k"):
    shapes = [(n, k) for n, k in shapes if k % 256 == 0]
mats = [(random_packed(n, k, fmt, g), torch.randn(1, k, generator=g)) for _ in range(18) for n, k in shapes]
ts = []
for _ in range(30):
    t0 = time.perf_counter()
    for w, x in mats:
        ext.quant_linear(x, w, None, isa, None)
    ts.append(time.perf_counter() - t0)
print(f"{fmt}: {len(mats)} matrices, min {min(ts)*1e3:.3f} ms, median {statistics.median(ts)*1e3:.3f} ms")
