import os, sys, tempfile
sys.path.insert(0, "tests/unit"); sys.path.insert(0, "tests")
os.environ["SPECDECODE_CACHE"] = tempfile.mkdtemp()
import test_policy_poisoning as t
from specdecode.models import load_model
pair = (load_model(t.MODELS / "code-target"), load_model(t.MODELS / "code-draft"))
core = t.new_core(pair)
acc = [t.run(core, t.PROMPT, 64).accepted for _ in range(4)]
p = core.policy
print(pair[0].kernels.describe(), acc, {k: round(v.estimate * 1e3, 3) for k, v in p._host.items()},
      {k: round(v.estimate * 1e3, 3) for k, v in p._t.items() if k[1] in (1, 7)})
