import sys, json, torch
torch.set_num_threads(1)
from specdecode.bench.ladder import costs
r = costs(sys.argv[1], None, 512)
print(json.dumps({"v": [round(x, 3) for x in r["v"]], "one_ms": round(r["one_token_s"] * 1e3, 2)}))
