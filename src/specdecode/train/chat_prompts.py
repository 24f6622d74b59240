"""Instruction prompts for self-distillation on a chat model (``distill --prompts FILE.jsonl``).

A chat target's drafter drafts the target's answers to chat-templated requests, so its training
data should be exactly that: the target's own answers (greedy and sampled) to requests rendered
with the target's chat template, not raw corpus windows. Each line of the file is one prompt:

- ``{"messages": [{"role": "user", "content": "..."}, ...]}``: rendered with the target's chat
  template (``ChatFormatter.for_model``: a GGUF's metadata or a directory's tokenizer_config.json;
  a plain "role: content" template when the target has none);
- ``{"prompt": "..."}``: a single user message, rendered the same way;
- ``{"text": "..."}``: raw text, used as it is (a base model's prompt).

Other keys (``id``, ``category``, ``source``) are kept for the record and ignored. One prompt in
twenty, chosen by a hash of its text, is held out for the trainer's final acceptance report and
never trained on. Prompts longer than ``--prompt-len`` tokens are skipped (counted in the log).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..chat import ChatFormatter
from ..jsonl import read_jsonl
from ..models import Model

HELD_OUT_SHARE = 20  # one prompt in 20 is held out


@dataclass
class ChatPrompts:
    train: list[list[int]]
    held_out: list[list[int]]
    too_long: int  # prompts skipped for exceeding the length limit
    fingerprint: str  # of the file's content (the cache key)


def prompt_record_text(rec: dict[str, Any], fmt: ChatFormatter) -> str:
    """The text the target reads for one record: the chat-templated conversation, or raw ``text``."""
    if "messages" in rec:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m and "content" in m
                                                 for m in msgs):
            raise ValueError("'messages' must be a list of {\"role\": ..., \"content\": ...}")
        return fmt.render([{"role": str(m["role"]), "content": str(m["content"])} for m in msgs])
    if "prompt" in rec:
        return fmt.render([{"role": "user", "content": str(rec["prompt"])}])
    if "text" in rec:
        return str(rec["text"])
    raise ValueError("each line needs 'messages', 'prompt' or 'text'")


def is_held_out(text: str) -> bool:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16) % HELD_OUT_SHARE == 0


def read_records(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--prompts: no such file {p}")
    out = [rec for _, rec in read_jsonl(p)]
    if not out:
        raise ValueError(f"{p} holds no prompts")
    return out


def load_chat_prompts(target: Model, path: str | Path, max_len: int) -> ChatPrompts:
    """The file's prompts as token ids (template applied, no special tokens added by the tokenizer: the
    template writes them), split into training and held-out prompts; those over ``max_len`` are skipped."""
    if target.tokenizer is None:
        raise ValueError(f"target {target.path} has no tokenizer; --prompts needs one")
    fmt = ChatFormatter.for_model(target)
    records = read_records(path)
    texts = []
    for n, rec in enumerate(records, 1):
        try:
            texts.append(prompt_record_text(rec, fmt))
        except ValueError as e:
            raise ValueError(f"{path}: prompt {n}: {e}") from None
    ids = [e.ids for e in target.tokenizer.encode_batch(texts, add_special_tokens=False)]
    train: list[list[int]] = []
    held: list[list[int]] = []
    too_long = 0
    for text, tok in zip(texts, ids):
        if not 0 < len(tok) <= max_len:
            too_long += 1
            continue
        (held if is_held_out(text) else train).append(tok)
    if not train:
        raise ValueError(f"{path}: no training prompt fits in --prompt-len {max_len} tokens")
    fp = hashlib.sha1(Path(path).read_bytes()).hexdigest()[:16]
    return ChatPrompts(train, held, too_long, fp)


__all__ = ["ChatPrompts", "HELD_OUT_SHARE", "is_held_out", "load_chat_prompts", "prompt_record_text", "read_records"]
