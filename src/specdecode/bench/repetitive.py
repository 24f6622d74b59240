"""The repetitive workload: where agents and editors repeat themselves (suffix drafting's home ground).

Two kinds of sessions, each a run of requests in order (the bench runs prompts in file order, so a
session's later turns come after its earlier ones, as in a real agent loop):

* ``edit``: multi-turn edits of the same held-out function: turn 1 renames a variable, each later
  turn renames one more in the result of the previous turn, the last re-indents it. Every answer
  is the file again with a small change: it repeats the prompt and the previous turns' answers.
* ``agent``: an agent's tool-call log over a held-out file (read, search, read a range, run the
  tests, ...) in one fixed format; each turn shows the log so far and the model writes the next
  calls. Every answer repeats the format the earlier answers used.

Built deterministically from the held-out split (``specdecode.train.data``) by
``scripts/make_workloads.py``; category ``repetitive``, ids ``repetitive-<kind>-<session>-t<turn>``.
"""

from __future__ import annotations

import ast
import random
import textwrap
from collections.abc import Sequence

from .workloads import (
    _SHORT_NAMES,
    SKIP_PREFIXES,
    SourceFile,
    Workload,
    _budget,
    _functions_in,
    _reindent,
    _rename,
    _spread,
)

REPETITIVE = "repetitive"
TURNS = 4
MAX_CODE_CHARS = 640  # prompt (the code once) + answer (the code again) fit the bundled target's 512-token window
AGENT_WINDOW = 6  # tool calls shown per turn: the log's tail, as agents trim their context


def _rename_targets(fn: ast.FunctionDef | ast.AsyncFunctionDef, code: str) -> list[str]:
    """Parameters and locals used at least twice, in order of first appearance in the code."""
    names: dict[str, int] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            names[node.id] = names.get(node.id, 0) + 1
        elif isinstance(node, ast.arg) and node.arg not in ("self", "cls"):
            names[node.arg] = names.get(node.arg, 0) + 1
    params = [a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")]
    locals_ = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    seen = []
    for x in params + sorted(locals_, key=lambda v: code.find(v)):
        if names.get(x, 0) >= 2 and x not in seen:
            seen.append(x)
    return seen


def _new_name(var: str) -> str:
    return _SHORT_NAMES.get(var, f"{var}_value" if len(var) > 2 else f"{var}_var")


def edit_sessions(files: Sequence[SourceFile], n: int, rng: random.Random, turns: int = TURNS) -> list[Workload]:
    """``n`` sessions of ``turns`` edits of one function each (see the module docstring)."""
    cands = []
    for f, lines, fn in _functions_in(files):
        if fn.decorator_list:
            continue
        code = textwrap.dedent("".join(lines[fn.lineno - 1:fn.end_lineno]))
        if not 8 <= code.count("\n") <= 24 or len(code) > MAX_CODE_CHARS or "\t" in code:
            continue
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        inner = tree.body[0]
        assert isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))
        targets = _rename_targets(inner, code)
        if len(targets) >= turns - 1:
            cands.append((f.rel, fn.lineno, fn.name, code, targets))
    out: list[Workload] = []
    for s, (rel, line, name, code, targets) in enumerate(_spread(cands, n, rng)):
        current = code
        for t in range(turns):
            if t < turns - 1:
                var = targets[t]
                new = _new_name(var)
                task = f"# Task: rename the variable `{var}` to `{new}` in the function below. Change nothing else."
                answer = _rename(current, var, new)
                start = answer.splitlines(keepends=True)[0]
            else:
                task = "# Task: reformat the function below with 2-space indentation. Change nothing else."
                answer = _reindent(current)
                start = "".join(answer.splitlines(keepends=True)[:2])
            prompt = f"{task}\n\n# Before:\n{current}\n\n# After:\n{start}"
            out.append(Workload(f"{REPETITIVE}-edit-{s:02d}-{name}-t{t}", REPETITIVE, prompt,
                                _budget(len(answer) - len(start), 64, 256), f"{rel}:{line}"))
            current = answer
    return out


def _agent_steps(rel: str, names: Sequence[str], rng: random.Random) -> list[str]:
    """One tool call per line, as a Python list of dicts (the format a code model continues best)."""
    steps = [f'    {{"tool": "read_file", "args": {{"path": "{rel}"}}, "result": "ok"}},']
    for name in names:
        lo = rng.randrange(20, 400)
        steps.append(f'    {{"tool": "search", "args": {{"pattern": "def {name}", "path": "{rel}"}}, '
                     f'"result": "line {lo}"}},')
        steps.append(f'    {{"tool": "read_range", "args": {{"path": "{rel}", "start": {lo}, "end": {lo + 30}}}, '
                     f'"result": "ok"}},')
        steps.append(f'    {{"tool": "run_tests", "args": {{"path": "{rel}", "filter": "{name}"}}, '
                     f'"result": "{rng.choice(("passed", "failed: 1", "passed"))}"}},')
    return steps


def agent_sessions(files: Sequence[SourceFile], n: int, rng: random.Random, turns: int = TURNS,
                   max_new_tokens: int = 128) -> list[Workload]:
    """``n`` agent-loop sessions of ``turns`` requests each over one held-out file (see the module docstring)."""
    by_file: dict[str, list[str]] = {}
    for f, _, fn in _functions_in(files):
        if not fn.name.startswith("_"):
            by_file.setdefault(f.rel, []).append(fn.name)
    cands = [(rel, 0, "agent", names) for rel, names in sorted(by_file.items()) if len(names) >= turns + 2]
    out: list[Workload] = []
    for s, (rel, _, _, names) in enumerate(_spread(cands, n, rng)):
        picked = sorted(rng.sample(names, turns + 2), key=names.index)
        steps = _agent_steps(rel, picked, rng)
        header = (f"# Agent log: fix the failing test in {rel}. One tool call per step.\n"
                  "steps = [\n")
        for t in range(turns):
            shown = steps[: 4 + 3 * t][-AGENT_WINDOW:]
            prompt = header + "\n".join(shown) + '\n    {"tool": "'
            out.append(Workload(f"{REPETITIVE}-agent-{s:02d}-t{t}", REPETITIVE, prompt, max_new_tokens, rel))
    return out


def build_repetitive_workloads(files: Sequence[SourceFile], seed: int = 0, n_edit: int = 5, n_agent: int = 3,
                               turns: int = TURNS) -> list[Workload]:
    files = sorted((f for f in files if not f.rel.startswith(SKIP_PREFIXES)), key=lambda f: f.rel)
    return (edit_sessions(files, n_edit, random.Random(seed + 10), turns)
            + agent_sessions(files, n_agent, random.Random(seed + 11), turns))


def mixed(default: Sequence[Workload], repetitive: Sequence[Workload], per_category: int | None = None
          ) -> list[Workload]:
    """The default workload's records then the repetitive ones (sessions stay in order): the mixed workload."""
    counts: dict[str, int] = {}
    out = []
    for w in default:
        counts[w.category] = counts.get(w.category, 0) + 1
        if per_category is None or counts[w.category] <= per_category:
            out.append(w)
    return out + list(repetitive)
