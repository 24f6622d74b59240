"""The CLI, the server and the bench only iterate the drafter registry: no drafter name, drafter option,
artifact or bench variant of a registered drafter appears in their code (docstrings and comments may
explain; string literals and identifiers may not), so adding a drafter never touches them.

Every string literal that is not a docstring and every identifier is searched for a registered name
(drafter, option key, option or artifact flag, artifact, bench family or label) as a whole word
(``_`` read as ``-``). Names that are ordinary words or values too ("model", "auto" (also γ's value),
"none", "draft", "plain", ...) are left out: the code must use them in their other sense, and the
registry's constants (``PAIRED_DEFAULT``, ``PLAIN``) where it means the drafter. ``ALLOWED`` lists the
few uses that are about a drafter but belong where they are, each with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from specdecode.bench.ours import bench_families
from specdecode.drafters.registry import REGISTRY

SRC = Path(__file__).resolve().parents[2] / "src" / "specdecode"
SCANNED = [SRC / "cli.py", *sorted((SRC / "server").glob("*.py")), *sorted((SRC / "bench").glob("*.py"))]
COMMON = {"model", "auto", "none", "suffix", "quant", "plain", "draft", "lookup"}  # words with other meanings too

# (file relative to src/specdecode, literal or identifier): why it is not about a registered drafter
ALLOWED: dict[tuple[str, str], str] = {
    ("bench/peers.py", "ngram"): "transformers' own argument, max_matching_ngram_size, for the prompt-lookup peer",
    ("bench/peers.py", "ngram-max"): "the peer matches our prompt lookup's n-gram size (PEER_NGRAM_OPTION)",
}


def _names() -> set[str]:
    """The registered names that are not ordinary words, flags without their dashes."""
    names: set[str] = set()
    for spec in REGISTRY.values():
        names.add(spec.name)
        for o in spec.options:
            names |= {o.key, *o.flag_names}
        for a in spec.artifacts:
            names |= {a.name, a.flag}
    names |= {n for b in bench_families() for n in (b.family, b.label)}  # declared and derived
    return {n.lstrip("-").replace("_", "-") for n in names} - COMMON


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _uses(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every non-docstring string constant and every identifier in ``path``."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            out.append((node.lineno, node.name))
        elif isinstance(node, ast.arg):
            out.append((node.lineno, node.arg))
        elif isinstance(node, ast.keyword) and node.arg:
            out.append((node.lineno, node.arg))
    return out


def find_drafter_names(path: Path, rel: str, names: set[str]) -> list[str]:
    words = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    pattern = re.compile(f"(?<![a-z0-9])({words})(?![a-z0-9])", re.IGNORECASE)
    hits = []
    for line, text in _uses(path):
        matches = [m.group(1).lower() for m in pattern.finditer(text.replace("_", "-"))]
        if not matches:
            continue
        found = max(matches, key=len)
        if (rel, found) not in ALLOWED:
            hits.append(f"{rel}:{line}: {found!r} in {text[:70]!r}")
    return hits


def test_the_scan_would_catch_a_drafter_name(tmp_path: Path) -> None:
    """Not vacuous: a planted drafter name, option and flag are each found."""
    planted = tmp_path / "planted.py"
    planted.write_text('X = "medusa"\nY = args.exit_layer\nZ = ["--ngram-max", "a model"]\ndef is_eagle_dir(): ...\n')
    hits = find_drafter_names(planted, "bench/planted.py", _names())
    assert sorted(h.split("'")[1] for h in hits) == ["eagle", "exit-layer", "medusa", "ngram-max"], hits


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: p.relative_to(SRC).as_posix())
def test_no_drafter_names_outside_the_registry(path: Path) -> None:
    hits = find_drafter_names(path, path.relative_to(SRC).as_posix(), _names())
    assert not hits, "drafter-specific names outside the registry (derive them from the specs):\n" + "\n".join(hits)


def test_every_allowance_is_still_needed() -> None:
    """The allow-list stays tight: an entry no scanned file needs any more is an error."""
    names = _names()
    used = set()
    for path in SCANNED:
        rel = path.relative_to(SRC).as_posix()
        saved = {k: ALLOWED.pop(k) for k in [k for k in ALLOWED if k[0] == rel]}
        try:
            used |= {(rel, h.split("'")[1]) for h in find_drafter_names(path, rel, names)}
        finally:
            ALLOWED.update(saved)
    assert set(ALLOWED) <= used, set(ALLOWED) - used
