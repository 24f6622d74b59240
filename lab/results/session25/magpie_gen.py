"""Lab: Magpie-style prompts (arXiv:2406.08464): sample the instruct model from its chat template's
pre-query prefix, so it writes the user turn itself. Resumable (appends to OUT)."""
import json, sys, time, os
import torch
import specdecode
from specdecode.chat import ChatFormatter
out, n_want, seed0 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
t = specdecode.load_model("/tmp/plain/smol.gguf", weight_dtype="int4")
fmt = ChatFormatter.for_model(t)
text = fmt.render([{"role": "user", "content": "XYZMARK"}])
prefix = text[: text.index("XYZMARK")]
print(repr(prefix), flush=True)
done = sum(1 for _ in open(out)) if os.path.exists(out) else 0
seen = set()
if done:
    for l in open(out): seen.add(json.loads(l)["seed"])
t0 = time.time(); k = 0
with open(out, "a") as f:
    s = seed0
    while done < n_want:
        s += 1
        if s in seen: continue
        r = specdecode.generate(t, prefix, max_new_tokens=120, temperature=float(os.environ.get("MT", "0.8")), top_p=0.9, seed=s)
        f.write(json.dumps({"seed": s, "text": r.text, "n": len(r.token_ids), "finish": getattr(r, "finish_reason", None)}) + "\n"); f.flush()
        done += 1; k += 1
        if k % 50 == 0: print(done, f"{time.time()-t0:.0f}s", flush=True)
