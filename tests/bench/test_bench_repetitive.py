"""The repetitive workload (suffix drafting's home ground) and the bench methods for suffix and auto."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import specdecode
from specdecode.bench.runners import BenchContext, build_methods, method_table
from specdecode.bench.workloads import DEFAULT_WORKLOAD, WORKLOAD_DIR, load_workloads

ROOT = Path(__file__).resolve().parents[2]
REPETITIVE = WORKLOAD_DIR / "repetitive-heldout-v1.jsonl"
MIXED = WORKLOAD_DIR / "mixed-heldout-v1.jsonl"


def test_repetitive_workload_shape_and_sessions() -> None:
    ws = load_workloads(REPETITIVE)
    assert {w.category for w in ws} == {"repetitive"}
    edits = [w for w in ws if w.id.startswith("repetitive-edit-")]
    agents = [w for w in ws if w.id.startswith("repetitive-agent-")]
    assert len(edits) >= 16 and len(agents) >= 8
    # turns of one session are consecutive and in order; each edit turn's "Before" is the previous turn's answer
    by_session: dict[str, list[str]] = {}
    for w in edits:
        session, turn = w.id.rsplit("-t", 1)
        by_session.setdefault(session, []).append(turn)
        before = w.prompt.split("# Before:\n", 1)[1].split("\n\n# After:\n", 1)[0]
        assert before.startswith(("def ", "async def "))
    assert all(turns == sorted(turns) for turns in by_session.values())
    for a, b in itertools.pairwise(edits):
        if a.id.rsplit("-t", 1)[0] == b.id.rsplit("-t", 1)[0]:
            old = a.prompt.split("# Before:\n", 1)[1].split("\n\n# After:\n", 1)[0]
            new = b.prompt.split("# Before:\n", 1)[1].split("\n\n# After:\n", 1)[0]
            assert old != new and len(set(old.split()) & set(new.split())) > len(set(old.split())) // 2
    for w in agents:
        assert w.prompt.endswith('\n    {"tool": "') and w.prompt.count('"tool"') >= 4


def test_repetitive_workloads_come_from_held_out_files_and_are_reproducible() -> None:
    from specdecode.train.data import held_out_files

    held = {f.rel for f in held_out_files()}
    for w in load_workloads(REPETITIVE):
        assert w.source.rsplit(":", 1)[0] in held, w.id
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_repetitive_workload.py"), "--check"],
                       check=False, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mixed_workload_holds_every_category() -> None:
    cats = {w.category for w in load_workloads(MIXED)}
    assert cats == {w.category for w in load_workloads(DEFAULT_WORKLOAD)} | {"repetitive"}


def test_history_methods_forget_when_a_prompt_comes_round_again(tiny_dirs: dict[str, Path]) -> None:
    target = specdecode.load_model(tiny_dirs["llama"])
    draft = specdecode.load_model(tiny_dirs["draft"])
    ctx = BenchContext(target, draft, str(target.path), str(draft.path))
    methods, skipped = build_methods(ctx, ["suffix", "auto"], {})
    assert [m.name for m in methods] == ["suffix", "auto"] and not skipped
    prompt = target.encode("def fib(n):\n    if n < 2:\n        return n\n")
    plain = specdecode.generate(target, prompt, max_new_tokens=32, ignore_eos=True).token_ids
    other = target.encode("class A:\n    pass\n")
    for m in methods:
        forgotten: list[int] = []
        inner = m._forget  # type: ignore[attr-defined]
        m._forget = lambda inner=inner, seen=forgotten: (seen.append(1), inner())  # type: ignore[attr-defined]
        first = m.run(prompt, 32)
        m.run(other, 8)
        assert not forgotten  # new prompts: the history is kept (a session's turns build on each other)
        again = m.run(prompt, 32)  # the next repetition: it must not draft from the first run's output
        assert len(forgotten) == 1
        assert first.token_ids == again.token_ids == plain
    assert "suffix" in method_table() and "auto" in method_table()


def test_suffix_forget_empties_the_shared_index(tiny_dirs: dict[str, Path]) -> None:
    from specdecode.drafters.registry import DrafterOptions, build_drafter

    target = specdecode.load_model(tiny_dirs["llama"])
    d = build_drafter("suffix", DrafterOptions())
    specdecode.generate(target, "def fib(n):\n", drafter=d, max_new_tokens=16, ignore_eos=True)
    assert d.shared.n_tokens > 0
    d.forget()
    assert d.shared.n_tokens == 0 and not d.shared.index
