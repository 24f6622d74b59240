"""``specdecode eval-draft | draft-vocab``: the training side's measuring subcommands (held-out α of a draft, and
the frequency-ranked draft vocabulary), apart from the training recipes' flags in ``cli.py``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

import torch

from .draft_vocab import build_draft_vocab
from .evaluate import evaluate_draft


def add_eval(sub) -> None:
    p = sub.add_parser("eval-draft", help="held-out acceptance rate α of a draft vs a target (T=0 and T=1)",
                       description="Measure α per Leviathan et al.: at T=0 the rate at which the draft's argmax "
                                   "equals the target's along the target's greedy path; at T=1 the mean of "
                                   "sum_x min(p(x), q(x)) along a path the target samples. Prompts come from "
                                   "held-out corpus files. Unigram and bigram drafters fitted on the training "
                                   "split are reported as baselines.")
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--draft", default=None, help="draft model directory (omit to report only the n-gram baselines)")
    p.add_argument("--corpus", nargs="+", default=[], metavar="PATH",
                   help="the corpus the models were trained on (default: the stdlib; its held-out files give prompts)")
    p.add_argument("--prompts", type=int, default=64, help="held-out prompts (default: %(default)s)")
    p.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt (default: %(default)s)")
    p.add_argument("--new-tokens", type=int, default=128,
                   help="target tokens generated per prompt (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts run together (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1234,
                   help="picks the prompts and the T=1 samples (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--dtype", default="auto",
                   help="auto (fp32 on CPU, bf16 on CUDA), fp32, bf16 (default: %(default)s)")
    p.add_argument("--no-ngrams", dest="ngrams", action="store_false", help="skip the unigram/bigram baselines")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON here")
    p.set_defaults(func=_run_eval, _parser=p)


def _run_eval(args: argparse.Namespace, argv: Optional[Sequence[str]] = None) -> int:
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    res = evaluate_draft(args.target, args.draft, corpus=args.corpus or None, prompts=args.prompts,
                         prompt_len=args.prompt_len, new_tokens=args.new_tokens, seed=args.seed, device=device,
                         dtype=args.dtype, ngrams=args.ngrams, batch_size=args.batch_size)
    print(res)
    if args.json:
        Path(args.json).write_text(res.to_json() + "\n")
    return 0


def add_draft_vocab(sub) -> None:
    p = sub.add_parser("draft-vocab", help="rank a draft's tokens by corpus frequency so it drafts over the top N",
                       description="Count the training split's tokens with the draft's tokenizer and write "
                                   "draft_vocab.json into the draft directory. The draft then computes logits only "
                                   "for the N most frequent tokens (FR-Spec, arXiv:2502.14856): a smaller output "
                                   "layer, a cheaper draft step, the same exact output. `--draft-vocab` on "
                                   "generate/serve/bench picks another N or 'full'.")
    p.add_argument("--draft", required=True, help="draft model directory (the file is written there), or a GGUF "
                                                  "file (written beside it as NAME.gguf.draft_vocab.json, which "
                                                  "its self-drafts read)")
    p.add_argument("--corpus", nargs="+", default=[], metavar="PATH",
                   help="the corpus the draft was trained on (default: the stdlib; only its training split counts)")
    p.add_argument("--size", type=int, default=None,
                   help="tokens '--draft-vocab auto' uses (default: a quarter of the vocabulary)")
    p.set_defaults(func=_run_draft_vocab, _parser=p)


def _run_draft_vocab(args: argparse.Namespace, argv: Optional[Sequence[str]] = None) -> int:
    path = build_draft_vocab(args.draft, corpus=args.corpus or None, size=args.size)
    data = json.loads(path.read_text())
    print(f"wrote {path}: {data['size']} of {len(data['token_ids'])} tokens cover {data['coverage']:.1%} of the "
          "training split")
    return 0
