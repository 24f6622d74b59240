"""Argument parsers shared by the bench commands (``bench``, ``bench costs``, ``bench variants``, ...): lists of
counts, γ lists and per-category counts, each refusing bad text with the flag's name."""

from __future__ import annotations

import argparse

from ..config import ConfigError


def parse_gammas(text: str) -> tuple[list[int], bool]:
    """--gammas: a list as for parse_int_list, optionally with 'auto' (γ chosen by the cost model)."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    auto = "auto" in parts
    rest = ",".join(x for x in parts if x != "auto")
    return (parse_int_list(rest, "--gammas") if rest else []), auto


def parse_int_list(text: str, what: str) -> list[int]:
    """'1-8', '2,4,8' or '1-3,6' -> sorted distinct positive ints."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise ConfigError(f"{what} must look like 1-8 or 2,4,8; got {text!r}") from None
    if not out or min(out) < 1:
        raise ConfigError(f"{what} must list positive integers, got {text!r}")
    return sorted(out)


def parse_per_category(text: str) -> int:
    """--per-category: a positive count, or 'all' (0: every prompt, where a workload has a default)."""
    if text.strip().lower() == "all":
        return 0
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'all', got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 or 'all', got {n}")
    return n
