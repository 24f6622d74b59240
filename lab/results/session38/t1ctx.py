import sys, time, torch, statistics
torch.set_num_threads(1)
from specdecode.models import load_model
m = load_model("models/code-target")
ids = torch.randint(10, 8000, (1, 200), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    c = m.new_cache(1, 240); m.forward(ids, c, last_only=True)
    one, wide = ids[:, :1], ids[:, :9]
    def t(x):
        a = time.perf_counter(); float(m.forward(x, c)[0, -1, 0]); d = time.perf_counter() - a; c.trim(x.shape[1]); return d
    b2b, after = [], []
    for _ in range(300):
        t(one); b2b.append(t(one))
        t(wide); after.append(t(one))
    for _ in range(300):
        t(wide); after.append(t(one))
        t(one); b2b.append(t(one))
q = lambda xs: sorted(xs)[len(xs) // 4] * 1e3
print(m.kernels.streams, f"one-token pass back to back: q25 {q(b2b):.3f} med {statistics.median(b2b)*1e3:.3f} ms; after a 9-token pass: q25 {q(after):.3f} med {statistics.median(after)*1e3:.3f}")
