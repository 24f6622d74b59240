import os, sys, tempfile
os.environ["SPECDECODE_CACHE"] = tempfile.mkdtemp()
os.environ["OMP_NUM_THREADS"] = "1"
from pathlib import Path
import specdecode
from specdecode.sizing import policy as P
log = []
orig = P.GammaPolicy.choose
def choose(self, plans):
    out = orig(self, plans)
    p = plans[0]
    tab = self._table(p.drafter) if p.drafter else None
    log.append((round(p.alpha, 3), p.cap, out[0], tuple(round(x * 1e3, 3) for x in tab[0][:6]) if tab else None, round(tab[1] * 1e3, 3) if tab else None))
    return out
P.GammaPolicy.choose = choose
orig_probe = P.GammaPolicy.probe_length
def probe_length(self, plan, fresh):
    out = orig_probe(self, plan, fresh); log.append(("probe", round(fresh, 3), out)); return out
P.GammaPolicy.probe_length = probe_length
MODELS = Path("models")
target = specdecode.load_model(MODELS / "code-target")
d = specdecode.DraftModelDrafter(specdecode.load_model(MODELS / "code-draft"))
r = specdecode.generate(target, "def fibonacci(n):", drafter=d, max_new_tokens=32)
print(r.stats.summary())
if "tau 1.0" in r.stats.summary() or len(sys.argv) > 1:
    for l in log: print(l)
