"""Build a varied instruction-prompt file for ``distill --prompts`` from what this machine holds, offline.

A chat model's drafter should learn the target's answers to the kinds of requests users send. With no
instruction data set at hand (and none to download), this module writes one from:

- **written requests**: templates x topics for open chat, code writing, reasoning (arithmetic word
  problems with seeded random numbers, answered step by step) and explanation;
- **Python's standard library** (the running interpreter's ``lib/python3.X``): short functions to
  explain, document, type-annotate, test, refactor or fix (edit requests, copy-heavy like the bench's);
- **Debian's documentation** (``/usr/share/doc``: READMEs, text and markdown, gzipped or not) and
  **man pages** (``/usr/share/man``, groff markup stripped): passages to summarise, rewrite, proofread,
  turn into bullet points, or ask questions about.

The target writes the answers (``distill --prompts``), so no answer here is anyone's but the target's.
Then the held-out check (``bench/heldout.py``, 13-word sequences) runs against the bench's real
workload (HumanEval included); prompts that share a 13-gram with it are dropped, and the result is
printed and written beside the file (``<out>.heldout.txt``).

    python -m specdecode.train.prompt_set --out runs/chat-prompts.jsonl --n 2000
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import random
import re
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterator, Optional, Sequence

from ..bench.heldout import DEFAULT_N, check, format_found, ngrams, prompt_text, words
from ..bench.workloads import load_workloads, resolve_workload

MAX_PASSAGE_CHARS = 700
MAX_CODE_LINES = 24

CHAT_TOPICS = [
    "black holes", "photosynthesis", "the French Revolution", "machine learning", "climate change", "the immune system",
    "compound interest", "the water cycle", "plate tectonics", "the Roman Empire", "quantum computing", "sleep",
    "healthy eating", "learning a new language", "public speaking", "time management", "renewable energy",
    "the printing press", "volcanoes", "electric cars", "the internet", "vaccines", "the stock market", "bees",
    "the moon landing", "recycling", "meditation", "coffee", "the human brain", "DNA", "earthquakes", "jazz music",
    "the Olympic Games", "rainforests", "inflation", "the solar system", "chess", "gardening", "remote work",
    "cryptography", "the theory of evolution", "ocean tides", "the Great Wall of China", "artificial intelligence",
    "running a marathon", "baking bread", "saving money", "job interviews", "writing a novel", "dinosaurs",
    "the speed of light", "antibiotics", "open source software", "the Renaissance", "democracy", "rainbows",
    "operating systems", "databases", "version control with git", "cloud computing", "password security",
    "the Linux kernel", "unit testing", "recursion", "hash tables", "the HTTP protocol", "email etiquette",
    "travelling on a budget", "learning to play the guitar", "camping", "team work", "procrastination",
]
CHAT_TEMPLATES = [
    "Explain {t} in simple terms.", "What is {t}?", "Can you tell me about {t}?",
    "Give me five interesting facts about {t}.", "Why is {t} important?", "Explain {t} to a ten-year-old.",
    "What are the pros and cons of {t}?", "Write a short poem about {t}.", "Write a short story involving {t}.",
    "What are common misconceptions about {t}?", "How would you teach a beginner about {t}?",
    "Summarize the history of {t} in a paragraph.", "Give me some tips about {t}.",
    "Write a short blog post introduction about {t}.", "What questions should I ask to understand {t} better?",
    "Describe {t} in three sentences.", "Write a haiku about {t}.", "List the key ideas behind {t}.",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the words in a text", "merges two sorted lists", "removes duplicates from a list while keeping order",
    "flattens a nested list", "computes the factorial of n", "checks whether a string is a palindrome",
    "finds the largest element of a list", "converts Celsius to Fahrenheit", "parses a CSV line into fields",
    "computes the greatest common divisor of two numbers", "sorts a list of dictionaries by a key",
    "returns the most frequent element of a list", "validates an email address with a regular expression",
    "reads a text file and returns its lines", "computes the mean and standard deviation of numbers",
    "implements binary search", "implements bubble sort", "transposes a matrix", "chunks a list into pieces of size n",
    "counts the vowels in a string", "converts a Roman numeral to an integer", "generates all permutations of a list",
    "checks whether two strings are anagrams", "computes the sum of the digits of a number",
    "finds all pairs in a list that sum to a target", "capitalizes every word in a sentence",
    "returns the intersection of two lists", "implements a stack class with push and pop",
    "implements a simple LRU cache", "computes the running total of a list", "rotates a list by k positions",
    "converts a number to binary", "finds the longest word in a sentence", "groups words by their first letter",
    "computes the dot product of two vectors", "checks whether brackets in a string are balanced",
    "returns the n largest numbers of a list", "computes the area of a circle", "counts lines in a file",
    "converts a dictionary to a JSON string", "finds the second smallest number in a list",
    "implements a queue using two stacks", "checks whether a year is a leap year",
    "compresses a string like aaabb -> a3b2",
]
CODE_TEMPLATES = [
    "Write a Python function that {t}.", "Write a Python function that {t}. Include a docstring and an example.",
    "How do I write code that {t} in Python?", "Write a JavaScript function that {t}.",
    "Write a Python function that {t}, and explain how it works.", "Write a C function that {t}.",
    "Show me a short Python program that {t}.", "Write a Python function that {t}. Add type hints.",
]
FUNC_TEMPLATES = [
    "Explain what this Python function does:\n```python\n{c}\n```",
    "Add a docstring to this function:\n```python\n{c}\n```",
    "Add type hints to this function:\n```python\n{c}\n```",
    "Write unit tests with pytest for this function:\n```python\n{c}\n```",
    "Refactor this code to make it more readable:\n```python\n{c}\n```",
    "Rewrite this function with clearer variable names:\n```python\n{c}\n```",
    "Is there a bug in this code? Explain.\n```python\n{c}\n```",
    "Add comments to this code:\n```python\n{c}\n```",
    "Rename the function `{name}` to `{new}` everywhere in this code and return the full code:\n```python\n{c}\n```",
    "Remove the comments and docstrings from this code:\n```python\n{c}\n```",
]
TEXT_TEMPLATES = [
    "Summarize the following text in a few sentences:\n\n{p}", "Summarize this:\n\n{p}",
    "Rewrite the following text to make it easier to read:\n\n{p}", "Fix any spelling or grammar mistakes:\n\n{p}",
    "Turn this text into a bulleted list of key points:\n\n{p}", "What is the main idea of this text?\n\n{p}",
    "Rewrite this text in a more formal tone:\n\n{p}",
    "Write three questions a reader could ask about this text:\n\n{p}",
    "Explain this documentation to a beginner:\n\n{p}", "Shorten this text to one paragraph:\n\n{p}",
]
NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kate", "Liam", "Maya"]
ITEMS = ["apples", "books", "pencils", "cookies", "marbles", "stickers", "oranges", "cards", "eggs", "toy cars"]


def word_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 60), rng.randint(2, 25), rng.randint(2, 9)
    n1, n2 = rng.sample(NAMES, 2)
    it = rng.choice(ITEMS)
    price = rng.choice([0.5, 1.25, 2, 3, 4.5, 7, 12])
    kinds = [
        f"{n1} has {a} {it}. {n2} gives {n1} {b} more, and then {n1} shares them equally among {c} friends. "
        f"How many {it} does each friend get, and how many are left over?",
        f"A shop sells {it} at ${price} each. {n1} buys {a} of them and pays with a ${(int(a * price) // 10 + 1) * 10} "
        f"bill. How much change does {n1} get?",
        f"A train travels {a * 10} km in {c} hours. At the same speed, how far does it travel in {c + b} hours?",
        f"{n1} reads {b} pages a day. The book has {a * 10} pages. How many days does {n1} need to finish it?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"{n1} is {b} years older than {n2}. In {c} years their ages will add up to {2 * a + b + 2 * c}. "
        f"How old is {n2} now?",
        f"A recipe needs {c} eggs for {b} people. How many eggs are needed for {a} people?",
        f"What is {a * b} divided by {c}? Give the answer as a decimal and as a fraction.",
        f"A price of ${a * 4} is reduced by {rng.choice([10, 15, 20, 25, 30])}%. What is the new price?",
        f"{n1} saves ${b} each week. How many weeks until {n1} has ${a * b + c}?",
    ]
    ask = rng.choice(["Solve step by step.", "Think step by step.", "Explain your reasoning.", "Show your work.", ""])
    return (rng.choice(kinds) + " " + ask).strip()


def stdlib_functions(limit: int, rng: random.Random) -> list[tuple[str, str]]:
    """(name, source) of short top-level functions and methods of the standard library (tests excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "test" not in p.parts and "tests" not in p.parts
                   and "site-packages" not in p.parts and "idle_test" not in p.parts)
    rng.shuffle(files)
    out: list[tuple[str, str]] = []
    for f in files:
        try:
            src = f.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.end_lineno is not None:
                n = node.end_lineno - node.lineno + 1
                if 4 <= n <= MAX_CODE_LINES and not node.name.startswith("__"):
                    body = lines[node.lineno - 1:node.end_lineno]
                    indent = min(len(x) - len(x.lstrip()) for x in body if x.strip())
                    out.append((node.name, "\n".join(x[indent:] for x in body)))
        if len(out) >= limit * 3:
            break
    rng.shuffle(out)
    return out[:limit]


def _read_doc(path: Path) -> str:
    raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    return raw[:200_000].decode("utf-8", errors="replace")


_GROFF = re.compile(r"\\f[BIRP]|\\f\(..|\\\(..|\\[&|^]")


def strip_groff(text: str) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith((".\\\"", "'\\\"", ".ig", ".de", ".if", ".ie", ".el", ".ds", ".nr", ".so")):
            continue
        if line.startswith("."):
            parts = line.split(None, 1)
            if parts[0] in (".SH", ".SS"):
                line = parts[1].strip('"') if len(parts) > 1 else ""
            elif parts[0] in (".B", ".I", ".BR", ".IR", ".RB", ".BI", ".IB", ".RI") and len(parts) > 1:
                line = parts[1].replace('"', "")
            else:
                continue
        line = _GROFF.sub("", line).replace("\\-", "-").replace("\\e", "\\")
        out.append(line)
    return "\n".join(out)


def passages(text: str, rng: random.Random, k: int) -> list[str]:
    """Up to ``k`` passages of whole paragraphs, each under MAX_PASSAGE_CHARS and mostly prose."""
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if len(p.strip()) > 120]
    paras = [p for p in paras
             if sum(ch.isalpha() for ch in p) > 0.6 * len(p) and "copyright" not in p.lower()[:200]]
    rng.shuffle(paras)
    return [p[:MAX_PASSAGE_CHARS].rsplit(" ", 1)[0] if len(p) > MAX_PASSAGE_CHARS else p for p in paras[:k]]


def doc_passages(limit: int, rng: random.Random) -> list[tuple[str, str]]:
    """(source path, passage) from /usr/share/doc READMEs and text files and from English man pages."""
    docs = [p for p in Path("/usr/share/doc").rglob("*") if p.is_file()
            and re.search(r"(README|NEWS|\.txt|\.md|\.rst)(\.gz)?$", p.name, re.I)
            and "changelog" not in p.name.lower()]
    mans = [p for sec in ("man1", "man5", "man8") for p in Path("/usr/share/man", sec).glob("*.gz")]
    rng.shuffle(docs)
    rng.shuffle(mans)
    out: list[tuple[str, str]] = []
    for src, strip, per in ((docs, lambda t: t, 2), (mans, strip_groff, 1)):
        got = 0
        for p in src:
            try:
                text = strip(_read_doc(p))
            except (OSError, EOFError):
                continue
            for x in passages(text, rng, per):
                out.append((str(p), x))
                got += 1
            if got >= limit // 2:
                break
    rng.shuffle(out)
    return out[:limit]


def build(n: int, seed: int = 0) -> list[dict]:
    """About ``n`` prompt records: a quarter chat, a sixth code writing, a sixth reasoning, a fifth code
    edits/explanations on stdlib functions, the rest summaries and rewrites of documentation."""
    rng = random.Random(seed)
    recs: list[dict] = []

    def add(cat: str, source: str, content: str) -> None:
        recs.append({"id": f"{cat}-{len(recs)}", "category": cat, "source": source,
                     "messages": [{"role": "user", "content": content}]})

    chat = [tpl.format(t=t) for tpl in CHAT_TEMPLATES for t in CHAT_TOPICS]
    for c in rng.sample(chat, min(len(chat), n // 4)):
        add("chat", "written (templates x topics)", c)
    code = [tpl.format(t=t) for tpl in CODE_TEMPLATES for t in CODE_TASKS]
    for c in rng.sample(code, min(len(code), n // 6)):
        add("code", "written (templates x tasks)", c)
    for _ in range(n // 6):
        add("reasoning", "written (seeded word problems)", word_problem(rng))
    for name, src in stdlib_functions(n // 5, rng):
        tpl = rng.choice(FUNC_TEMPLATES)
        add("edit", "python stdlib " + sys.version.split()[0], tpl.format(c=src, name=name, new=name + "_v2"))
    for path, p in doc_passages(n - len(recs), rng):
        add("summarize" if "ummar" in (tpl := rng.choice(TEXT_TEMPLATES)) else "edit-text", path, tpl.format(p=p))
    rng.shuffle(recs)
    return recs


def held_out_filter(recs: list[dict], workload: str = "real") -> tuple[list[dict], str]:
    """Drop every record that shares a 13-word sequence with the bench workload's prompts (a workload prompt
    under 13 words: the whole prompt), then run the bench's own check on what is kept; its report."""
    wl = load_workloads(resolve_workload(workload))
    wanted = set().union(*(ngrams(words(prompt_text(w)), DEFAULT_N) for w in wl))
    sizes = sorted({len(g) for g in wanted})

    def hit(rec: dict) -> bool:
        ws = words("\n".join(m["content"] for m in rec["messages"]))
        return any(tuple(ws[i:i + k]) in wanted for k in sizes for i in range(len(ws) - k + 1))

    kept = [r for r in recs if not hit(r)]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kept.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        found = check(wl, [path], DEFAULT_N)
    report = (f"held-out check (bench/heldout.py, {DEFAULT_N}-word sequences) against workload {workload} "
              f"({len(wl)} prompts): {len(recs) - len(kept)} of {len(recs)} generated prompts dropped; on the "
              f"{len(kept)} kept: " + format_found(found, len(wl), DEFAULT_N))
    if found:
        raise RuntimeError(report)
    return kept, report


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdecode.train.prompt_set", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSONL file to write")
    ap.add_argument("--n", type=int, default=2000, help="prompts to write, about (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", default="real", help="the bench workload kept out of the file (default: real)")
    args = ap.parse_args(argv)
    recs, report = held_out_filter(build(args.n, args.seed), args.workload)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    cats: dict[str, int] = {}
    for r in recs:
        cats[r["category"]] = cats.get(r["category"], 0) + 1
    summary = f"{len(recs)} prompts -> {out} ({', '.join(f'{k} {v}' for k, v in sorted(cats.items()))})"
    Path(str(out) + ".heldout.txt").write_text(summary + "\n" + report + "\n")
    print(summary)
    print(report)
    return 0


def iter_records(path: str | Path) -> Iterator[dict]:
    for line in Path(path).read_text().splitlines():
        if line.strip():
            yield json.loads(line)


if __name__ == "__main__":
    sys.exit(main())
