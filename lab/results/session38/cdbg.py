import json, os, sys, tempfile
from pathlib import Path
sys.path.insert(0, "tests/unit"); sys.path.insert(0, "tests")
import specdecode.sizing.book as cm
import test_policy_poisoning as t
from specdecode.models import load_model
pair = (load_model(t.MODELS / "code-target"), load_model(t.MODELS / "code-draft"))
tmp = Path(tempfile.mkdtemp())
cm._MEMO.clear(); os.environ["SPECDECODE_CACHE"] = str(tmp / "good")
fc = t.new_core(pair); fresh = [t.run(fc, t.PROMPT, 64).accepted for _ in range(8)]
cm._MEMO.clear(); os.environ["SPECDECODE_CACHE"] = str(tmp / "bad")
t.new_core(pair).drafters["model"].costs_for(pair[0])
for f in (tmp / "bad" / "costs").glob("*.json"):
    d = json.loads(f.read_text()); f.write_text(json.dumps(dict(d, c=1.5)))
cm._MEMO.clear()
core = t.new_core(pair)
print("fresh", fresh, "spoiled", [t.run(core, t.PROMPT, 64).accepted for _ in range(8)])
