"""Held-out check: is any benchmark prompt in a drafter's training data?

A drafter trained on the prompts it is measured on shows an acceptance nobody will
see in use. This check reads training-corpus files (text, or JSONL whose string
values are the text: ``{"text": ...}``, chat ``messages``, anything) and reports every
workload prompt whose word n-grams appear there.

Matching is on normalised words (lower case, runs of letters and digits; so
whitespace, punctuation and markup do not hide a copy), n = 13 by default, the
contamination test of the GPT-3 paper. A prompt shorter than n words is matched
whole. A prompt is reported with the share of its n-grams found; any share above
``min_fraction`` (default 0: a single shared 13-gram) counts as found.

    python -m specdecode.bench.heldout --workload real corpus/*.jsonl   # exit 1 if any prompt is found
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

from .workloads import Workload, load_workloads, resolve_workload

DEFAULT_N = 13
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """Normalised words: what two copies of a text share whatever their spacing and punctuation."""
    return _WORD.findall(text.lower())


def prompt_text(w: Workload) -> str:
    """The text a prompt's author wrote: its messages' contents (not a template's role markers)."""
    return "\n".join(c for _, c in w.messages) if w.messages else w.prompt


def ngrams(ws: Sequence[str], n: int) -> set[tuple[str, ...]]:
    if len(ws) <= n:
        return {tuple(ws)} if ws else set()
    return {tuple(ws[i:i + n]) for i in range(len(ws) - n + 1)}


@dataclass
class Found:
    workload: str
    category: str
    matched: int  # the prompt's n-grams found in the corpus
    total: int
    files: list[str]  # where (first few)

    @property
    def fraction(self) -> float:
        return self.matched / self.total if self.total else 0.0


def _strings(x: Any) -> Iterator[str]:
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)


def corpus_documents(path: Path) -> Iterator[Iterable[str]]:
    """A file's documents, each as a stream of text pieces: a JSONL line's strings, or the whole text file."""
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.strip():
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        yield (line,)  # a stray text line is still text
                    else:
                        yield from ((s,) for s in _strings(rec))
    else:
        with path.open(encoding="utf-8", errors="replace") as fh:
            yield fh  # lines, so a large file streams


def check(workloads: Sequence[Workload], files: Sequence[str | Path], n: int = DEFAULT_N,
          min_fraction: float = 0.0) -> list[Found]:
    """Every workload prompt with more than ``min_fraction`` of its n-grams in ``files``, most found first.

    The prompts' n-grams (a few thousand) go in a set; the corpus streams past once,
    each window of every length in use looked up, so corpus size only costs time.
    """
    wanted: dict[tuple[str, ...], list[int]] = {}
    totals = []
    for i, w in enumerate(workloads):
        grams = ngrams(words(prompt_text(w)), n)
        totals.append(len(grams))
        for g in grams:
            wanted.setdefault(g, []).append(i)
    sizes = sorted({len(g) for g in wanted})
    longest = max(sizes, default=1)
    last_words = {g[-1] for g in wanted}  # most windows end in a word no prompt n-gram ends in
    hit: dict[int, set[tuple[str, ...]]] = {}
    where: dict[int, list[str]] = {}
    for f in files:
        path = Path(f)
        for doc in corpus_documents(path):
            window: list[str] = []
            for piece in doc:
                for word in words(piece):
                    window.append(word)
                    if len(window) > 4 * longest:
                        del window[:-longest]
                    if word not in last_words:
                        continue
                    for k in sizes:
                        for i in wanted.get(tuple(window[-k:]), ()) if len(window) >= k else ():
                            hit.setdefault(i, set()).add(tuple(window[-k:]))
                            if str(path) not in where.setdefault(i, []) and len(where[i]) < 5:
                                where[i].append(str(path))
    out = [Found(workloads[i].id, workloads[i].category, len(gs), totals[i], where.get(i, []))
           for i, gs in hit.items()]
    return sorted((x for x in out if x.fraction > min_fraction), key=lambda x: (-x.fraction, x.workload))


def format_found(found: Sequence[Found], n_prompts: int, n: int) -> str:
    if not found:
        return f"held out: none of the {n_prompts} prompts shares a {n}-word sequence with the corpus"
    lines = [f"{len(found)} of {n_prompts} prompts found in the corpus ({n}-word sequences):"]
    lines += [f"  {x.workload} ({x.category}): {x.matched}/{x.total} = {x.fraction:.0%} in {', '.join(x.files)}"
              for x in found]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdecode.bench.heldout",
                                 description="Report every benchmark prompt found in training-corpus files "
                                             "(normalised word n-grams); exit 1 if any is found.")
    ap.add_argument("corpus", nargs="+", help="training files: text, or .jsonl (every string value is read)")
    ap.add_argument("--workload", default="real", help="a workload JSONL or short name (default: %(default)s)")
    ap.add_argument("-n", type=int, default=DEFAULT_N, help="words per n-gram (default: %(default)s)")
    ap.add_argument("--min-fraction", type=float, default=0.0,
                    help="report a prompt only when more than this share of its n-grams is found (default: 0)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("-n must be >= 1")
    missing = [c for c in args.corpus if not Path(c).is_file()]
    if missing:
        ap.error(f"no such file(s): {missing}")
    ws = load_workloads(resolve_workload(args.workload))
    found = check(ws, args.corpus, args.n, args.min_fraction)
    if args.json:
        print(json.dumps({"workload": args.workload, "n": args.n, "prompts": len(ws), "corpus": args.corpus,
                          "found": [{**x.__dict__, "fraction": x.fraction} for x in found]}))
    else:
        print(format_found(found, len(ws), args.n))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
