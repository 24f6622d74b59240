"""A datastore for suffix drafting: the target's own answers to many prompts, matched like earlier outputs.

Suffix drafting proposes what followed the current suffix elsewhere. Within one request or one server's
history that finds copies (code, edits, repeated lines), but a chat answer's stock phrases ("Here's the
updated code with comments:", "Let's break it down step by step") recur across *other* users' requests.
REST (He et al., arXiv:2311.08252) drafts them from a text corpus; here the corpus is the target's own
greedy answers (self-distilled, so its phrasing is the target's), built once per target and shipped
beside it as ``TARGET/drafters/suffix/``:

- ``datastore.safetensors``: ``tokens`` (uint16 or int32, every answer end to end) and ``lengths`` (one
  per answer);
- ``datastore.json``: the vocabulary size the ids belong to and the recipe that wrote them.

``load_store`` reads them into a ``SuffixIndex`` that no request writes to. ``specdecode datastore``
(``suffix_store_cli.py``) builds one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError
from .suffix_index import SuffixIndex

STORE_FILE = "datastore.safetensors"
INFO_FILE = "datastore.json"


def is_store_dir(path: Path) -> bool:
    return (path / STORE_FILE).is_file() and (path / INFO_FILE).is_file()


def save_store(out: Path, docs: Sequence[Sequence[int]], vocab_size: int, recipe: dict[str, Any]) -> Path:
    """Write ``docs`` (token id lists) and their recipe to ``out``; returns the directory."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
    flat = np.fromiter((t for d in docs for t in d), dtype=np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
        raise ValueError(f"datastore token ids must lie in [0, {vocab_size})")
    save_file({"tokens": flat.astype(dtype), "lengths": np.asarray([len(d) for d in docs], dtype=np.int32)},
              str(out / STORE_FILE))
    info = {"vocab_size": vocab_size, "answers": len(docs), "tokens": int(flat.size), "recipe": recipe}
    (out / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return out


def read_store(path: Path) -> tuple[list[list[int]], dict[str, Any]]:
    """(answers as token lists, the info record) of a datastore directory."""
    from safetensors.numpy import load_file

    if not is_store_dir(path):
        raise ConfigError(f"--suffix-datastore {path}: not a suffix datastore (it needs {STORE_FILE} and {INFO_FILE}; "
                          "build one with `specdecode datastore --target TARGET --out DIR`)")
    info = json.loads((path / INFO_FILE).read_text())
    arrays = load_file(str(path / STORE_FILE))
    tokens, lengths = arrays["tokens"].astype(np.int64), arrays["lengths"]
    if int(lengths.sum()) != tokens.size:
        raise ConfigError(f"--suffix-datastore {path}: {STORE_FILE} is damaged (lengths do not add up to the tokens); "
                          "rebuild it with `specdecode datastore`")
    ends = np.cumsum(lengths)
    docs = [tokens[e - n:e].tolist() for n, e in zip(lengths.tolist(), ends.tolist())]
    return docs, info


def load_store(path: str | Path, vocab_size: int) -> SuffixIndex:
    """A read-only ``SuffixIndex`` over a datastore built for a target of ``vocab_size`` tokens."""
    docs, info = read_store(Path(path))
    if info.get("vocab_size") != vocab_size:
        raise ConfigError(f"--suffix-datastore {path}: built for a vocabulary of {info.get('vocab_size')} tokens, the "
                          f"target has {vocab_size}; build one for this target with `specdecode datastore`")
    total = sum(len(d) for d in docs)
    index = SuffixIndex(max_tokens=max(1, total))
    for d in docs:
        index.append(index.new_doc(), d)
    return index
