"""A draft model's output restricted to the tokens it is likely to propose (FR-Spec, arXiv:2502.14856).

Why: a small draft's step is dominated by its output matrix (on the bundled draft,
8192 x 128 of its 2.8 MB of weights), yet it almost never correctly proposes a rare
token. Computing logits only for the N most frequent tokens of the training corpus
cuts the draft's cost c with little loss in acceptance α. Exactness is untouched: the
acceptance rule is exact for any draft law q, and a q that is zero outside the subset
is still a law (the target's correction can produce any token).

The frequency list lives next to the draft's weights in ``draft_vocab.json``:
``{"token_ids": [most frequent first], "size": N (the recommended cut), ...}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np
import torch

from ..config import ConfigError

if TYPE_CHECKING:
    from ..models import Model

VOCAB_FILE = "draft_vocab.json"
VocabSpec = Union[str, int]  # "auto" (the file's recommended size, or full without a file), "full", or N


@dataclass(frozen=True)
class DraftVocab:
    """The draft's proposable tokens and their rows of its output matrix."""

    ids: torch.Tensor  # [n] int64, the token ids the draft may propose
    head: torch.Tensor  # [n, dim] their rows of the draft's output matrix, contiguous
    vocab_size: int  # the full vocabulary the engine and verifier work in

    @property
    def size(self) -> int:
        return int(self.ids.numel())

    def expand(self, logits: torch.Tensor) -> torch.Tensor:
        """Subset logits [..., n] -> full-vocabulary logits [..., V] with -inf outside the subset."""
        out = logits.new_full(logits.shape[:-1] + (self.vocab_size,), float("-inf"))
        return out.index_copy_(-1, self.ids, logits)


def parse_vocab_spec(value: Union[str, int, None]) -> VocabSpec:
    """A --draft-vocab value: 'auto', 'full' or a positive integer."""
    if value is None:
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        text = str(value).strip().lower()
        if text in ("auto", "full"):
            return text
        try:
            n = int(text)
        except ValueError:
            raise ConfigError(f"draft vocabulary must be 'auto', 'full' or a positive number of tokens; got {value!r}")
    if n < 1:
        raise ConfigError(f"draft vocabulary size must be positive, got {n}; use 'full' for the whole vocabulary")
    return n


def read_vocab_file(draft_dir: Union[str, Path]) -> Optional[dict]:
    path = Path(draft_dir) / VOCAB_FILE
    return read_vocab_file_at(path) if path.is_file() else None


def read_vocab_file_at(path: Path) -> dict:
    """A frequency list (``write_vocab_file``'s format), or a ConfigError that says how to remake it."""
    draft_dir = path.parent
    try:
        data = json.loads(path.read_text())
        ids = data["token_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise ValueError("token_ids must be a list of integers")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} is malformed ({e}); regenerate it with `specdecode draft-vocab --draft "
                          f"{draft_dir}` or delete it to draft over the full vocabulary") from e
    return data


def draft_vocab_for(model: "Model", spec: VocabSpec = "auto") -> Optional[DraftVocab]:
    """The restricted output for ``model`` (None: draft over the full vocabulary)."""
    spec = parse_vocab_spec(spec)
    if spec == "full":
        return None
    data = read_vocab_file(model.path)
    if data is None:
        if spec == "auto":
            return None
        raise ConfigError(f"--draft-vocab {spec} needs {Path(model.path) / VOCAB_FILE}, the draft's token "
                          f"frequencies; create it with `specdecode draft-vocab --draft {model.path}`")
    ranked = data["token_ids"]
    n = int(data.get("size", len(ranked))) if spec == "auto" else int(spec)
    n = min(n, len(ranked))
    if n >= model.vocab_size:
        return None
    bad = [t for t in ranked[:n] if not 0 <= t < model.vocab_size]
    if bad:
        raise ConfigError(f"{Path(model.path) / VOCAB_FILE} lists token ids {bad[:5]} outside the draft's "
                          f"vocabulary [0, {model.vocab_size}); it belongs to another model")
    ids = torch.tensor(sorted(ranked[:n]), dtype=torch.long, device=model.device)
    head = model.output_rows(ids).contiguous()
    return DraftVocab(ids, head, model.vocab_size)


def self_draft_ids(model: "Model", spec: VocabSpec = "auto") -> Optional[torch.Tensor]:
    """The tokens a self-draft of ``model`` proposes (sorted ids), or None for the whole vocabulary.

    The ranking: ``draft_vocab.json`` beside the checkpoint (a directory's, or ``NAME.gguf.draft_vocab.json``
    beside a GGUF file) when there is one, else the tokenizer's own (``Model.token_ranking``: a SentencePiece
    vocabulary's scores, a BPE vocabulary's merge order). "auto": the file's size, and no cut without a file:
    on Gemma 3 the tokenizer's first 32,768 tokens held too few of what code needs (its int4 copy's α fell
    from 0.75 to 0.17), where counted frequencies keep it. Exactness does not depend on the choice."""
    spec = parse_vocab_spec(spec)
    if spec == "full":
        return None
    root = Path(model.path)
    data = read_vocab_file(root) if root.is_dir() else _read_beside(root)
    if data is None and spec == "auto":
        return None
    ranked = data["token_ids"] if data is not None else model.token_ranking().tolist()
    n = int(spec) if spec != "auto" else int(data.get("size", len(ranked))) if data is not None else len(ranked)
    ids = [t for t in ranked[:n] if 0 <= t < model.vocab_size]
    if len(ids) >= model.vocab_size:
        return None
    return torch.tensor(sorted(ids), dtype=torch.long)


def _read_beside(file: Path) -> Optional[dict]:
    beside = vocab_path(file)
    return read_vocab_file_at(beside) if beside.is_file() else None


def vocab_path(checkpoint: Union[str, Path]) -> Path:
    """Where a checkpoint's frequency list lives: in its directory, or beside a single file (a GGUF)."""
    p = Path(checkpoint)
    return p.with_name(f"{p.name}.{VOCAB_FILE}") if p.is_file() else p / VOCAB_FILE


def rank_tokens(stream: np.ndarray, vocab_size: int) -> tuple[list[int], np.ndarray]:
    """Token ids by decreasing frequency in ``stream`` (ties by id), and the counts in that order."""
    counts = np.bincount(stream, minlength=vocab_size)[:vocab_size]
    order = np.argsort(-counts, kind="stable")
    return [int(t) for t in order], counts[order]


def write_vocab_file(draft_dir: Union[str, Path], ranked: Sequence[int], counts: np.ndarray, size: int,
                     source: str) -> Path:
    """Write the frequency list; ``size`` is the cut ``--draft-vocab auto`` uses."""
    total = float(counts.sum()) or 1.0
    coverage = float(counts[:size].sum()) / total
    path = vocab_path(draft_dir)
    path.write_text(json.dumps({
        "size": int(size),
        "coverage": round(coverage, 6),  # share of the counted tokens inside the first `size`
        "source": source,
        "token_ids": [int(t) for t in ranked],
    }) + "\n")
    return path


__all__ = ["DraftVocab", "VOCAB_FILE", "VocabSpec", "draft_vocab_for", "parse_vocab_spec",
           "rank_tokens", "read_vocab_file", "read_vocab_file_at", "self_draft_ids", "vocab_path", "write_vocab_file"]
