"""Lab script (session 28, issue 29): the ceiling of any deterministic chain drafter at T = 0.7, top-p 0.9.

Under the Gumbel-max coupled rule (the bench's seeded sampling) and under rejection sampling alike, a
deterministic draft token is kept exactly when it equals the target's own draw at that position, and the best
single guess is the target's mode. So along a sampled answer the best such drafter keeps the runs of positions
whose token is the target's argmax. This script samples each real-workload prompt with plain decoding (seeded,
the bench's trajectories), teacher-forces the target over prompt + answer, marks each position's token as the
argmax or not, and writes the marks. `sampled_oracle_price.py` prices them with v(n)."""

import json
import sys

import torch

import specdecode as sd
from specdecode.bench.real import prepare_real_prompts
from specdecode.bench.workloads import load_workloads, resolve_workload, select

torch.set_num_threads(1)
dtype, out_path = sys.argv[1], sys.argv[2]
seeds = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else [0]
target = sd.load_model("smollm2-135m-instruct", weight_dtype=dtype)
chosen = select(load_workloads(resolve_workload("real")), 4, 256)
prepared, _ = prepare_real_prompts(chosen, target, None)
rows = []
for seed in seeds:
    for p in prepared:
        r = sd.generate(target, p.ids, max_new_tokens=p.max_new_tokens, temperature=0.7, top_p=0.9, seed=seed)
        answer = list(r.token_ids)
        seq = list(p.ids) + answer
        cache = target.new_cache(1, len(seq))
        with torch.no_grad():
            logits = target.run(torch.tensor([seq[:-1]]), cache, rows=slice(0, 1)).logits[0].float()
        tail = logits[len(p.ids) - 1:]
        probs = torch.softmax(tail / 0.7, -1)
        top = probs.topk(2, -1)
        mode = top.indices[:, 0].tolist()
        rows.append({"category": p.workload.category, "seed": seed, "n": len(answer),
                     "is_mode": [int(a == m) for a, m in zip(answer, mode)],
                     "p_mode": [round(x, 4) for x in top.values[:, 0].tolist()],
                     "p_second": [round(x, 4) for x in top.values[:, 1].tolist()],
                     "rank2": [int(a == s) for a, s in zip(answer, top.indices[:, 1].tolist())]})
        m = rows[-1]
        print(seed, m["category"], m["n"], sum(m["is_mode"]) / max(1, m["n"]), flush=True)
json.dump(rows, open(out_path, "w"))
