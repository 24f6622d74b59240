"""`specdecode bench ab`: the same bench command on this tree and on a git revision, pair by pair.

Why: a change that should not move the numbers (a refactor, a new hook) is checked by running the
bench on both code trees in one sitting, alternating (this, then the revision; then the revision,
then this ...) so the machine's slow phases hit both alike, and reading each method's tok/s as a
ratio per pair. The revision's ``src/`` is taken with ``git archive`` into a temporary folder and
put first on the child process's ``sys.path``; both trees use this checkout's bundled models (set
``SPECDECODE_MODELS_DIR`` to change that) and build their own C++ kernels (cached by source).
``--fresh-costs`` gives each run an empty cost cache: for a change to how costs are measured.

    specdecode bench ab --rev HEAD~1 --pairs 3 -- --threads 1 --per-category 2 --reps 2 \\
        --gammas 4,auto --lookup-tokens 4 --methods plain,draft,lookup

Prints per method the median tok/s of each tree, the per-pair ratio this / revision (min / median /
max) and each tree's speedup over its own plain decoding; writes every bench.json under ``--out``
(``this-<i>/``, ``rev-<i>/``) and the summary as ``ab.json``. Exit status 1 if a run fails or an
output differs from plain decoding in either tree.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Optional

from ..config import ConfigError

CHILD = "import sys; sys.path.insert(0, sys.argv.pop(1)); from specdecode.cli import main; sys.exit(main())"


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("ab", help="the same bench on this tree and on a git revision, alternating pair by pair",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", required=True, help="git revision to compare against (e.g. HEAD~1, a commit, a tag)")
    p.add_argument("--repo", help="the git checkout to read it from (default: the one holding this package, "
                                  "else the current directory)")
    p.add_argument("--pairs", type=int, default=2, help="bench runs per tree, alternating (default: 2)")
    p.add_argument("--out", help="output directory (default: runs/ab-<timestamp>)")
    p.add_argument("--fresh-costs", action="store_true",
                   help="give every run an empty cost cache, so each tree measures its own costs as a first start "
                        "does (default: both share $SPECDECODE_CACHE, so a change to the cost measurement is "
                        "not what either tree runs on)")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, metavar="-- BENCH ARGS",
                   help="arguments for `specdecode bench` (--no-plots, --no-progress and --out are added)")
    p.set_defaults(func=cmd_ab)


def _repo(given: Optional[str]) -> Path:
    if given:
        return Path(given)
    here = Path(__file__).resolve().parents[3]  # src/specdecode/bench/ -> the checkout, when installed editable
    return here if (here / ".git").exists() else Path.cwd()


def export_src(repo: Path, rev: str, dest: Path) -> Path:
    """The revision's ``src/`` under ``dest`` (``git archive``); returns the folder to put on sys.path."""
    tar = dest / "src.tar"
    with open(tar, "wb") as f:
        subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev, "src"], stdout=f, check=True)
    with tarfile.open(tar) as t:
        t.extractall(dest)
    tar.unlink()
    return dest / "src"


def overall_tps(bench_json: dict[str, Any]) -> dict[str, float]:
    """Method name -> mean tok/s over its prompts ('overall'), ok methods only."""
    out = {}
    for m in bench_json["methods"]:
        tps = (m["categories"].get("overall", {}).get("tokens_per_s") or {}).get("mean")
        if m["status"] == "ok" and tps:
            out[m["name"]] = float(tps)
    return out


def compare(this: list[dict[str, float]], rev: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Per method present in every run: medians, per-pair ratios and each tree's speedup over its plain."""
    names = [n for n in this[0] if all(n in r for r in this + rev)]
    rows = []
    for n in names:
        ratios = [a[n] / b[n] for a, b in zip(this, rev)]
        row: dict[str, Any] = {"method": n, "this_tps": statistics.median(r[n] for r in this),
                               "rev_tps": statistics.median(r[n] for r in rev),
                               "ratio_min": min(ratios), "ratio_median": statistics.median(ratios),
                               "ratio_max": max(ratios)}
        if "plain" in names:
            row["this_speedup"] = row["this_tps"] / statistics.median(r["plain"] for r in this)
            row["rev_speedup"] = row["rev_tps"] / statistics.median(r["plain"] for r in rev)
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]], rev: str) -> str:
    lines = [f"{'method':<24}{'this tok/s':>11}{rev[:12]:>13}   this/rev per pair (min/med/max)   speedup this/rev"]
    for r in rows:
        sp = f"{r['this_speedup']:.2f} / {r['rev_speedup']:.2f}" if "this_speedup" in r else ""
        lines.append(f"{r['method']:<24}{r['this_tps']:>11.1f}{r['rev_tps']:>13.1f}   "
                     f"{r['ratio_min']:.3f} / {r['ratio_median']:.3f} / {r['ratio_max']:.3f}{'':>13}{sp}")
    return "\n".join(lines)


def cmd_ab(args: argparse.Namespace) -> int:
    bench_args = list(args.bench_args)
    if bench_args[:1] == ["--"]:
        bench_args = bench_args[1:]
    if any(a == "--out" or a.startswith("--out=") for a in bench_args):
        raise ConfigError("bench ab: give --out before `--` (each run gets its own folder under it)")
    if args.pairs < 1:
        raise ConfigError("--pairs must be at least 1")
    out = Path(args.out or f"runs/ab-{dt.datetime.now():%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    this_src = Path(__file__).resolve().parents[2]  # the folder holding this specdecode package
    env = dict(os.environ)
    env.setdefault("SPECDECODE_MODELS_DIR", str(this_src.parent / "models"))  # both trees: the same models
    failed = False
    runs: dict[str, list[dict[str, float]]] = {"this": [], "rev": []}
    with tempfile.TemporaryDirectory(prefix="specdecode-ab-") as tmp:
        rev_src = export_src(_repo(args.repo), args.rev, Path(tmp))
        # revisions that look for models/ beside their own tree find the same ones
        (Path(tmp) / "models").symlink_to(Path(env["SPECDECODE_MODELS_DIR"]).resolve())
        for i in range(args.pairs):
            for side in (("this", "rev") if i % 2 == 0 else ("rev", "this")):
                run_dir = out / f"{side}-{i + 1}"
                src = this_src if side == "this" else rev_src
                cmd = [sys.executable, "-c", CHILD, str(src), "bench", *bench_args, "--no-plots", "--no-progress",
                       "--out", str(run_dir)]
                print(f"pair {i + 1}, {side}: {' '.join(cmd[4:])}", flush=True)
                run_env = dict(env, SPECDECODE_CACHE=str(Path(tmp) / f"cache-{side}-{i + 1}")) \
                    if args.fresh_costs else env
                rc = subprocess.run(cmd, env=run_env, check=False).returncode
                written = run_dir / "bench.json"
                result = json.loads(written.read_text()) if written.is_file() else None
                if rc != 0 or result is None:
                    print(f"{side} run {i + 1} failed (exit status {rc})")
                    return 1
                if result.get("mismatches"):
                    print(f"{side} run {i + 1}: outputs differ from plain decoding: {result['mismatches']}")
                    failed = True
                runs[side].append(overall_tps(result))
    rows = compare(runs["this"], runs["rev"])
    print(format_table(rows, args.rev))
    (out / "ab.json").write_text(json.dumps({"rev": args.rev, "pairs": args.pairs, "bench_args": bench_args,
                                             "rows": rows, "runs": runs}, indent=2) + "\n")
    print(f"wrote {out / 'ab.json'}")
    return 1 if failed else 0
