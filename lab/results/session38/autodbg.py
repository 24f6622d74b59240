import json, os, sys, tempfile
from pathlib import Path
sys.path.insert(0, "tests/unit"); sys.path.insert(0, "tests")
import specdecode.sizing.book as cm
import test_policy_poisoning as t
import specdecode.drafters.model as drafter_module
from specdecode.core import DecodeCore
from specdecode.models import load_model
from specdecode.drafters.auto import AutoDrafter
from specdecode.drafters.base import as_batch_drafter
from specdecode.drafters.ngram import PromptLookupDrafter
pair = (load_model(t.MODELS / "code-target"), load_model(t.MODELS / "code-draft"))
def auto_core():
    members = {"model": drafter_module.DraftModelDrafter(pair[1]), "ngram": as_batch_drafter(PromptLookupDrafter())}
    return DecodeCore(pair[0], {"auto": AutoDrafter(members)}, max_rows=4, prepare=["auto"])
tmp = Path(tempfile.mkdtemp())
cm._MEMO.clear(); os.environ["SPECDECODE_CACHE"] = str(tmp / "good")
fc = auto_core(); fresh = t.run(fc, t.PROMPT, 64, gamma="auto", drafter="auto")
def show(core, tag):
    a = core.drafters["auto"]
    ms = {m.name: (round(m.c, 3), [round(x, 2) for x in m.costs.v[:8]] if m.costs else None, round(m.alpha, 2), round(m.rates.mean, 2)) for m in a.members}
    print(tag, "base v", [round(x, 2) for x in a._base.v[:8]], "t1", round(a._t1 * 1e3, 3), ms)
show(fc, "fresh")
cm._MEMO.clear(); os.environ["SPECDECODE_CACHE"] = str(tmp / "bad")
auto_core()
for f in (tmp / "bad" / "costs").glob("*.json"):
    d = json.loads(f.read_text()); v = [1.0] + [3.0 * x for x in d["v"][1:]]
    f.write_text(json.dumps(dict(d, v=v, target_s=[d["target_s"][0] * x for x in v])))
cm._MEMO.clear()
core = auto_core()
for i in range(4):
    s = t.run(core, t.PROMPT, 64, gamma="auto", drafter="auto")
    print("req", i, s.accepted, s.drafted, s.target_passes, s.drafted_by, s.accepted_by)
    show(core, "  ")
print("trusted", {k: round(v * 1e3, 3) for k, v in core.policy.trusted_passes().items()})
