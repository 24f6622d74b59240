"""`specdecode bench busy`: its busy processes, its table's ratios, and a real run where SmolLM2 is pulled."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from specdecode.bench import busy
from specdecode.chat_cli import DEFAULT_CHAT_MODEL
from specdecode.models.catalog import model_file


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_hogs_hold_a_core_each_and_end_with_the_block() -> None:
    before = set(os.listdir("/proc"))
    with busy.hogs(1):
        time.sleep(0.6)
        children = [int(p) for p in set(os.listdir("/proc")) - before if p.isdigit()]
        hog = [p for p in children if busy.HOG in open(f"/proc/{p}/cmdline").read().replace("\0", " ")]
        assert len(hog) == 1 and _cpu_s(hog[0]) > 0.2
    assert not os.path.exists(f"/proc/{hog[0]}") or "Z" in open(f"/proc/{hog[0]}/stat").read().split()[2]


def test_table_gives_the_goals_ratios() -> None:
    rows = [{"condition": c, "entry": e, "drafter": "none", "arm": a, "tok_s": v, "samples": [v]}
            for c, e, a, v in (("idle", "generate", "default", 200.0), ("idle", "generate", "1 thread", 160.0),
                               ("idle", "api", "default", 190.0), ("2 busy", "generate", "default", 90.0),
                               ("2 busy", "generate", "1 thread", 100.0), ("2 busy", "api", "default", 45.0),
                               ("2 busy", "serve", "default", 80.0), ("2 busy", "serve", "1 thread", 100.0))]
    rows.append({"condition": "idle", "entry": "chat", "drafter": "auto", "arm": "default", "tok_s": 400.0,
                 "samples": [400.0]})
    rows.append({"condition": "idle", "entry": "chat", "drafter": "auto", "arm": "1 thread", "tok_s": 300.0,
                 "samples": [300.0]})
    lines = busy.table(rows).splitlines()
    assert "| idle | generate | none | 200.0 | 160.0 | 1.25 |" in lines
    assert "| idle | api | none | 190.0 | – | 0.95 of `generate`'s default |" in lines
    assert "| 2 busy | generate | none | 90.0 | 100.0 | 0.90 |" in lines
    assert "| 2 busy | api | none | 45.0 | – | 0.50 of `generate`'s default |" in lines
    assert "| 2 busy | serve | none | 80.0 | 100.0 | 0.80 |" in lines
    assert "| idle | chat | auto | 400.0 | 300.0 | 1.33 |" in lines


def test_unknown_entries_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main as cli_main
    assert cli_main(["bench", "busy", "--entries", "generate,repl"]) == 2
    err = capsys.readouterr().err
    assert "--entries repl unknown" in err and "generate,chat,serve" in err


def test_chat_figures_line_is_read() -> None:
    line = "\n[187.4 tok/s | alpha 0.61 | tau 2.10 tokens/pass | 64 tokens, finish: length]\n"
    assert busy.CHAT_FIGURES.findall(line) == ["187.4"]


def test_child_entry_point_refuses_other_arguments() -> None:
    with pytest.raises(SystemExit, match="bench busy"):
        busy.main(["--nope"])


@pytest.mark.slow
def test_a_real_run_on_smollm2() -> None:
    if not model_file(DEFAULT_CHAT_MODEL).is_file():
        pytest.skip(f"{DEFAULT_CHAT_MODEL} is not pulled")
    out = subprocess.run([sys.executable, "-m", "specdecode.cli", "bench", "busy", "--drafters", "none",
                          "--hogs", "1", "--rounds", "1", "--max-new-tokens", "16"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    for cond in ("idle", "1 busy"):
        for entry in ("generate", "chat", "serve", "api"):
            assert f"| {cond} | {entry} | none |" in out.stdout, out.stdout
