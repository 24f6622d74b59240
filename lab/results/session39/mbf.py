"""DRAM-streaming microbench: 1.7B-shape matrices (8192x2048, 2048x8192) of one format, a sweep per M; v = t(M)/t(1)."""
import os, sys, time, torch
torch.set_num_threads(int(os.environ.get("T", "1")))
from specdecode.kernels.quant_q4k import pack_q4k
from specdecode.kernels.quant import load_quant_extension, quantize, pack_q6k
from specdecode.kernels.quant_b32 import pack_b32
from specdecode.kernels import load_extension
ext = load_quant_extension(); small = load_extension(); ext.set_dense_linear(int(small.linear_address()))
fmt = os.environ.get("FMT", "q4k"); isa = os.environ.get("ISA")
g = torch.Generator().manual_seed(0)
def h(n, nb, c):  # fp16 0.01 as bytes
    return torch.full((n, nb, c // 2), 0.01, dtype=torch.float16).view(torch.uint8)
def mk(n, k):
    if fmt in ("int8", "int4"):
        return quantize(torch.randn(n, k, generator=g) * 0.02, fmt)
    if fmt == "q4k":
        raw = torch.randint(0, 256, (n, k // 256, 144), dtype=torch.uint8, generator=g); raw[:, :, 0:4] = h(n, k // 256, 4)
        return pack_q4k(raw.view(n, -1))
    if fmt == "q6k":
        raw = torch.randint(0, 256, (n, k // 256, 210), dtype=torch.uint8, generator=g); raw[:, :, 208:210] = h(n, k // 256, 2)
        return pack_q6k(raw.view(n, -1))
    bb = {"q5_0": 22, "q4_1": 20, "q5_1": 24}[fmt]
    raw = torch.randint(0, 256, (n, k // 32, bb), dtype=torch.uint8, generator=g); raw[:, :, 0:2] = h(n, k // 32, 2)
    if fmt != "q5_0": raw[:, :, 2:4] = h(n, k // 32, 2)
    return pack_b32(raw.view(n, -1), fmt)
nm = int(os.environ.get("NMAT", "32"))
ws = [mk(8192, 2048) if i % 2 == 0 else mk(2048, 8192) for i in range(nm)]
nbytes = sum(w.numel() * w.element_size() for w in ws)
Ms = [int(a) for a in sys.argv[1:]] or [1, 2, 3, 5, 9]
xs = {M: (torch.randn(M, 2048), torch.randn(M, 8192)) for M in Ms}
res = {M: [] for M in Ms}
kw = {} if isa is None else {"isa": isa}
lin = (lambda x, w: ext.quant_linear(x, w, None, isa, None)) if isa else (lambda x, w: ext.linear(x, w, None, 0))
for r in range(5):
    for M in Ms:
        xa, xb = xs[M]
        t0 = time.perf_counter()
        for i, w in enumerate(ws): lin(xa if i % 2 == 0 else xb, w)
        res[M].append(time.perf_counter() - t0)
t1 = sorted(res[Ms[0]])[1]
print(fmt, isa or "", " ".join(f"M{M}:{sorted(res[M])[1]*1e3:.1f}ms v={sorted(res[M])[1]/t1:.2f}" for M in Ms), f"| M1 {nbytes/t1/1e9:.1f} GB/s")
