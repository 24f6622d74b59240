import os, sys, time, tempfile
sys.path.insert(0, "tests/unit"); sys.path.insert(0, "tests")
os.environ["SPECDECODE_CACHE"] = tempfile.mkdtemp()
import test_policy_poisoning as t
from pricing import fixed
from specdecode.models import load_model
import torch; torch.set_num_threads(1)
pair = (load_model(t.MODELS / "code-target"), load_model(t.MODELS / "code-draft"))
out = {}
for name, pol in (("frozen", lambda: t.FrozenCosts(fixed(t.FIXED))), ("live", lambda: None)):
    core = t.new_core(pair, pol())
    t.run(core, t.PROMPT, 64); t.run(core, t.PROMPT, 64)
    t0 = time.perf_counter(); acc = 0; passes = 0
    for _ in range(6):
        s = t.run(core, t.PROMPT, 64); acc += s.accepted; passes += s.target_passes
    out[name] = f"{6 * 64 / (time.perf_counter() - t0):.0f} tok/s acc {acc} passes {passes}"
print(os.environ.get("SPECDECODE_KERNEL_STREAMS", "default"), out, pair[0].kernels.streams)
