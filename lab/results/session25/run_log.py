"""Lab: suffix with planning off, logging each step's tree features (for a calibration study)."""
import json, sys
from specdecode.drafters import suffix as S
S.SuffixDrafter._may_pay = lambda self, m, stored, cap, rows: True
S.SuffixDrafter.plan = lambda self, tree, rows=1: (len(tree.tokens), 1.0)
LOG = []
cur = {}
orig_ct = S.continuation_tree
def ct(conts, cap, min_prob, m):
    cur["n"] = len(conts); cur["lens"] = sorted(len(c) for c in conts)[:3]
    return orig_ct(conts, cap, min_prob, m)
S.continuation_tree = ct
orig_top = S.top_chain
orig_p1 = S.SuffixDrafter._propose_one
def p1(self, row, ctx, rows):
    cur.clear()
    d = orig_p1(self, row, ctx, rows)
    st = self._rows.get(row)
    LOG.append(None if not d.tokens else dict(n=cur.get("n"), m=None, toks=list(d.tokens), parents=d.parents))
    return d
S.SuffixDrafter._propose_one = p1
orig_cand = S.SuffixDrafter.candidates
def cand(self, row, tokens, max_nodes, rows=1):
    t = orig_cand(self, row, tokens, max_nodes, rows)
    if t is not None:
        cur["m"] = t.match_len; cur["stored"] = t.stored; cur["freqs"] = t.freqs; cur["depths"] = t.depths
    return t
S.SuffixDrafter.candidates = cand
def p1b(self, row, ctx, rows):
    cur.clear()
    d = orig_p1(self, row, ctx, rows)
    LOG.append(dict(pos=len(ctx.tokens), empty=True) if not d.tokens else dict(pos=len(ctx.tokens), toks=[int(t) for t in d.tokens], n=cur.get("n"), m=cur.get("m"), stored=cur.get("stored"),
               freqs=cur.get("freqs"), depths=cur.get("depths"), parents=d.parents))
    return d
S.SuffixDrafter._propose_one = p1b
from specdecode.bench import replay as R
orig_rp = R.replay_prompt
TGT = {}
orig_setup = R.setup
def setup(args):
    s = orig_setup(args); TGT["t"] = s.target; return s
R.setup = setup
def pmax_of(ids, answer):
    import torch
    t = TGT["t"]; seq = list(ids) + list(answer)
    cache = t.new_cache(1, len(seq))
    with torch.no_grad():
        out = t.run(torch.tensor([seq[:-1]]), cache, rows=slice(0, 1))
        p = torch.softmax(out.logits[0].float(), -1)
        top2 = p.topk(2, -1).values
    return top2[:, 0].tolist(), top2[:, 1].tolist()
def rp(d, ids, answer, *a, **k):
    p1, p2 = pmax_of(ids, answer)
    LOG.append({"P": [int(x) for x in answer], "plen": len(ids), "p1": p1, "p2": p2})
    return orig_rp(d, ids, answer, *a, **k)
def _unused(*a, **k):
    return orig_rp(*a, **k)
R.replay_prompt = rp
out = sys.argv.pop(1)
from specdecode.cli import main
rc = main(sys.argv[1:])
json.dump(LOG, open(out, "w"))
sys.exit(rc)
