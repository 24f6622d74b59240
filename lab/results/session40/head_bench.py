"""Gemma 3 270M's output matrix shape (262,144 x 640, int8 = Q8_0 repacked) at 1 token row, 1 thread: ms a call
(min and median of 60) and GB/s, for whichever build PYTHONPATH points at; also a long-row matrix of the same bytes."""
import sys, time, statistics
import torch
torch.set_num_threads(1)
from specdecode.kernels.quant import quantize, load_quant_extension
ext = load_quant_extension()
ISA = sys.argv[1] if len(sys.argv) > 1 else None
torch.manual_seed(0)
for n, k in ((262144, 640), (8192, 20480)):
    w = quantize(torch.randn(n, k) * 0.02, "int8")
    x = torch.randn(1, k)
    ts = []
    for _ in range(60):
        t0 = time.perf_counter(); ext.quant_linear(x, w, None, ISA, None); ts.append(time.perf_counter() - t0)
    b = w.numel() * w.element_size()
    print(f"{n}x{k}: min {min(ts)*1e3:.3f} ms  median {statistics.median(ts)*1e3:.3f} ms  {b / min(ts) / 1e9:.1f} GB/s")
