"""Gemma 3 270M prose, auto: each step's chosen member, draft width and accepted tokens, priced with the
measured v(n) (vtable_truth.txt): the realised rate (accepted + 1) / v(width + 1) per member, against plain's 1."""
import os, sys, tempfile, collections
cache = tempfile.mkdtemp(); os.makedirs(cache + "/models")
os.symlink(os.path.expanduser("~/.cache/specdecode/models/gemma-3-270m"), cache + "/models/gemma-3-270m")
os.environ["SPECDECODE_CACHE"] = cache
import torch
torch.set_num_threads(1)
import specdecode
from specdecode.bench.workloads import load_workloads, WORKLOAD_DIR
from specdecode.drafters import auto as A
V = [1.00, 1.17, 1.21, 1.24, 1.24, 1.24, 1.31, 1.40, 1.58, 1.70, 1.81, 1.92, 2.05, 2.16, 2.31, 2.46, 2.6, 2.75]
log = []
orig = A.AutoDrafter.on_verified_row
def on_verified_row(self, row, n):
    got = self._pending.get(row)
    if got is not None:
        m, width = got
        log.append((m.name, width, n, m.row_evidence(row).alpha))
    return orig(self, row, n)
A.AutoDrafter.on_verified_row = on_verified_row
target = specdecode.load_model("gemma-3-270m")
docs = load_workloads(WORKLOAD_DIR / "prose-continuation-v1.jsonl")
d = specdecode.build_drafter("auto", specdecode.DrafterOptions())
for rep in range(2):
    log.clear()
    plain_steps = 0
    for w in docs:
        r = specdecode.generate(target, w.prompt, drafter=d, max_new_tokens=128, ignore_eos=True)
        plain_steps += r.stats.target_passes
    plain_steps -= len(log)
    by = collections.defaultdict(lambda: [0, 0, 0, 0.0, collections.Counter(), 0.0])
    for name, width, n, alpha in log:
        b = by[name]; b[0] += 1; b[1] += width; b[2] += n; b[3] += V[width]; b[4][width] += 1; b[5] += alpha
    print(f"rep {rep}: plain steps {plain_steps}")
    for name, (steps, drafted, acc, cost, widths, a) in by.items():
        print(f"  {name}: steps {steps}, drafted {drafted}, accepted {acc}, tokens/step {(acc + steps) / steps:.2f}, "
              f"cost {cost / steps:.2f} passes, realised rate {(acc + steps) / cost:.2f}, mean est alpha {a / steps:.2f}, "
              f"widths {sorted(widths.items())}")
