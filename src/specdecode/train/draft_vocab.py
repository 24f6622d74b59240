"""`specdecode draft-vocab`: rank a draft's tokens by training-corpus frequency (FR-Spec).

The draft then computes logits only for the most frequent ``size`` tokens
(``drafters/vocab.py``), which makes each draft step cheaper for a small loss in α.
Frequencies come from the training split only, like every other fitted statistic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from ..config import ConfigError
from ..drafters.vocab import rank_tokens, write_vocab_file
from ..models import load_model
from . import data as D
from .evaluate import doc_separator
from .tokenizer import encode_batch_fn


def default_size(vocab_size: int) -> int:
    """A quarter of the vocabulary (FR-Spec's 32k of 128k), in multiples of 64 rows."""
    return max(64, (vocab_size // 4) // 64 * 64)


def build_draft_vocab(draft_dir: str | Path, corpus: Optional[Sequence[str]] = None, size: Optional[int] = None,
                      stream=None) -> Path:
    """Count tokens on the training split of ``corpus`` (or use ``stream``) and write draft_vocab.json."""
    model = load_model(str(draft_dir))
    if model.tokenizer is None:
        raise ConfigError(f"{draft_dir} has no tokenizer.json; token frequencies need the draft's tokenizer")
    if stream is None:
        train, _ = D.split_corpus(D.list_corpus(corpus or None))
        stream = D.token_stream(train, encode_batch_fn(model.tokenizer), doc_separator(model))
    n = default_size(model.vocab_size) if size is None else size
    if not 0 < n <= model.vocab_size:
        raise ConfigError(f"--size must be in 1..{model.vocab_size} (the draft's vocabulary), got {n}")
    ranked, counts = rank_tokens(stream, model.vocab_size)
    source = "training split of " + (", ".join(corpus) if corpus else "the Python standard library (default corpus)")
    return write_vocab_file(draft_dir, ranked, counts, n, f"token counts on the {source}")
