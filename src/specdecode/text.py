"""Text in and out of the core: a prompt's token ids (``prompt_ids``, with errors that say what to
change), text deltas per token that never split a UTF-8 character (``IncrementalDetokenizer``) and
stop strings (``find_stop``, ``truncate_pieces``)."""

from __future__ import annotations

from typing import Optional, Sequence, Union

from .cache import ContextLengthError
from .config import ConfigError
from .models import Model

Prompt = Union[str, Sequence[int]]


# -- text ----------------------------------------------------------------------------------------
class IncrementalDetokenizer:
    """Text deltas per token that concatenate to the decoded text, never splitting a UTF-8 character."""

    def __init__(self, model: Model, context: Sequence[int]) -> None:
        self.model = model
        self.ids = list(context[-4:])  # a little prompt context so leading spaces decode right
        self.prefix = 0
        self.read = len(self.ids)

    def push(self, token: int) -> str:
        self.ids.append(token)
        prefix_text = self.model.decode(self.ids[self.prefix : self.read])
        new_text = self.model.decode(self.ids[self.prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        prefix_text = self.model.decode(self.ids[self.prefix : self.read])
        new_text = self.model.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return new_text[len(prefix_text) :]


def find_stop(previous: str, delta: str, stops: Sequence[str]) -> Optional[int]:
    """Index in the full text where the earliest stop string starts, if one completed in ``delta``."""
    full = previous + delta
    lo = max(0, len(previous) - max(len(s) for s in stops) + 1)
    hits = [i for s in stops if (i := full.find(s, lo)) >= 0]
    return min(hits) if hits else None


def truncate_pieces(pieces: list[str], keep: int) -> list[str]:
    out = []
    for p in pieces:
        out.append(p[: max(0, keep)])
        keep -= len(p)
    return out


def prompt_ids(target: Model, prompt: Prompt) -> list[int]:
    """Tokenise (or validate) a prompt, with errors that say what to change."""
    if isinstance(prompt, str):
        ids = target.encode(prompt)
    else:
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < target.vocab_size]
        if bad:
            raise ConfigError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {target.vocab_size})")
    if not ids:
        raise ConfigError("the prompt is empty; give at least one token of text")
    if len(ids) >= target.max_seq_len:
        raise ContextLengthError(
            f"prompt has {len(ids)} tokens but the context window of {target.name} is {target.max_seq_len}; "
            "shorten the prompt so at least one token can be generated"
        )
    return ids
