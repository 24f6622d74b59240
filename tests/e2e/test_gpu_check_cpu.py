"""scripts/gpu_check.py on the CPU: the run a lent GPU gets, in small (rounds, table, operator count)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_writes_one_table_of_rounds_per_target(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--dtypes", "fp32",
                        "--skip-tests", "--tokens", "8", "--reps", "2", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    (target,) = report["targets"]  # the bundled pair, fp32
    assert len(target["plain_rounds"]) == 2 and target["plain_repeatable"]
    timed = {n: r for n, r in target["drafters"].items() if "tok_s" in r}
    assert {"model", "suffix", "auto"} <= set(timed)
    assert all(len(r["rounds"]) == 2 and r["greedy_identical"] for r in timed.values())
    assert target["step"]["aten_per_step"] > 0
    table = (tmp_path / "speed.md").read_text()
    assert "| plain |" in table and "| suffix |" in table and "aten:: operators" in table
