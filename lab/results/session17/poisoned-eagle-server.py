"""A server on a cost cache whose EAGLE file says a step costs 50 passes, against one on the sound cache:
per-request EAGLE speedup over plain (each request paired with its plain twin), and the file afterwards."""
import argparse, json, shutil, sys, tempfile, os
from pathlib import Path
import httpx
from specdecode.bench.coldstart import COLD, WARM, _Server, _request

args = argparse.Namespace(target="smollm2-135m-instruct", drafter="eagle", weight_dtype="int4", start_timeout=120)
root = Path(tempfile.mkdtemp(prefix="poison-"))
good, bad = root / "good", root / "bad"
env = dict(os.environ, OMP_NUM_THREADS="1")

def serve(cache, log, questions):
    e = dict(env, SPECDECODE_CACHE=str(cache))
    out = []
    with _Server(args, e, root / log) as srv, httpx.Client(timeout=120) as c:
        model = c.get(srv.url + "/v1/models").json()["data"][0]["id"]
        for q in questions:
            s = _request(c, srv.url, model, q, 128, None)["seconds"]
            p = _request(c, srv.url, model, q, 128, "none")["seconds"]
            out.append(round(p / s, 3))
    return out

serve(good, "measure.log", COLD[:1])  # measures and writes the cache
shutil.copytree(good, bad)
eagle = [f for f in (bad / "costs").glob("*.json") if any(k == "level_one" for k, _ in json.loads(f.read_text()).get("extras", []))]
assert len(eagle) == 1, eagle
d = json.loads(eagle[0].read_text())
print("sound EAGLE file: c", round(d["c"], 3), d["extras"])
eagle[0].write_text(json.dumps(dict(d, c=50.0, extras=[[k, 50.0] for k, _ in d["extras"]])))
qs = list(WARM[:8])
print("sound cache   :", serve(good, "good.log", qs))
print("poisoned cache:", serve(bad, "bad.log", qs))
d2 = json.loads(eagle[0].read_text())
print("poisoned file afterwards: c", round(d2["c"], 3), [[k, round(v, 3)] for k, v in d2["extras"]])
