"""What int8 / int4 weights cost in quality: held-out perplexity and agreement with the bf16 model.

For each format the checkpoint is loaded as ``load_model(..., weight_dtype=fmt)`` (exactly what
``--weight-dtype`` runs) and scored beside the stored-dtype model on the same held-out tokens:

- perplexity on the stdlib corpus's held-out files (the split ``specdecode pretrain`` never trains
  on), scored in blocks of ``--block`` tokens from a fresh cache;
- teacher-forced top-1 agreement: how often the format's argmax equals the reference's on those
  same positions (the greedy acceptance rate a quantized self-draft can hope for);
- greedy agreement: on the bench's held-out prompts, the share of ``--new-tokens`` greedy tokens
  equal to the reference's before the first difference, and the share of prompts fully identical.

    python scripts/quant_quality.py [--target models/code-target] [--formats int8,int4]
                                    [--tokens 32768] [--block 256] [--prompts 12] [--new-tokens 64]

Goal (issue 14): int8 within 1% of the reference's perplexity; int4 reported.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from specdecode.bench.workloads import load_workloads
from specdecode.models import load_model
from specdecode.models.loading import Model
from specdecode.train.data import held_out_files, read_text

DEFAULT_WORKLOAD = "src/specdecode/bench/workloads/stdlib-heldout-v1.jsonl"


def held_out_stream(model: Model, n_tokens: int) -> list[int]:
    """The first ``n_tokens`` of the held-out files, each file after an end-of-text separator."""
    sep = min(model.eos_token_ids) if model.eos_token_ids else 0
    out: list[int] = []
    for f in held_out_files():
        out += [sep] + model.encode(read_text(f), add_special_tokens=False)
        if len(out) >= n_tokens + 1:
            break
    return out[: n_tokens + 1]


@torch.inference_mode()
def score(model: Model, stream: list[int], block: int,
          reference_argmax: list[torch.Tensor] | None) -> tuple[float, list[torch.Tensor], float]:
    """(mean NLL, argmax per block, top-1 agreement with ``reference_argmax``)."""
    nll, count, agree, argmaxes = 0.0, 0, 0, []
    for i, start in enumerate(range(0, len(stream) - 1, block)):
        ids = stream[start: start + block + 1]
        if len(ids) < 2:
            break
        x = torch.tensor([ids[:-1]])
        y = torch.tensor(ids[1:])
        logits = model.forward(x, model.new_cache(1, len(ids)))[0]
        nll += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
        count += len(y)
        top = logits.argmax(-1)
        argmaxes.append(top)
        if reference_argmax is not None:
            agree += int((top == reference_argmax[i]).sum())
    return nll / count, argmaxes, agree / count


def greedy_agreement(model: Model, reference: list[list[int]], prompts: list[list[int]],
                     new: int) -> tuple[float, float]:
    """(mean share of tokens before the first difference, share of identical continuations)."""
    import specdecode as sd

    prefix, same = 0.0, 0
    for ids, ref in zip(prompts, reference):
        out = sd.generate(model, ids, max_new_tokens=new, ignore_eos=True).token_ids
        n = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
        prefix += n / len(ref)
        same += out == ref
    return prefix / len(prompts), same / len(prompts)


def weight_bytes(model: Model) -> int:
    return sum(p.numel() * p.element_size() for n, p in model.module.named_parameters() if n.startswith("layers."))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="models/code-target")
    ap.add_argument("--formats", default="int8,int4")
    ap.add_argument("--tokens", type=int, default=32768, help="held-out tokens scored")
    ap.add_argument("--block", type=int, default=256, help="tokens per scored block (fresh cache each)")
    ap.add_argument("--workload", default=DEFAULT_WORKLOAD)
    ap.add_argument("--prompts", type=int, default=12, help="held-out prompts for greedy agreement")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    ref = load_model(args.target)
    block = min(args.block, ref.max_seq_len - 1)
    stream = held_out_stream(ref, args.tokens)
    prompts = [ref.encode(w.prompt)[-(ref.max_seq_len - args.new_tokens - 1):]
               for w in load_workloads(args.workload)[: args.prompts]]
    import specdecode as sd

    ref_out = [sd.generate(ref, ids, max_new_tokens=args.new_tokens, ignore_eos=True).token_ids for ids in prompts]
    t0 = time.perf_counter()
    ref_nll, ref_top, _ = score(ref, stream, block, None)
    rows = [{"format": ref.weight_format, "ppl": math.exp(ref_nll), "ppl_vs_ref": 0.0, "top1_agree": 1.0,
             "greedy_prefix": 1.0, "greedy_identical": 1.0, "layer_bytes": weight_bytes(ref),
             "score_s": time.perf_counter() - t0}]
    for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
        m = load_model(args.target, weight_dtype=fmt)
        t0 = time.perf_counter()
        nll, _, agree = score(m, stream, block, ref_top)
        prefix, same = greedy_agreement(m, ref_out, prompts, args.new_tokens)
        rows.append({"format": fmt, "ppl": math.exp(nll), "ppl_vs_ref": math.exp(nll - ref_nll) - 1,
                     "top1_agree": agree, "greedy_prefix": prefix, "greedy_identical": same,
                     "layer_bytes": weight_bytes(m), "score_s": time.perf_counter() - t0})
    print(f"{args.target}: {len(stream) - 1} held-out tokens, blocks of {block}; {len(prompts)} prompts x "
          f"{args.new_tokens} greedy tokens")
    print(f"{'format':<10}{'ppl':>9}{'vs ref':>9}{'top-1 agree':>13}{'greedy prefix':>15}{'identical':>11}"
          f"{'layer MB':>10}")
    for r in rows:
        print(f"{r['format']:<10}{r['ppl']:>9.3f}{100 * r['ppl_vs_ref']:>+8.2f}%{100 * r['top1_agree']:>12.1f}%"
              f"{100 * r['greedy_prefix']:>14.1f}%{100 * r['greedy_identical']:>10.0f}%"
              f"{r['layer_bytes'] / 2**20:>10.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": args.target, "tokens": len(stream) - 1, "block": block, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
