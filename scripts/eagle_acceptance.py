"""EAGLE's top-1 chain acceptance by depth on bench prompts, at run time and in the training unroll.

Why: the distill command reports acceptance on held-out corpus windows; this measures it where the
bench runs, two ways, so a gap between training and run time shows up as a gap between the two:

- ``runtime``: the drafter forced to draft 7-deep chains (free costs), greedy, every step's
  acceptance counted (the target's verdicts; outputs equal plain decoding's);
- ``unroll``: ``EagleNet.unroll`` (the training-time test) over the target's greedy continuation
  of the same prompts, every position an anchor, as ``distill``'s held-out evaluation scores it.

Anchors differ (run time starts a chain only where the last step ended), so the per-depth rates
differ in shape; τ (1 + mean accepted chain length) is the figure to compare.

    python scripts/eagle_acceptance.py --per-category 4 --new-tokens 128
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch

import specdecode
from specdecode.costmodel import Costs
from specdecode.drafters.eagle import EagleDrafter
from specdecode.drafters.eagle_model import input_embedding, load_eagle
from specdecode.train.eagle import target_features

DEPTH = 7


def conditional(counts: list[int], starts: int) -> list[float]:
    """α at depth d given depths < d accepted, from counts of chains accepted to depth >= d."""
    prev, out = starts, []
    for c in counts:
        out.append(c / prev if prev else 0.0)
        prev = c
    return out


def runtime(target: specdecode.Model, path: str, prompts: list[list[int]], new: int) -> tuple[list[float], float]:
    d = EagleDrafter.load(path, costs=Costs(c=0.0, v=(1.0,) * 65), level_cost=0.0, tree_extra=0.0)
    d.topk, d.expand, d.max_depth = 1, 1, DEPTH  # a chain: one child per level, every level grown
    d._ingest = 0.0
    acc, steps = [0] * DEPTH, 0
    for ids in prompts:
        st = specdecode.generate(target, ids, drafter=d, max_new_tokens=new, ignore_eos=True).stats
        for i, a in enumerate(st.accepted_by_position[:DEPTH]):
            acc[i] += a
        steps += st.drafted_by_position[0] if st.drafted_by_position else 0
    return conditional(acc, steps), 1 + sum(acc) / max(steps, 1)


@torch.inference_mode()
def unroll(target: specdecode.Model, path: str, prompts: list[list[int]], new: int) -> tuple[list[float], float]:
    net = load_eagle(path).float().eval()
    emb = input_embedding(target).float()
    runs = []
    for ids in prompts:
        out = specdecode.generate(target, ids, max_new_tokens=new, ignore_eos=True)
        s = torch.tensor([ids + list(out.token_ids)])
        f, _, _ = target_features(target, s, tuple(net.cfg.aux_layers), 1)
        nxt = torch.cat([s[:, 1:], s[:, -1:]], dim=1)
        outs = net.unroll(f.float(), emb[nxt], DEPTH)
        anchors = torch.arange(len(ids) - 1, s.shape[1] - 2 - DEPTH)
        hits = [net.draft_ids[net.logits(h[:, anchors + k]).argmax(-1)] == s[:, anchors + k + 2]
                for k, h in enumerate(outs)]
        runs.append(torch.stack(hits, -1).reshape(-1, DEPTH).long().cumprod(-1))
    r = torch.cat(runs)
    return conditional([int(x) for x in r.sum(0)], len(r)), 1 + float(r.sum(-1).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--eagle", default="models/code-eagle")
    ap.add_argument("--workload", default="src/specdecode/bench/workloads/stdlib-heldout-v1.jsonl")
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = specdecode.load_model(args.target)
    rows = [json.loads(line) for line in Path(args.workload).read_text().splitlines() if line.strip()]
    by_cat: dict[str, list[list[int]]] = collections.defaultdict(list)
    for r in rows:
        if len(by_cat[r["category"]]) < args.per_category:
            ids = target.encode(r["prompt"])[-(target.max_seq_len - args.new_tokens - 80):]
            by_cat[r["category"]].append(ids)
    print(f"{'category':11s} {'way':8s} {'tau':>5s}  alpha at depth 1..{DEPTH} (given the earlier depths accepted)")
    for cat, prompts in list(by_cat.items()) + [("overall", [p for ps in by_cat.values() for p in ps])]:
        for name, fn in (("runtime", runtime), ("unroll", unroll)):
            alpha, tau = fn(target, args.eagle, prompts, args.new_tokens)
            print(f"{cat:11s} {name:8s} {tau:5.2f}  " + " ".join(f"{a:.3f}" for a in alpha), flush=True)


if __name__ == "__main__":
    main()
