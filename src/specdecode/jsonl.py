"""JSON lines as the workloads, prompt sets and calibration prompts are written: one reader, so every
file's errors name the file, the line and what is wrong the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .config import ConfigError


def read_jsonl(path: str | Path, objects: bool = True) -> list[tuple[int, Any]]:
    """(line number, record) for each non-blank line of ``path``; ``objects``: every record must be a JSON
    object. A ConfigError names the file and line of the first bad one."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror or e}") from e
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{i}: not valid JSON ({e.msg})") from e
        if objects and not isinstance(rec, dict):
            raise ConfigError(f"{p}:{i}: each line must be a JSON object")
        out.append((i, rec))
    return out
