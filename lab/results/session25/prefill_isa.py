import time, torch, specdecode
from specdecode.kernels import quant as Q
torch.set_num_threads(1)
t = specdecode.load_model("/tmp/plain/smol.gguf", weight_dtype="int4")
ids = torch.randint(100, 40000, (1, 256))
def run(n, reps=3):
    best = 1e9
    for _ in range(reps):
        c = t.new_cache(1, n + 8); t0 = time.perf_counter(); t.forward(ids[:, :n], c, last_only=True)
        best = min(best, time.perf_counter() - t0)
    return best
for rnd in range(2):
    for isa in ("avx2", "avxvnni", "vnni512"):
        Q.set_quant_isa(isa); run(8, 1)
        print(rnd, isa, " ".join(f"{n}:{run(n)/n*1e3:.3f}" for n in (1, 4, 16, 64, 200)), "ms/token", flush=True)
