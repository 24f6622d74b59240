import sys, time, torch
torch.set_num_threads(1)
from specdecode.models.loading import load_model
t = load_model(sys.argv[1]); n = int(sys.argv[2]); secs = float(sys.argv[3])
ids = torch.randint(100, 30000, (1, 512), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    c = t.new_cache(1, 512 + 16); t.forward(ids, c, last_only=True)
    probe = ids[:, :n]
    for _ in range(3): float(t.forward(probe, c)[0, -1, 0]); c.trim(n)
    t0 = time.time(); k = 0; ts = []
    while time.time() - t0 < secs:
        a = time.perf_counter(); float(t.forward(probe, c)[0, -1, 0]); ts.append(time.perf_counter() - a); c.trim(n); k += 1
    ts.sort(); print(f"n={n}: median {ts[len(ts)//2]*1e3:.2f} ms over {k}")
