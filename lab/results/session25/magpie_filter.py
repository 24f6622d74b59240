import json, re, sys
sys.path.insert(0, '/work/main/src')
from specdecode.train.prompt_set import held_out_filter
recs, seen = [], set()
for l in open('/tmp/magpie/prompts-raw.jsonl'):
    d = json.loads(l); t = d['text'].strip()
    if d['n'] >= 120 or len(t) < 20 or '<|im' in t: continue
    key = re.sub(r'\W+', ' ', t.lower())[:60]
    if key in seen: continue
    seen.add(key)
    recs.append({"id": f"magpie-{d['seed']}", "category": "chat", "source": "magpie: SmolLM2-135M-Instruct at T=0.8, top-p 0.9",
                 "messages": [{"role": "user", "content": t}]})
kept, report = held_out_filter(recs, "real")
print(len(recs), '->', len(kept)); print(report[:500])
with open('/tmp/magpie/prompts.jsonl', 'w') as f:
    for r in kept: f.write(json.dumps(r) + '\n')
