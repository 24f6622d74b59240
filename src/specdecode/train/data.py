"""Corpus: which text files we train on, the held-out split, and token blocks.

The held-out split is decided per *file* by a hash of its relative path, so it
is stable across machines, runs and corpus growth, and no held-out line ever
leaks into training through a shared file.
"""

from __future__ import annotations

import glob
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

HELD_OUT_FRACTION = 0.05
# Default corpus: the running interpreter's standard library sources. The test
# suites (test/, */tests/, idle_test/) are excluded: they are ~60% of the bytes
# but mostly assertion boilerplate and encoded data blobs, and our CPU budget
# covers roughly one pass over the library code anyway. pydoc_data is one
# 750 KB string literal of prose, not code.
STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "pydoc_data",
                                  "__pycache__"})


class CorpusError(ValueError):
    """The corpus spec is unusable (empty, or yields no text); the message says why."""


@dataclass(frozen=True)
class CorpusFile:
    path: Path
    rel: str  # path relative to the spec it came from: the key of the held-out split

    @property
    def held_out(self) -> bool:
        return is_held_out(self.rel)


def is_held_out(rel: str, fraction: float = HELD_OUT_FRACTION) -> bool:
    """Deterministic per-file split: the first 8 bytes of sha1(rel path) as a fraction."""
    h = int.from_bytes(hashlib.sha1(rel.encode("utf-8")).digest()[:8], "big")
    return h / 2**64 < fraction


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[CorpusFile]:
    root = stdlib_root()
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if STDLIB_EXCLUDED_DIRS.intersection(rel.parts[:-1]):
            continue
        out.append(CorpusFile(p, rel.as_posix()))
    if not out:
        raise CorpusError(f"no .py files found in the standard library at {root}")
    return out


def _looks_binary(path: Path) -> bool:
    with open(path, "rb") as f:
        return b"\0" in f.read(8192)


def _glob_base(pattern: str) -> Path:
    """The longest leading part of a glob without wildcards: rel paths are taken from there."""
    parts = Path(pattern).parts
    base: list[str] = []
    for part in parts:
        if glob.has_magic(part):
            break
        base.append(part)
    return Path(*base) if base else Path(".")


def _spec_files(spec: str) -> list[CorpusFile]:
    p = Path(spec).expanduser()
    if glob.has_magic(spec):
        base = _glob_base(str(p))
        hits = sorted(Path(h) for h in glob.glob(str(p), recursive=True))
        files = [h for h in hits if h.is_file()]
        if not files:
            raise FileNotFoundError(f"corpus glob {spec!r} matched no files")
        return [CorpusFile(f, f.relative_to(base).as_posix() if f.is_relative_to(base) else f.name)
                for f in files if not _looks_binary(f)]
    if not p.exists():
        raise FileNotFoundError(f"corpus path {spec!r} does not exist")
    if p.is_file():
        return [] if _looks_binary(p) else [CorpusFile(p, p.name)]
    out = []
    for f in sorted(p.rglob("*")):
        rel = f.relative_to(p)
        if not f.is_file() or any(part.startswith(".") for part in rel.parts) or "__pycache__" in rel.parts:
            continue
        if not _looks_binary(f):
            out.append(CorpusFile(f, rel.as_posix()))
    return out


def list_corpus(specs: Optional[Sequence[str]] = None) -> list[CorpusFile]:
    """All files of the corpus: ``specs`` are folders (walked), globs or files; None = the stdlib.

    Raises FileNotFoundError for a missing path or a glob matching nothing and
    CorpusError when nothing usable remains.
    """
    if not specs:
        files = stdlib_files()
    else:
        files = []
        seen: set[Path] = set()
        for spec in specs:
            for cf in _spec_files(spec):
                key = cf.path.resolve()
                if key not in seen:
                    seen.add(key)
                    files.append(cf)
    files = [f for f in files if f.path.stat().st_size > 0]
    if not files:
        raise CorpusError(f"corpus is empty: {list(specs or ['<stdlib>'])} holds no non-empty text files")
    return files


def split_corpus(files: Sequence[CorpusFile]) -> tuple[list[CorpusFile], list[CorpusFile]]:
    """(train, held_out). At least one file is held out so evaluation is never vacuous."""
    if len(files) < 2:
        raise CorpusError(f"corpus has {len(files)} file(s); need at least 2 so one can be held out")
    held = [f for f in files if f.held_out]
    if not held:  # tiny corpora: hold out the file whose hash is smallest
        held = [min(files, key=lambda f: hashlib.sha1(f.rel.encode("utf-8")).digest())]
    held_set = {f.path for f in held}
    train = [f for f in files if f.path not in held_set]
    return train, held


def train_files(specs: Optional[Sequence[str]] = None) -> list[CorpusFile]:
    return split_corpus(list_corpus(specs))[0]


def held_out_files(specs: Optional[Sequence[str]] = None) -> list[CorpusFile]:
    return split_corpus(list_corpus(specs))[1]


def read_text(f: CorpusFile) -> str:
    return f.path.read_text(encoding="utf-8", errors="replace")


def iter_texts(files: Iterable[CorpusFile]) -> Iterable[str]:
    for f in files:
        yield read_text(f)


def token_stream(files: Sequence[CorpusFile], encode_batch, sep_id: int) -> np.ndarray:
    """All files as one int32 stream, each document preceded by ``sep_id`` (<|endoftext|>).

    ``encode_batch(list[str]) -> list[list[int]]`` must not add special tokens.
    Prefixing (not suffixing) means every document starts right after the
    separator, exactly like a prompt encoded with BOS at inference time.
    """
    parts: list[np.ndarray] = []
    chunk = 256
    for i in range(0, len(files), chunk):
        texts = [read_text(f) for f in files[i:i + chunk]]
        for ids in encode_batch(texts):
            parts.append(np.asarray([sep_id] + list(ids), dtype=np.int32))
    if not parts:
        raise CorpusError("corpus is empty: no files to tokenize")
    return np.concatenate(parts)


def pack_blocks(stream: np.ndarray, block_len: int) -> torch.Tensor:
    """Cut the stream into non-overlapping [N, block_len] rows (the tail shorter than a block is dropped)."""
    n = len(stream) // block_len
    if n == 0:
        raise CorpusError(f"corpus has {len(stream)} tokens, fewer than one block of {block_len}; "
                          "use a bigger corpus or a smaller --seq-len")
    return torch.from_numpy(stream[: n * block_len].astype(np.int64)).view(n, block_len)


class BlockSampler:
    """Random windows of ``block_len`` tokens from the stream, reproducible per step.

    Each step's offsets come from a generator seeded by (seed, step), so a run
    resumed at step k draws exactly the batches the uninterrupted run would have.
    """

    def __init__(self, stream: np.ndarray, block_len: int, batch_size: int, seed: int) -> None:
        if len(stream) <= block_len:
            raise CorpusError(f"training split has {len(stream)} tokens, fewer than one block of {block_len}+1; "
                              "use a bigger corpus or a smaller --seq-len")
        self.stream = torch.from_numpy(stream.astype(np.int64))
        self.block_len, self.batch_size, self.seed = block_len, batch_size, seed

    def batch(self, step: int) -> torch.Tensor:
        """[batch_size, block_len + 1] (inputs are [:, :-1], targets [:, 1:])."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.stream) - self.block_len, (self.batch_size,), generator=g)
        idx = starts.unsqueeze(1) + torch.arange(self.block_len + 1).unsqueeze(0)
        return self.stream[idx]


def corpus_fingerprint(files: Sequence[CorpusFile]) -> str:
    """Changes when any file is added, removed, renamed or resized: the key for token caches."""
    h = hashlib.sha1()
    for f in files:
        h.update(f"{f.rel}\0{f.path.stat().st_size}\0".encode())
    return h.hexdigest()[:16]


__all__ = ["CorpusError", "CorpusFile", "BlockSampler", "iter_texts", "read_text", "HELD_OUT_FRACTION",
           "corpus_fingerprint", "held_out_files",
           "is_held_out", "list_corpus", "pack_blocks", "split_corpus", "stdlib_files", "token_stream", "train_files"]
