"""Lab script (session 27): Medusa heads' top-1 acceptance by head on the bench's real-workload prompts (chat
template), teacher-forced on the target's greedy answers: the planner-free quality of two heads directories."""

import json
import sys

import torch

import specdecode as sd
from specdecode.bench.real import prepare_real_prompts
from specdecode.bench.workloads import load_workloads, resolve_workload, select
from specdecode.drafters.medusa_heads import MedusaHeads, load_heads
from specdecode.drafters.vocab import read_vocab_file
from specdecode.train.medusa import evaluate_heads

torch.set_num_threads(1)
target = sd.load_model("smollm2-135m-instruct", weight_dtype="int4")
chosen = select(load_workloads(resolve_workload("real")), 4, 128)
prepared, _ = prepare_real_prompts(chosen, target, None)
out = {}
for d in sys.argv[1:]:
    cfg, tensors = load_heads(d)
    heads = MedusaHeads(cfg.num_heads, cfg.dim)
    heads.load_state_dict(tensors)
    vocab = read_vocab_file(d)
    ids = torch.tensor(sorted(vocab["token_ids"][: vocab["size"]])) if vocab else None
    per_cat = {}
    for cat in dict.fromkeys(p.workload.category for p in prepared):
        ps = [p.ids for p in prepared if p.workload.category == cat]
        alpha, table, n = evaluate_heads(target, heads, ps, 128, ids)
        per_cat[cat] = {"top1": [round(a, 3) for a in alpha], "rank2": [round(t[1], 3) for t in table], "n": n}
        print(d, cat, per_cat[cat], flush=True)
    out[d] = per_cat
print(json.dumps(out))
