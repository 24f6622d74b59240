import json, sys
def v_at(v, n):  # v list: v[0]=1 (one token), v[n] = pass over n+1 tokens
    return v[min(n, len(v) - 1)]
def summarize(path, vt=None):
    d = json.load(open(path)); v = vt or d["v"]; t1 = d["t1_s"]
    cats = [p["category"] if isinstance(p, dict) else p for p in d["prompts"]]
    for name, per in d["steps"].items():
        by = {}
        for cat, s in zip(cats, per):
            tok = sum(a + 1 for a in s["accepted"])
            cost = sum(ds / t1 + v_at(v, n) for ds, n in zip(s["draft_s"], s["nodes"]))
            ocost = sum(ds / t1 + v_at(v, a) for ds, a in zip(s["draft_s"], s["accepted"]))
            ocost0 = sum((ds / t1 if a else 0) + v_at(v, a) for ds, a in zip(s["draft_s"], s["accepted"]))
            for k in (cat, "overall"):
                b = by.setdefault(k, [0, 0, 0, 0, 0])
                b[0] += tok; b[1] += cost; b[2] += ocost; b[3] += ocost0; b[4] += len(s["accepted"])
        for k, (tok, cost, oc, oc0, st) in by.items():
            print(f"{name:10s} {k:10s} tau {tok/st:.2f}  pred {tok/cost:.3f}  oracle {tok/oc:.3f}  oracle(no c when none) {tok/oc0:.3f}")
vt = [float(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else None
summarize(sys.argv[1], vt)
