"""Benchmark workloads: JSONL records (id, category, prompt, max_new_tokens) built from held-out code.

A record may carry ``messages`` (a chat: role/content objects) instead of ``prompt``;
the bench renders it with the target's chat template (``bench/real.py``), and
``prompt`` holds a plain rendering for readers that want text (see ``plain_chat``).

The prompts come only from the held-out split of the training corpus
(``specdecode.train.data.held_out_files``) so a measured acceptance rate is not
inflated by the models having memorised the text. The files are generated once
by ``scripts/make_workloads.py`` and versioned: results stay comparable across
commits even if the corpus or the interpreter's stdlib changes.
"""

from __future__ import annotations

import ast
import json
import random
import sys
import textwrap
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

from ..config import ConfigError
from ..jsonl import read_jsonl

WORKLOAD_DIR = Path(__file__).parent / "workloads"
DEFAULT_WORKLOAD = WORKLOAD_DIR / "stdlib-heldout-v1.jsonl"
REAL_WORKLOAD = WORKLOAD_DIR / "real-v1.jsonl"
# --workload NAME: the shipped files by short name (an existing file of that name wins)
NAMED_WORKLOADS = {"stdlib": DEFAULT_WORKLOAD, "mixed": WORKLOAD_DIR / "mixed-heldout-v1.jsonl",
                   "repetitive": WORKLOAD_DIR / "repetitive-heldout-v1.jsonl", "real": REAL_WORKLOAD,
                   "prose": WORKLOAD_DIR / "prose-continuation-v1.jsonl"}

COMPLETION, EDITING, LONG = "completion", "editing", "long"
CATEGORIES = (COMPLETION, EDITING, LONG)


@dataclass(frozen=True)
class Workload:
    id: str
    category: str
    prompt: str
    max_new_tokens: int
    source: str = ""  # where the text came from (file:line), for humans
    messages: Optional[tuple[tuple[str, str], ...]] = None  # (role, content) turns of a chat prompt

    def to_json(self) -> str:
        rec: dict[str, Any] = asdict(self)
        if self.messages is None:
            del rec["messages"]  # plain-text records stay as they were
        else:
            del rec["prompt"]  # derived from the messages when read back
            rec["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        return json.dumps(rec, ensure_ascii=False)


def plain_chat(messages: Sequence[tuple[str, str]]) -> str:
    """A chat as text, as chat.py's PLAIN_TEMPLATE renders it (no jinja needed to read a file)."""
    return "".join(f"{r.capitalize()}: {c}\n" for r, c in messages) + "Assistant:"


def resolve_workload(name: Optional[str]) -> Path:
    """--workload: a JSONL path, or a shipped workload's short name (stdlib, mixed, repetitive, real)."""
    if name is None:
        return DEFAULT_WORKLOAD
    p = Path(name)
    if p.is_file() or name not in NAMED_WORKLOADS:
        return p
    return NAMED_WORKLOADS[name]


def stop_at_eos(asked: Optional[bool], workload: str, llama_cpp: bool) -> bool:
    """--stop-at-eos as given, else on for the chat workload 'real' (text past the answer's end would inflate
    speedups; greedy outputs are identical, so every method still emits the same tokens) unless llama.cpp runs
    beside us: llama-bench always writes the full budget, so ours does too and the budgets match."""
    if asked is None:
        return workload == "real" and not llama_cpp
    if asked and llama_cpp:
        print("bench: --stop-at-eos with --llama-cpp: llama.cpp's runs still write the full budget (llama-bench "
              "cannot stop at EOS), so its tok/s and ours count different tokens", file=sys.stderr)
    return asked


def _messages(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: messages must be a non-empty list of {{role, content}} objects")
    out = []
    for m in value:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ConfigError(f"{where}: each message needs string 'role' and 'content', got {m!r}")
        out.append((m["role"], m["content"]))
    return tuple(out)


def load_workloads(path: str | Path) -> list[Workload]:
    """Read a JSONL workload file; errors name the line and the missing or bad field."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"workload file {p} does not exist")
    out: list[Workload] = []
    seen: set[str] = set()
    for i, rec in read_jsonl(p):
        text = "messages" if "messages" in rec else "prompt"
        missing = [k for k in ("id", "category", text, "max_new_tokens") if k not in rec]
        if missing:
            raise ConfigError(f"{p}:{i}: missing field(s) {missing}; need id, category, prompt (or messages), "
                              "max_new_tokens")
        n = rec["max_new_tokens"]
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"{p}:{i}: max_new_tokens must be a positive integer, got {n!r}")
        messages = _messages(rec["messages"], f"{p}:{i}") if text == "messages" else None
        prompt = plain_chat(messages) if messages else rec["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise ConfigError(f"{p}:{i}: prompt must be a non-empty string")
        wid = str(rec["id"])
        if wid in seen:
            raise ConfigError(f"{p}:{i}: duplicate id {wid!r}")
        seen.add(wid)
        out.append(Workload(wid, str(rec["category"]), prompt, n, str(rec.get("source", "")), messages))
    if not out:
        raise ConfigError(f"workload file {p} holds no records")
    return out


def save_workloads(workloads: Iterable[Workload], path: str | Path) -> None:
    Path(path).write_text("".join(w.to_json() + "\n" for w in workloads), encoding="utf-8")


def select(workloads: Sequence[Workload], per_category: Optional[int] = None,
           max_new_tokens: Optional[int] = None) -> list[Workload]:
    """The first ``per_category`` prompts of each category (file order), budgets capped at ``max_new_tokens``."""
    counts: dict[str, int] = {}
    out = []
    for w in workloads:
        if per_category is not None and counts.get(w.category, 0) >= per_category:
            continue
        counts[w.category] = counts.get(w.category, 0) + 1
        n = w.max_new_tokens if max_new_tokens is None else min(w.max_new_tokens, max_new_tokens)
        out.append(replace(w, max_new_tokens=n))
    return out


# ---------------------------------------------------------------------------
# Building the default workloads from held-out source files
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class SourceFile:
    rel: str
    text: str


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _functions_in(files: Sequence[SourceFile]
                  ) -> Iterator[tuple[SourceFile, list[str], ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(file, its lines with line ends, function) for every function of every file that parses."""
    for f in files:
        tree = _parse(f)
        if tree is not None:
            lines = f.text.splitlines(keepends=True)
            for fn in _functions(tree):
                yield f, lines, fn


def _docstring_end(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> Optional[int]:
    """Last line (1-based) of the function's or class's docstring, if it has one."""
    if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
            and isinstance(fn.body[0].value.value, str):
        return fn.body[0].end_lineno
    return None


def _parse(src: SourceFile) -> Optional[ast.Module]:
    try:
        return ast.parse(src.text)
    except SyntaxError:  # lib2to3 and friends hold some Python 2 snippets
        return None


def _budget(chars: int, lo: int, hi: int) -> int:
    """A token budget for about ``chars`` characters of code (≈3 characters per BPE token), a multiple of 16."""
    est = -(-chars // 3)
    return max(lo, min(hi, -(-est // 16) * 16))


def completion_workloads(files: Sequence[SourceFile], n: int, rng: random.Random, context_lines: int = 24,
                         max_new_tokens: int = 128) -> list[Workload]:
    """Function bodies to write from the signature + docstring, with the lines just above for context."""
    cands = []
    for f, lines, fn in _functions_in(files):
        doc_end = _docstring_end(fn)
        body_lines = (fn.end_lineno or fn.lineno) - (doc_end or 0)
        if doc_end is None or not 3 <= body_lines <= 60:
            continue
        start = (fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno) - 1
        prompt = "".join(lines[max(0, start - context_lines):doc_end])
        if len(prompt) > 2500:
            continue
        cands.append((f.rel, fn.lineno, fn.name, prompt))
    picked = _spread(cands, n, rng)
    return [Workload(f"completion-{i:02d}-{name}", COMPLETION, prompt, max_new_tokens, f"{rel}:{line}")
            for i, (rel, line, name, prompt) in enumerate(picked)]


EDIT_KINDS = ("rename", "typehints", "reformat")
_SHORT_NAMES = {"s": "text", "n": "count", "i": "index", "k": "key", "v": "value", "x": "item", "f": "fileobj",
                "d": "mapping", "e": "error", "c": "char", "l": "items", "p": "path", "t": "token", "m": "match"}


def _rename(code: str, old: str, new: str) -> str:
    """Rename variable/parameter ``old`` by AST positions (attributes and keywords stay untouched)."""
    tree = ast.parse(code)
    spots = sorted({(n.lineno, n.col_offset) for n in ast.walk(tree)
                    if (isinstance(n, ast.Name) and n.id == old) or (isinstance(n, ast.arg) and n.arg == old)},
                   reverse=True)
    lines = code.splitlines(keepends=True)
    for ln, col in spots:
        s = lines[ln - 1]
        b = s.encode("utf-8")  # col_offset counts UTF-8 bytes
        lines[ln - 1] = (b[:col] + new.encode() + b[col + len(old.encode()):]).decode("utf-8")
    return "".join(lines)


def _rename_target(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Optional[str]:
    names: dict[str, int] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            names[node.id] = names.get(node.id, 0) + 1
        elif isinstance(node, ast.arg) and node.arg not in ("self", "cls"):
            names[node.arg] = names.get(node.arg, 0) + 1
    params = [a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")]
    locals_ = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    options = [x for x in params + sorted(locals_) if names.get(x, 0) >= 3]
    return options[0] if options else None


def _reindent(code: str, width: int = 2) -> str:
    out = []
    for line in code.splitlines(keepends=True):
        stripped = line.lstrip(" ")
        depth = (len(line) - len(stripped)) // 4
        rest = (len(line) - len(stripped)) % 4
        out.append(" " * (depth * width + rest) + stripped)
    return "".join(out)


def editing_workloads(files: Sequence[SourceFile], n: int, rng: random.Random) -> list[Workload]:
    """Rewrite tasks whose answer mostly copies the code in the prompt: rename, add type hints, re-indent.

    Phrased as comments followed by the original and the start of the rewrite, so a
    plain code model (no instruction tuning) continues by copying.
    """
    cands = []
    for f, lines, fn in _functions_in(files):
        if fn.decorator_list:
            continue
        code = textwrap.dedent("".join(lines[fn.lineno - 1:fn.end_lineno]))
        if not 8 <= code.count("\n") <= 30 or len(code) > 1400 or "\t" in code:
            continue
        try:
            ast.parse(code)
        except SyntaxError:
            continue
        cands.append((f.rel, fn.lineno, fn.name, code, _rename_target(fn)))
    picked = _spread(cands, n * 2, rng)
    out: list[Workload] = []
    for rel, line, name, code, var in picked:
        kind = EDIT_KINDS[len(out) % len(EDIT_KINDS)]
        if kind == "rename":
            if var is None:
                continue
            new = _SHORT_NAMES.get(var, f"{var}_value" if len(var) > 2 else f"{var}_var")
            rewritten = _rename(code, var, new)
            task = f"# Task: rename the variable `{var}` to `{new}` in the function below. Change nothing else."
            start = rewritten.splitlines(keepends=True)[0]
        elif kind == "typehints":
            task = "# Task: add type hints to the signature of the function below. Keep the body unchanged."
            start = code[: code.index("(") + 1]
        else:
            task = "# Task: reformat the function below with 2-space indentation. Change nothing else."
            start = "".join(_reindent(code).splitlines(keepends=True)[:2])
        prompt = f"{task}\n\n# Before:\n{code}\n\n# After:\n{start}"
        out.append(Workload(f"editing-{len(out):02d}-{kind}-{name}", EDITING, prompt,
                            _budget(len(code) - len(start), 64, 256), f"{rel}:{line}"))
        if len(out) == n:
            break
    return out


def long_workloads(files: Sequence[SourceFile], n: int, rng: random.Random, max_new_tokens: int = 512,
                   max_prompt_chars: int = 1200, min_prompt_chars: int = 300, context_lines: int = 12
                   ) -> list[Workload]:
    """Open-ended continuation (≥ 512 new tokens): a module's opening lines or a class's header and docstring."""
    cands = []
    for f in files:
        tree = _parse(f)
        if tree is None or len(f.text) < 6000:
            continue
        lines = f.text.splitlines(keepends=True)
        head = ""
        for ln in lines:
            if len(head) + len(ln) > max_prompt_chars:
                break
            head += ln
        cands.append((f.rel, 1, "module", head))
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            doc_end = _docstring_end(node)
            if doc_end is None:
                continue
            text = "".join(lines[node.lineno - 1:doc_end])
            for ln in reversed(lines[max(0, node.lineno - 1 - context_lines):node.lineno - 1]):
                if len(text) + len(ln) > max_prompt_chars:
                    break
                text = ln + text  # lines above the class: what the module was doing there
            if min_prompt_chars <= len(text) <= max_prompt_chars:
                cands.append((f.rel, node.lineno, node.name, text))
    picked = _spread(cands, n, rng)
    return [Workload(f"long-{i:02d}-{name}", LONG, prompt, max_new_tokens, f"{rel}:{line}")
            for i, (rel, line, name, prompt) in enumerate(picked)]


def _spread(cands: list, n: int, rng: random.Random) -> list:
    """Pick ``n`` candidates deterministically, at most one per file first, then a second round, ..."""
    by_file: dict[str, list] = {}
    for c in cands:
        by_file.setdefault(c[0], []).append(c)
    for v in by_file.values():
        rng.shuffle(v)
    order = sorted(by_file)
    rng.shuffle(order)
    out: list = []
    while len(out) < n and any(by_file[k] for k in order):
        for k in order:
            if by_file[k] and len(out) < n:
                out.append(by_file[k].pop())
    return out


# Files whose "code" is a data table (codec maps) tell us nothing about code generation.
SKIP_PREFIXES = ("encodings/",)


def build_default_workloads(files: Sequence[SourceFile], seed: int = 0, n_completion: int = 12,
                            n_editing: int = 12, n_long: int = 4) -> list[Workload]:
    files = sorted((f for f in files if not f.rel.startswith(SKIP_PREFIXES)), key=lambda f: f.rel)
    return (completion_workloads(files, n_completion, random.Random(seed))
            + editing_workloads(files, n_editing, random.Random(seed + 1))
            + long_workloads(files, n_long, random.Random(seed + 2)))
