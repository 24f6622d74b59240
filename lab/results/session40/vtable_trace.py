"""Gemma 3 270M prose: the v(n) tables auto and suffix price drafts with, after each request, beside v(n)
measured directly (median of many passes). Fresh cost cache (models symlinked)."""
import os, sys, tempfile, json, time
cache = tempfile.mkdtemp()
os.makedirs(cache + "/models")
os.symlink(os.path.expanduser("~/.cache/specdecode/models/gemma-3-270m"), cache + "/models/gemma-3-270m")
os.environ["SPECDECODE_CACHE"] = cache
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch
torch.set_num_threads(1)
import specdecode
from specdecode.bench.workloads import load_workloads, WORKLOAD_DIR
from specdecode.sizing.costs import measure_costs
which = sys.argv[1] if len(sys.argv) > 1 else "auto"
target = specdecode.load_model("gemma-3-270m")
docs = load_workloads(WORKLOAD_DIR / "prose-continuation-v1.jsonl")
fmt = lambda v: " ".join(f"{x:.2f}" for x in v)
if which == "truth":

    for r in range(2):
        c = measure_costs(target, None, max_gamma=15, reps=25)
        print("truth median v(1..16):", fmt(c.v), "| ms:", " ".join(f"{x * 1e3:.2f}" for x in c.target_s[:9]), flush=True)
    sys.exit()
d = specdecode.build_drafter(which, specdecode.DrafterOptions())
def table():
    if which == "auto":
        return d._base.v if d._base is not None else None
    return d._costs.v if d._costs is not None else None
t0 = time.time()
for w in docs:
    r = specdecode.generate(target, w.prompt, drafter=d, max_new_tokens=128)
    print(w.id, r.stats.summary(), flush=True)
    print("   v:", fmt(table()), flush=True)
print("wall", round(time.time() - t0, 1))
