"""`specdecode bench --quick` end to end on tiny checkpoints, and the exact-match check catching a bad method."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pytest

from specdecode.bench.runners import REGISTRY, BenchContext, Method, MethodSpec, OursMethod, RunOutput
from specdecode.cli import main

pytestmark = pytest.mark.slow  # full tier: make test-full

PROMPTS = [
    ("c1", "completion", "def add(a, b):\n    '''Return the sum.'''\n", 12),
    ("e1", "editing", "# Before:\ndef fib(n):\n    if n < 2:\n        return n\n\n# After:\ndef fib(n):\n", 12),
    ("l1", "long", "class Point:\n    def __init__(self, x, y):\n", 20),
]


def _workload(tmp_path: Path) -> Path:
    f = tmp_path / "tiny.jsonl"
    f.write_text("".join(json.dumps({"id": i, "category": c, "prompt": p, "max_new_tokens": n}) + "\n"
                         for i, c, p, n in PROMPTS))
    return f


def test_bench_quick_writes_json_and_plots(tiny_dirs: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    rc = main(["bench", "--quick", "--target", str(tiny_dirs["llama"]), "--draft", str(tiny_dirs["draft"]),
               "--workload", str(_workload(tmp_path)), "--threads", "1", "--out", str(out), "--no-progress",
               "--gammas", "1,3,auto", "--reps", "2", "--cost-repeats", "3"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "draft/g3" in table and "hf-plain" in table
    data = json.loads((out / "bench.json").read_text())  # strict JSON: no NaN
    cfg = data["config"]
    assert cfg["threads"] == 1 and cfg["dtype"] == "float32" and cfg["versions"]["torch"]
    names = {m["name"]: m for m in data["methods"]}
    assert {"plain", "draft/g1", "draft/g3", "lookup/k4", "hf-plain", "hf-assisted/g4", "hf-lookup/k4"} <= set(names)
    for name, m in names.items():
        assert m["status"] == "ok", (name, m["reason"])
        overall = m["categories"]["overall"]
        assert overall["n_runs"] == 2 * len(PROMPTS) and overall["tokens_per_s"]["mean"] > 0
        if m["runtime"] == "specdecode":  # greedy speculation must reproduce plain decoding exactly
            assert overall["exact_match"] == 1.0
    assert set(data["categories"]) == {"completion", "editing", "long", "overall"}
    g3 = names["draft/g3"]["categories"]["overall"]
    assert 1.0 <= g3["tau"] <= 4.0 and len(g3["acceptance_by_position"]) == 3
    assert g3["predicted_speedup"] > 0 and g3["c"] > 0 and g3["v"] > 0
    assert names["plain"]["categories"]["overall"]["speedup"]["mean"] == pytest.approx(1.0)
    auto = [m for m in data["methods"] if m["family"] == "draft-auto"]  # γ picked by the cost model
    assert len(auto) == 1 and auto[0]["name"] == "draft/auto" and auto[0]["status"] == "ok"
    assert auto[0]["categories"]["overall"]["exact_match"] == 1.0
    assert data["costs"]["c"] > 0
    assert "```" in (out / "results.md").read_text()
    for png in ("speedup_vs_gamma.png", "tau_vs_theory.png", "acceptance_by_position.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class Perturbed:
    """Plain decoding with one token changed: the exact-match check must flag it."""

    runtime = "specdecode"

    def __init__(self, inner: Method) -> None:
        self.inner, self.name, self.family, self.setting = inner, "perturbed", "perturbed", None

    def run(self, prompt: list[int], max_new_tokens: int) -> RunOutput:
        out = self.inner.run(prompt, max_new_tokens)
        ids = list(out.token_ids)
        ids[len(ids) // 2] = (ids[len(ids) // 2] + 1) % 300
        return RunOutput(ids, out.seconds, out.steps, out.draft_seconds)


def _perturbed(ctx: BenchContext, setting: Optional[int]) -> Method:
    return Perturbed(OursMethod("plain", "plain", None, ctx.target, None, ctx.ignore_eos))


def test_exact_match_catches_a_wrong_method(tiny_dirs: dict[str, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(REGISTRY, "perturbed", MethodSpec("perturbed", "specdecode", "none", _perturbed, "test"))
    out = tmp_path / "out"
    main(["bench", "--target", str(tiny_dirs["llama"]), "--workload", str(_workload(tmp_path)),
          "--methods", "plain,perturbed,hf-assisted", "--reps", "1", "--threads", "1", "--out", str(out),
          "--no-plots", "--no-progress", "--cost-repeats", "2"])
    printed = capsys.readouterr().out
    data = json.loads((out / "bench.json").read_text())
    names = {m["name"]: m for m in data["methods"]}
    assert names["perturbed"]["categories"]["overall"]["exact_match"] == 0.0
    assert names["plain"]["categories"]["overall"]["exact_match"] == 1.0
    assert {(m["method"], m["workload"]) for m in data["mismatches"]} == {("perturbed", w[0]) for w in PROMPTS}
    assert "perturbed on e1" in printed and "differ from plain decoding" in printed
    # no --draft: the assisted peer is listed as skipped, with the reason, not silently dropped
    skipped = [m for m in data["methods"] if m["status"] == "skipped"]
    assert [m["family"] for m in skipped] == ["hf-assisted"] and "draft" in skipped[0]["reason"]
    assert "skipped: hf-assisted" in printed
