"""The one JSON-lines reader: line numbers that match an editor's, and errors that name the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode.bench.workloads import load_workloads
from specdecode.config import ConfigError
from specdecode.jsonl import read_jsonl


def test_records_with_their_line_numbers(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n\n   \n"text"\n{"b": [2]}\n')
    assert read_jsonl(p, objects=False) == [(1, {"a": 1}), (4, "text"), (5, {"b": [2]})]
    with pytest.raises(ConfigError, match=r"a\.jsonl:4: each line must be a JSON object"):
        read_jsonl(p)


def test_errors_name_the_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "w.jsonl"
    p.write_text('{"id": "x"}\n{"id": \n')
    with pytest.raises(ConfigError, match=r"w\.jsonl:2: not valid JSON"):
        read_jsonl(p)
    with pytest.raises(ConfigError, match=r"w\.jsonl:2: not valid JSON"):
        load_workloads(p)  # the workloads read through it
    with pytest.raises(ConfigError, match="cannot read .*missing.jsonl"):
        read_jsonl(tmp_path / "missing.jsonl")
