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

``load_store`` reads them into a ``StoreIndex`` (the live index's lookup, built with numpy) that no request
writes to. ``specdecode datastore`` (``train/datastore.py``) builds one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError
from .suffix_index import KEY_LENGTHS, MAX_OCCURRENCES, SuffixIndex, longest_hits

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


class StoreIndex:
    """``SuffixIndex``'s lookup and continuations over documents that never change, built with numpy.

    The live index appends in Python, about 1.2 s for SmolLM2's 414k datastore tokens: a server's first request
    would wait for it. Here each n-gram key (ids < 2^16, so up to 4 of them pack into one uint64) is sorted with
    the positions it ends at, oldest first, so a lookup is a binary search per key length and reads the same
    ``max_occurrences`` most recent hits the live index keeps (0.12 s to build)."""

    def __init__(self, docs: Sequence[Sequence[int]], key_lengths: Sequence[int] = KEY_LENGTHS,
                 max_occurrences: int = MAX_OCCURRENCES) -> None:
        self.docs = [list(d) for d in docs]
        self.n_tokens = sum(len(d) for d in self.docs)
        self.key_lengths = tuple(sorted(set(key_lengths), reverse=True))
        self.max_occurrences = max_occurrences
        flat = np.fromiter((t for d in self.docs for t in d), dtype=np.int64, count=self.n_tokens)
        if (flat.size and flat.max() >= 1 << 16) or max(self.key_lengths) > 4:
            raise ValueError("StoreIndex packs up to 4 token ids below 2^16 into a key")
        lengths = np.asarray([len(d) for d in self.docs], dtype=np.int64)
        doc_of = np.repeat(np.arange(len(self.docs)), lengths)
        start = np.repeat(np.cumsum(lengths) - lengths, lengths)
        self._doc = doc_of.astype(np.int32)
        self._end_in_doc = (np.arange(self.n_tokens) - start + 1).astype(np.int32)  # a key ending at i: end i + 1
        self._keys: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for k in self.key_lengths:
            ends = np.nonzero(self._end_in_doc >= k)[0]  # the last token of each k-gram inside one document
            key = np.zeros(ends.size, dtype=np.uint64)  # unsigned: a first id >= 2^15 sets the top bit
            for j in range(k):
                key = (key << np.uint64(16)) | flat[ends - (k - 1) + j].astype(np.uint64)
            order = np.argsort(key, kind="stable")  # ties stay in position order: oldest first
            self._keys[k] = (key[order], ends[order])

    def lookup(self, pattern: Sequence[int], limit: int = 32) -> tuple[int, list[tuple[int, int]]]:
        """As ``SuffixIndex.lookup``: (match length, [(doc, position after the match)]), most recent first."""
        n = len(pattern)
        for k in self.key_lengths:
            if n < k:
                continue
            key = 0
            for t in pattern[n - k:]:
                key = (key << 16) | int(t)
            keys, ends = self._keys[k]
            # one search for the key's run [lo, hi): key + 1 cannot overflow (ids < 2^16, at most 4 of them)
            lo, hi = keys.searchsorted(np.array([key, key + 1], dtype=np.uint64)).tolist()
            at = ends[max(lo, hi - self.max_occurrences):hi][::-1]  # most recent first
            best, hits = longest_hits(pattern, k, zip(self._doc[at].tolist(), self._end_in_doc[at].tolist()),
                                      self.docs, limit)
            if hits:
                return best, hits
        return 0, []

    def continuation(self, doc: int, end: int, depth: int) -> list[int]:
        return self.docs[doc][end:end + depth]


def load_store(path: str | Path, vocab_size: int) -> StoreIndex | SuffixIndex:
    """A read-only index over a datastore built for a target of ``vocab_size`` tokens (``StoreIndex``; the live
    ``SuffixIndex`` for a vocabulary past 2^16 ids, whose keys do not pack)."""
    docs, info = read_store(Path(path))
    if info.get("vocab_size") != vocab_size:
        raise ConfigError(f"--suffix-datastore {path}: built for a vocabulary of {info.get('vocab_size')} tokens, the "
                          f"target has {vocab_size}; build one for this target with `specdecode datastore`")
    if vocab_size <= 1 << 16:
        return StoreIndex(docs)
    index = SuffixIndex(max_tokens=max(1, sum(len(d) for d in docs)))
    for d in docs:
        index.append(index.new_doc(), d)
    return index
