"""The bundled workloads: valid, held-out only, as the spec's categories require, and reproducible."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdecode.bench.workloads import DEFAULT_WORKLOAD, load_workloads, select
from specdecode.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_bundled_workloads_shape() -> None:
    ws = load_workloads(DEFAULT_WORKLOAD)
    cats = {w.category for w in ws}
    assert cats == {"completion", "editing", "long"}
    assert all(w.max_new_tokens >= 512 for w in ws if w.category == "long")
    for w in ws:
        if w.category == "editing":  # the answer largely repeats code that is in the prompt
            before = w.prompt.split("# Before:\n", 1)[1].split("\n\n# After:\n", 1)[0]
            assert len(before) > 200 and before.splitlines()[0].startswith(("def ", "async def "))
        if w.category == "completion":
            assert w.prompt.rstrip().endswith(("'", '"'))  # signature + docstring, body to write


def test_workloads_come_from_held_out_files_only() -> None:
    from specdecode.train.data import held_out_files

    held = {f.rel for f in held_out_files()}
    for w in load_workloads(DEFAULT_WORKLOAD):
        assert w.source.rsplit(":", 1)[0] in held, w.id


def test_make_workloads_is_deterministic() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_workloads.py"), "--check"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_select_and_validation(tmp_path: Path) -> None:
    ws = select(load_workloads(DEFAULT_WORKLOAD), per_category=1, max_new_tokens=20)
    assert len(ws) == 3 and all(w.max_new_tokens <= 20 for w in ws)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "category": "x", "prompt": "p"}) + "\n")
    with pytest.raises(ConfigError, match="max_new_tokens"):
        load_workloads(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        load_workloads(bad)


def test_stop_at_eos_default_matches_llama_cpp_budgets(capsys: pytest.CaptureFixture[str]) -> None:
    """The chat workload stops at the answer's end, unless llama.cpp runs beside us: llama-bench always writes
    the full budget, so ours does too. Asking for both is allowed, with a warning that the counts differ."""
    from specdecode.bench.workloads import stop_at_eos

    assert stop_at_eos(None, "real", False) is True
    assert stop_at_eos(None, "real", True) is False
    assert stop_at_eos(None, "mixed", False) is False
    assert stop_at_eos(False, "real", False) is False
    assert capsys.readouterr().err == ""
    assert stop_at_eos(True, "real", True) is True
    assert "llama-bench cannot stop at EOS" in capsys.readouterr().err
