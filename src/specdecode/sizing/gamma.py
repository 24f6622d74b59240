"""γ, the draft length: what ``--gamma`` (generate, serve, bench) and a request's ``gamma`` mean, in one place.

Every entry point resolves a γ through ``resolve_gamma`` to one ``Speculation``: a cap (the most draft
tokens a pass) and whether the cost policy may draft fewer (``docs/policy.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

from ..config import ConfigError

Gamma = Union[int, Literal["auto"]]

# The most tokens "auto" drafts a pass when the drafter has no cap of its own; the cost model times
# target passes up to DEFAULT_CAP + 1 tokens, so a longer draft would be priced by extrapolation.
DEFAULT_CAP = 15

SPECULATION_MODES = ("auto", "always")  # the server's --speculation: the adaptive flag, set explicitly


@dataclass(frozen=True)
class Speculation:
    """A resolved γ: at most ``cap`` draft tokens a pass; ``adaptive``: the policy picks 0..cap each pass
    (else the full cap whenever the sequence has room)."""

    cap: int
    adaptive: bool

    def describe(self) -> str:
        """In words, e.g. "adaptive, at most 15" or "4 every step" (the server's start line)."""
        return f"adaptive, at most {self.cap}" if self.adaptive else f"{self.cap} every step"


def resolve_gamma(requested: Optional[Gamma], own: Gamma, adaptive: Optional[bool] = None) -> Speculation:
    """The one rule for ``--gamma`` in every command and ``gamma`` in every request.

    ``requested`` N: at most N tokens a pass, drafted every pass: what vLLM's ``num_speculative_tokens``
    and llama.cpp's ``--draft-max`` lead a user to expect of a number (neither switches drafting off on
    its own). ``"auto"``: the cost policy picks 0..cap each pass, cap being the drafter's own (``own``
    when it is a number: a tree's node limit, prompt lookup's length) else ``DEFAULT_CAP``, the same in
    generate and serve. None: the drafter's ``own`` γ (the Python API, where γ is the drafter's argument).
    ``adaptive`` overrides whether the policy may draft fewer (the server's ``--speculation``, a core
    user's ``Request.adaptive``); None: adaptive exactly for "auto"."""
    g = own if requested is None else requested
    if g == "auto":
        cap = own if isinstance(own, int) else DEFAULT_CAP
    elif isinstance(g, int) and not isinstance(g, bool) and g >= 1:
        cap = g
    else:
        raise ConfigError(f"gamma must be a positive integer or 'auto', got {g!r}")
    return Speculation(cap, g == "auto" if adaptive is None else adaptive)


def parse_gamma(text: str) -> Gamma:
    """``--gamma``'s text as a Gamma; a ConfigError that names the fix otherwise."""
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"gamma must be a positive integer or 'auto', got {text!r}")
    return value


def speculation_flag(speculation: Optional[str]) -> Optional[bool]:
    """The server's ``--speculation`` as ``resolve_gamma``'s ``adaptive``: auto = True, always = False,
    unset = None (adaptive exactly for ``--gamma auto``)."""
    if speculation is None:
        return None
    if speculation not in SPECULATION_MODES:
        raise ConfigError(f"speculation must be one of {', '.join(SPECULATION_MODES)}; got {speculation!r}")
    return speculation == "auto"
