"""``specdecode datastore``: the target's own greedy answers, stored for suffix drafting (``suffix_store``).

Two sources of answers:

- ``--rollouts DATA.pt``: a data cache written by ``distill --method eagle|medusa|early-exit`` (its
  ``tokens`` rows: chat prompt + the target's continuation). Each row's answer, from the last
  assistant header to its first end-of-turn token, is taken as written; corpus windows (no header) are
  skipped. No model runs but the tokenizer's.
- ``--prompts FILE.jsonl`` (default: ``TARGET/data/prompts.jsonl``): the training prompts (the held-out
  share, ``chat_prompts.is_held_out``, is never answered), decoded greedily in batches. Answers are
  appended to ``OUT/answers.jsonl`` as they come, so an interrupted run resumes where it stopped (the file
  goes once the datastore is written).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import torch
from tqdm import tqdm

from ..cli import model_loader, resolve_target
from ..config import ConfigError, ModelLoadConfig, add_dataclass_args, from_args
from ..drafters.registry import target_folder
from ..drafters.suffix import STORE
from ..drafters.suffix_store import save_store
from .calibrate import default_prompts_file
from .chat_prompts import load_chat_prompts
from .rollout import generate_ragged

if TYPE_CHECKING:
    from ..models import Model

ASSISTANT_HEADER = "<|im_start|>assistant\n"  # ChatML, the template of the targets trained for here
ANSWERS_FILE = "answers.jsonl"


def answer_of(row: Sequence[int], header: Sequence[int], eos: set[int]) -> Optional[list[int]]:
    """The answer in a prompt + continuation row: after the last ``header``, through the first ``eos``
    token (kept: the drafter learns where answers end); None when the row has no header."""
    h = len(header)
    for i in range(len(row) - h, -1, -1):
        if list(row[i:i + h]) == list(header):
            ans = [int(t) for t in row[i + h:]]
            for j, t in enumerate(ans):
                if t in eos:
                    return ans[:j + 1]
            return ans
    return None


def answers_from_rollouts(path: Path, header: Sequence[int], eos: set[int]) -> list[list[int]]:
    if not path.is_file():
        raise ConfigError(f"--rollouts: no such file {path}")
    data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(data, dict) or "tokens" not in data:
        raise ConfigError(f"--rollouts {path}: not a data cache of `distill --method eagle|medusa|early-exit` "
                          "(it has no 'tokens')")
    found = (answer_of(row, header, eos) for row in data["tokens"].tolist())
    return [a for a in found if a]


def generate_answers(target: "Model", prompts: list[list[int]], out: Path, max_new_tokens: int, batch: int,
                     progress: bool) -> list[list[int]]:
    """Greedy answers to ``prompts`` (resuming from ``out/answers.jsonl``), cut at the first end-of-turn."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / ANSWERS_FILE
    done: dict[int, list[int]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            done[int(rec["prompt"])] = rec["answer"]
    eos = set(target.eos_token_ids)
    todo = sorted((i for i in range(len(prompts)) if i not in done), key=lambda i: len(prompts[i]))
    with open(path, "a") as f, tqdm(total=len(prompts), initial=len(done), desc="answers", unit="prompt",
                                    file=sys.stderr, disable=not progress) as bar:
        for k in range(0, len(todo), batch):
            idx = todo[k:k + batch]
            total = max(len(prompts[i]) for i in idx) + max_new_tokens
            rows = generate_ragged(target, [prompts[i] for i in idx], total, 0.0)
            for i, row in zip(idx, rows.tolist()):
                ans = row[len(prompts[i]):len(prompts[i]) + max_new_tokens]
                cut = next((j + 1 for j, t in enumerate(ans) if t in eos), len(ans))
                done[i] = ans[:cut]
                f.write(json.dumps({"prompt": i, "answer": done[i]}) + "\n")
            f.flush()
            bar.update(len(idx))
    return [done[i] for i in range(len(prompts)) if done[i]]


def cmd_datastore(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1 or args.batch < 1:
        raise ConfigError("--max-new-tokens and --batch must be at least 1")
    torch.set_num_threads(max(1, args.threads))
    folder = target_folder(args.target)
    out = Path(args.out) if args.out else (folder / "drafters" / STORE.name if folder is not None else None)
    if out is None:
        raise ConfigError("--out DIR is needed for a target without a folder (a hub id)")
    target = model_loader(from_args(ModelLoadConfig, args))(resolve_target(args))
    header = target.encode(ASSISTANT_HEADER, add_special_tokens=False)
    t0 = time.time()
    if args.rollouts:
        answers = answers_from_rollouts(Path(args.rollouts), header, set(target.eos_token_ids))
        recipe: dict[str, object] = {"source": "rollouts", "rollouts": Path(args.rollouts).name}
    else:
        path = args.prompts or default_prompts_file(folder)
        if path is None:
            raise ConfigError("--prompts FILE.jsonl is needed: the target has no data/prompts.jsonl")
        chat = load_chat_prompts(target, path, args.max_prompt_len)
        prompts = chat.train[:args.max_prompts] if args.max_prompts else chat.train
        answers = generate_answers(target, prompts, out, args.max_new_tokens, args.batch, not args.no_progress)
        recipe = {"source": "greedy answers", "prompts": Path(path).name, "prompts_answered": len(prompts),
                  "held_out_skipped": len(chat.held_out), "max_new_tokens": args.max_new_tokens,
                  "weight_dtype": args.weight_dtype, "threads": args.threads}
    if not answers:
        raise ConfigError("no answers found: the rows hold no assistant header (a chat template other than ChatML?)")
    recipe["minutes"] = round((time.time() - t0) / 60, 1)
    save_store(out, answers, target.vocab_size, recipe)
    (out / ANSWERS_FILE).unlink(missing_ok=True)  # the resume file: the datastore holds its answers now
    n = sum(len(a) for a in answers)
    print(f"datastore: {len(answers)} answers, {n} tokens -> {out} (found there by --drafter suffix and auto)")
    return 0


def add_subcommands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("datastore", help="store the target's own answers for suffix drafting (no training)",
                       description="Write a datastore of the target's greedy answers to its training prompts "
                                   "into TARGET/drafters/suffix/ (or --out). Suffix drafting (and auto) then also "
                                   "drafts the stock phrases of other answers where the request itself has no "
                                   "longer match. Answers come from a distill data cache (--rollouts, seconds) or "
                                   "are generated (--prompts; resumable).")
    p.add_argument("--target", help="target model: a directory, a GGUF file or a catalogued name")
    p.add_argument("--rollouts", metavar="DATA.pt", help="take the answers of a `distill --method eagle|medusa|"
                                                          "early-exit` data cache instead of generating them")
    p.add_argument("--prompts", help="chat prompts (.jsonl) to answer (default: TARGET/data/prompts.jsonl); the "
                                     "held-out share is skipped")
    p.add_argument("--max-prompts", type=int, default=None, help="answer at most this many prompts")
    p.add_argument("--max-prompt-len", type=int, default=512, help="skip prompts longer than this (default: 512)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens per answer at most (default: 256)")
    p.add_argument("--batch", type=int, default=16, help="prompts decoded together (default: 16)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--out", default=None, metavar="DIR", help="where to write it (default: TARGET/drafters/suffix)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_dataclass_args(p, ModelLoadConfig)
    p.set_defaults(func=cmd_datastore)
