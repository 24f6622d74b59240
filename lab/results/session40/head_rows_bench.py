"""Gemma 3 270M's output matrix shape (262,144 x 640, int8), 1-8 token rows, 1 thread, the CPU's default streams:
min ms of 30 calls per row count, for whichever build PYTHONPATH points at."""
import time
import torch
torch.set_num_threads(1)
from specdecode.kernels.quant import quantize, load_quant_extension
ext = load_quant_extension()
torch.manual_seed(0)
w = quantize(torch.randn(262144, 640) * 0.02, "int8")
out = []
for m in (1, 2, 3, 5, 8, 9):
    x = torch.randn(m, 640)
    ts = []
    for _ in range(30):
        t0 = time.perf_counter(); ext.quant_linear(x, w, None, None, None); ts.append(time.perf_counter() - t0)
    out.append(f"{m}:{min(ts) * 1e3:.2f}")
print(" ".join(out))
