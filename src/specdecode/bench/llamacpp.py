"""llama.cpp as a peer in ``specdecode bench --llama-cpp DIR``.

On a CPU the program people actually pick is llama.cpp, so the bench runs it on
the same pair, prompts, budgets and threads as ours, interleaved with our runs:

* **Conversion.** The pair goes through that checkout's own ``convert_hf_to_gguf.py``
  (``llamacpp_convert.py`` adds the GPT-2 pre-tokenizer mapping) to BF16, then
  ``llama-quantize`` makes Q8_0 and Q4_0. GGUFs are cached under
  ``$SPECDECODE_CACHE/llama.cpp`` keyed by checkpoint files and llama.cpp version.
* **Plain decoding: ``llama-bench -pg P,N``.** One process per prompt and repetition
  times a P-token prefill plus N generated tokens, which is exactly what our tok/s
  counts (prefill included, load excluded), with P and N the prompt's token count
  and budget. llama-bench feeds its own token ids, not our text, but plain decoding
  costs the same whatever the tokens are, and llama-bench never stops at EOS, so
  every run produces exactly the budget. Its JSON output is parsed.
* **Speculative decoding: ``llama-speculative-simple --spec-type draft-simple``.**
  Our prompt text (special tokens kept), greedy, EOS ignored, a fixed γ
  (``--spec-draft-n-max γ --spec-draft-p-min 0``: no confidence cut-off, as our fixed-γ
  runs). Time = its "encoded" + "decoded" wall times (prefill and generation, load
  excluded); acceptance from its n_drafted / n_accept. Its last draft ignores the
  remaining budget, so a run may emit up to γ tokens more than asked: tok/s counts the
  tokens it actually emitted.

GGUF targets (the file itself, and its requantized forms), lookup decoding (``llama-lookup``) and
the assembly of all llama.cpp methods live in ``llamacpp_gguf.py``; the output parsers in ``llamacpp_parse.py``.

llama.cpp's tokens are not compared with ours (llama-bench does not use our prompt,
and its arithmetic differs), so its rows have no exact-match figure.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ..config import ConfigError
from ..models import Model
from ..models.gguf import read_gguf
from .llamacpp_parse import (LlamaCppError, LlamaCppSummaryLost, SpecResult, output_tail,
                             parse_llama_bench_json, parse_speculative)
from .runners import Method, RunOutput

RUNTIME = "llama.cpp"
FORMATS = ("bf16", "q8_0", "q4_0")  # default GGUF formats; bf16 from the converter, the others by llama-quantize
PURE = "-pure"  # llama-quantize --pure: every matrix in the type, the output matrix too (on request only)
KNOWN_FORMATS = (*FORMATS, "q4_0" + PURE)
NOT_RUN = "not run: pass --llama-cpp DIR (a llama.cpp build; scripts/build_llama_cpp.sh makes one)"
BENCH_BIN, SPEC_BIN, QUANT_BIN = "llama-bench", "llama-speculative-simple", "llama-quantize"
RUN_TIMEOUT_S = 600
SUMMARY_RETRIES = 2  # extra runs when llama-speculative-simple's summary is lost at exit (see run())


# ---------------------------------------------------------------------------
# Locating a build
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class LlamaCppBuild:
    checkout: Path  # holds convert_hf_to_gguf.py and gguf-py/
    bin_dir: Path  # holds llama-bench etc.
    version: str  # what the GGUF cache is keyed on

    def binary(self, name: str) -> Optional[Path]:
        p = self.bin_dir / name
        return p if p.is_file() and os.access(p, os.X_OK) else None

    def describe(self) -> dict[str, Any]:
        return {"checkout": str(self.checkout), "bin_dir": str(self.bin_dir), "version": self.version,
                "binaries": {b: self.binary(b) is not None for b in (BENCH_BIN, SPEC_BIN, QUANT_BIN, "llama-lookup")}}


def locate(path: str) -> LlamaCppBuild:
    """``--llama-cpp DIR``: a checkout with its build (DIR/build/bin), or the bin folder of one."""
    d = Path(path).expanduser().resolve()
    if not d.is_dir():
        raise ConfigError(f"--llama-cpp: {path} is not a directory; build llama.cpp with scripts/build_llama_cpp.sh "
                          f"and pass its folder")
    bins = next((b for b in (d, d / "build" / "bin", d / "bin", d / "build" / "bin" / "Release")
                 if (b / BENCH_BIN).is_file()), None)
    if bins is None:
        raise ConfigError(f"--llama-cpp: no {BENCH_BIN} in {d} or its build/bin; build it with "
                          f"scripts/build_llama_cpp.sh {d}")
    checkout = next((c for c in (d, *d.parents[:3]) if (c / "convert_hf_to_gguf.py").is_file()), None)
    if checkout is None:
        raise ConfigError(f"--llama-cpp: found {bins / BENCH_BIN} but no convert_hf_to_gguf.py in {d} or above it; "
                          f"pass the llama.cpp checkout's folder")
    return LlamaCppBuild(checkout, bins, build_version(checkout))


def build_version(checkout: Path) -> str:
    """The sdist it came from (written by scripts/build_llama_cpp.sh) plus a hash of the conversion code,
    so a different converter never reuses another's GGUFs (sdist builds report 'unknown' commits)."""
    stamp = checkout / "SPECDECODE_LLAMA_CPP_VERSION"
    name = stamp.read_text().strip() if stamp.is_file() else "llama.cpp"
    h = hashlib.sha1()
    files = [checkout / "convert_hf_to_gguf.py", *sorted((checkout / "conversion").glob("*.py")),
             *sorted((checkout / "gguf-py" / "gguf").glob("*.py"))]
    for f in files:
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return f"{name} (converter {h.hexdigest()[:10]})"


# ---------------------------------------------------------------------------
# Conversion (cached)
# ---------------------------------------------------------------------------

def cache_root() -> Path:
    return Path(os.environ.get("SPECDECODE_CACHE", Path.home() / ".cache" / "specdecode")) / "llama.cpp"


def checkpoint_key(model_dir: Path, version: str) -> str:
    """Files that define the converted model (weights by size and mtime, configs by content) + version."""
    h = hashlib.sha1(version.encode())
    h.update(str(model_dir.resolve()).encode())
    for f in sorted(model_dir.iterdir()):
        if f.suffix == ".safetensors":
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
        elif f.suffix == ".json":
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _run_logged(what: str, cmd: Sequence[str], log: Path, env: Optional[dict[str, str]] = None) -> None:
    with log.open("w") as fh:
        rc = subprocess.run(list(cmd), stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=3600,
                            check=False).returncode
    if rc != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise LlamaCppError(f"{what} failed (exit {rc}; log {log}):\n{tail}")


def split_pure(fmt: str) -> tuple[str, bool]:
    """``q4_0-pure`` -> (``q4_0``, True): llama-quantize's type and whether to pass ``--pure``."""
    return (fmt[:-len(PURE)], True) if fmt.endswith(PURE) else (fmt, False)


def gguf_path(build: LlamaCppBuild, model_dir: Path, fmt: str) -> Path:
    """The cached GGUF of ``model_dir`` in ``fmt`` (one of KNOWN_FORMATS), converting or quantizing on first use."""
    if fmt not in KNOWN_FORMATS:
        raise ConfigError(f"--llama-cpp-formats: unknown format {fmt!r}; known: {', '.join(KNOWN_FORMATS)}")
    model_dir = Path(model_dir)
    folder = cache_root() / f"{model_dir.name}-{checkpoint_key(model_dir, build.version)}"
    out = folder / f"{model_dir.name}-{fmt}.gguf"
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.gguf")
    if fmt == "bf16":
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # so the child finds this package even if not installed
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        cmd = [sys.executable, "-m", "specdecode.bench.llamacpp_convert", str(build.checkout), str(model_dir),
               str(tmp), "bf16"]
        _run_logged(f"converting {model_dir} to GGUF", cmd, folder / "convert-bf16.log", env)
    else:
        quant = build.binary(QUANT_BIN)
        if quant is None:
            raise LlamaCppError(f"no {QUANT_BIN} in {build.bin_dir}: build it (scripts/build_llama_cpp.sh)")
        src_gguf = gguf_path(build, model_dir, "bf16")
        base, pure = split_pure(fmt)
        flags = ["--pure"] if pure else []
        _run_logged(f"{QUANT_BIN} {' '.join(flags + [base.upper()])}",
                    [str(quant), *flags, str(src_gguf), str(tmp), base.upper()], folder / f"quantize-{fmt}.log")
    (folder / "source.json").write_text(json.dumps({"checkpoint": str(model_dir.resolve()),
                                                    "llama_cpp": build.version}, indent=1))
    tmp.replace(out)
    return out


# ---------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------

def _run(cmd: Sequence[str]) -> str:
    try:
        p = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace", timeout=RUN_TIMEOUT_S,
                           check=False)
    except subprocess.TimeoutExpired:
        raise LlamaCppError(f"{Path(cmd[0]).name} ran past {RUN_TIMEOUT_S} s") from None
    out = p.stdout + "\n" + p.stderr
    if p.returncode != 0:
        raise LlamaCppError(f"{Path(cmd[0]).name} exited {p.returncode}: {output_tail(out)}")
    return out


class LlamaCppPlain:
    """llama-bench: a prefill of our prompt's length, then our budget, timed by llama.cpp (see the module doc)."""

    runtime = RUNTIME
    family = "llama.cpp-plain"
    setting: Optional[int] = None

    def __init__(self, build: LlamaCppBuild, gguf: Path, fmt: str, threads: int) -> None:
        self.name = f"llama.cpp/{fmt}"
        self.fmt, self.threads = fmt, threads
        self.bench = build.binary(BENCH_BIN)
        self.gguf = gguf

    def command(self, n_prompt: int, n_gen: int) -> list[str]:
        return [str(self.bench), "-m", str(self.gguf), "-p", "0", "-n", "0", "-pg", f"{n_prompt},{n_gen}",
                "-r", "1", "-t", str(self.threads), "-o", "json"]

    def run(self, prompt: list[int], max_new_tokens: int) -> RunOutput:
        samples = parse_llama_bench_json(_run(self.command(len(prompt), max_new_tokens)))
        s = next((x for x in samples if x.n_gen == max_new_tokens and x.n_prompt == len(prompt)), None)
        if s is None or not s.samples_ns:
            raise LlamaCppError(f"llama-bench returned no pg{len(prompt)},{max_new_tokens} test: {samples}")
        return RunOutput([-1] * max_new_tokens, s.samples_ns[0] / 1e9, None)


@dataclass
class SpecStats:
    """Per-run acceptance figures of one llama.cpp speculative method (llama.cpp reports totals only)."""

    runs: list[SpecResult] = field(default_factory=list)
    prompt_token_mismatches: int = 0  # runs where llama.cpp's tokenisation of our text had another length
    lost_summaries: int = 0  # runs repeated because their summary lines were lost at exit

    def to_dict(self) -> dict[str, Any]:
        drafted = sum(r.n_drafted for r in self.runs)
        accepted = sum(r.n_accept for r in self.runs)
        passes = sum(r.passes for r in self.runs)
        return {"runs": len(self.runs), "n_drafted": drafted, "n_accept": accepted,
                "accept_rate": accepted / drafted if drafted else None,
                "tau": sum(r.n_predict for r in self.runs) / passes if passes else None,
                "prompt_token_mismatches": self.prompt_token_mismatches, "lost_summaries": self.lost_summaries}


def _bos_rule(gguf: Path, eos_ids: Any) -> tuple[bool, frozenset[int]]:
    """(whether llama.cpp adds BOS to the prompt, the ids a leading one of ours may be) for ``gguf``."""
    meta: dict[str, Any] = {}
    try:
        meta = read_gguf(gguf)[0].meta
    except Exception:  # no file (a stand-in in tests) or an architecture we do not load: the old rule
        pass
    if "tokenizer.ggml.add_bos_token" in meta and "tokenizer.ggml.bos_token_id" in meta:
        return bool(meta["tokenizer.ggml.add_bos_token"]), frozenset({int(meta["tokenizer.ggml.bos_token_id"])})
    return True, frozenset(int(i) for i in eos_ids)


class LlamaCppSpeculative:
    """llama-speculative-simple with the draft model, greedy, fixed γ, EOS ignored (see the module doc)."""

    runtime = RUNTIME
    family = "llama.cpp-spec"

    def __init__(self, build: LlamaCppBuild, target_gguf: Path, draft_gguf: Path, fmt: str, gamma: int,
                 threads: int, target: Model) -> None:
        self.name = f"llama.cpp-spec/{fmt}/g{gamma}"
        self.gamma = gamma
        self.setting: Optional[int] = gamma  # as the bench's Method protocol declares it
        self.fmt, self.threads, self.target = fmt, threads, target
        self.binary = build.binary(SPEC_BIN)
        self.target_gguf, self.draft_gguf = target_gguf, draft_gguf
        self.stats = SpecStats()
        self._bos: Optional[tuple[bool, frozenset[int]]] = None

    def prompt_text(self, prompt: list[int]) -> str:
        """Our ids as text, special tokens spelled out (llama.cpp parses them back). Where the GGUF says
        llama.cpp adds BOS itself (``tokenizer.ggml.add_bos_token``), a leading BOS of ours is left to it;
        a GGUF without the key is taken to add it, so a leading BOS/EOT of ours is dropped."""
        if self._bos is None:
            self._bos = _bos_rule(self.target_gguf, self.target.eos_token_ids)
        adds, bos_ids = self._bos
        ids = prompt[1:] if adds and prompt and prompt[0] in bos_ids else prompt
        return self.target.tokenizer.decode(ids, skip_special_tokens=False)  # type: ignore[union-attr]

    def command(self, prompt_file: str, n_prompt: int, n_gen: int) -> list[str]:
        t, g = str(self.threads), str(self.gamma)
        # -n n_gen - 1: the example stops once it has *more* than -n tokens (its last draft may add up to γ)
        return [str(self.binary), "-m", str(self.target_gguf), "-md", str(self.draft_gguf),
                "--spec-type", "draft-simple", "--spec-draft-n-max", g, "--spec-draft-n-min", "0",
                "--spec-draft-p-min", "0", "-f", prompt_file, "-n", str(max(n_gen - 1, 0)),
                "-c", str(n_prompt + n_gen + self.gamma + 16), "--ignore-eos", "--temp", "0", "-s", "0",
                "-t", t, "-tb", t, "-td", t, "-tbd", t]

    def run(self, prompt: list[int], max_new_tokens: int) -> RunOutput:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as fh:
            fh.write(self.prompt_text(prompt) + "\n")  # -f drops one trailing newline: this one, not the prompt's
        try:
            cmd = self.command(fh.name, len(prompt), max_new_tokens)
            for attempt in range(1 + SUMMARY_RETRIES):
                try:
                    r = parse_speculative(_run(cmd))
                    break
                except LlamaCppSummaryLost:
                    # llama.cpp's logger is asynchronous and deliberately never joined at exit
                    # (ggml-org/llama.cpp#22142), so now and then a run's last lines are lost: run it again
                    self.stats.lost_summaries += 1
                    if attempt == SUMMARY_RETRIES:
                        raise
        finally:
            os.unlink(fh.name)
        if r.n_input != len(prompt):
            self.stats.prompt_token_mismatches += 1
        self.stats.runs.append(r)
        return RunOutput([-1] * r.n_predict, r.seconds, None)


def start_timed_runs(methods: Sequence[Method]) -> None:
    """Forget what the untimed warm-up runs recorded, so acceptance figures cover the timed runs only."""
    for m in methods:
        if m.runtime == RUNTIME and isinstance(getattr(m, "stats", None), SpecStats):
            m.stats = SpecStats()  # type: ignore[attr-defined]


def parse_formats(text: str) -> list[str]:
    fmts = [f.strip().lower() for f in text.split(",") if f.strip()]
    bad = [f for f in fmts if f not in KNOWN_FORMATS]
    if bad or not fmts:
        raise ConfigError(f"--llama-cpp-formats: unknown format(s) {bad or text!r}; "
                          f"choose from {', '.join(KNOWN_FORMATS)}")
    return fmts


# ---------------------------------------------------------------------------
# Ours vs theirs
# ---------------------------------------------------------------------------

OUR_DTYPE_FOR = {"bf16": ("bfloat16", "bf16"), "q8_0": ("int8",), "q4_0": ("int4",), "q4_0-pure": ("int4",)}


def comparison(summary: dict[str, Any], weight_dtype: str, methods: Sequence[Method]) -> list[dict[str, Any]]:
    """One row per llama.cpp method: its overall tok/s beside our counterpart's, ratio = ours / theirs.

    Counterparts: our plain decoding for llama.cpp's plain runs; our lookup at the same k for its lookup
    runs; for speculative runs our draft model at
    the same γ, and our best speculative method. ``same_format`` says whether our weights are the format
    llama.cpp ran (our plain path runs ``weight_dtype``)."""
    tps = {m["name"]: (m["categories"].get("overall", {}).get("tokens_per_s") or {}).get("mean")
           for m in summary["methods"] if m["status"] == "ok"}
    ours_spec = {m["name"]: tps.get(m["name"]) for m in summary["methods"]
                 if m["status"] == "ok" and m["runtime"] == "specdecode" and m["name"] != "plain"
                 and not m["name"].startswith("eager-") and tps.get(m["name"])}
    best = max(ours_spec, key=lambda n: ours_spec[n] or 0.0) if ours_spec else None
    stats = {m.name: s.to_dict() for m in methods if isinstance(s := getattr(m, "stats", None), SpecStats)}
    rows = []
    for m in summary["methods"]:
        if m["runtime"] != RUNTIME or m["status"] != "ok":
            continue
        theirs = tps.get(m["name"])
        fmt = m["name"].split("/")[1]
        same = weight_dtype.replace("torch.", "") in OUR_DTYPE_FOR.get(fmt, ())
        if m["family"] == "llama.cpp-plain":
            pairs = [("plain", tps.get("plain"))]
        elif m["family"] == "llama.cpp-lookup":
            pairs = [(f"lookup/k{m['setting']}", tps.get(f"lookup/k{m['setting']}"))]
        else:
            same_g = f"draft/g{m['setting']}"
            pairs = [(same_g, tps.get(same_g))] + ([(best, ours_spec[best])] if best and best != same_g else [])
        for ours_name, ours in pairs:
            rows.append({"llama_cpp": m["name"], "llama_cpp_tokens_per_s": theirs, "ours": ours_name,
                         "ours_tokens_per_s": ours, "ratio_ours_over_theirs": (ours / theirs) if ours and theirs
                         else None, "same_weight_format": same, "spec": stats.get(m["name"])})
    return rows


def best_by_category(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per category: our fastest method beside llama.cpp's fastest run (plain, speculative or lookup).

    Why: a user picks the best configuration of each program, so the fair per-category figure is best
    against best, not a method against its namesake (``comparison``)."""
    ok = [m for m in summary["methods"] if m["status"] == "ok"]
    cats = list(dict.fromkeys(c for m in ok for c in m["categories"]))
    rows = []
    for cat in cats:
        def best(runtime: str) -> tuple[Optional[str], Optional[float]]:
            tps: dict[str, float] = {}
            for m in ok:
                v = ((m["categories"].get(cat) or {}).get("tokens_per_s") or {}).get("mean")
                if v and (m["runtime"] == RUNTIME) == (runtime == RUNTIME):
                    tps[m["name"]] = float(v)
            name = max(tps, key=tps.__getitem__) if tps else None
            return name, (tps[name] if name else None)

        ours, ours_tps = best("specdecode")
        theirs, theirs_tps = best(RUNTIME)
        if ours_tps and theirs_tps:
            rows.append({"category": cat, "ours": ours, "ours_tokens_per_s": ours_tps, "llama_cpp": theirs,
                         "llama_cpp_tokens_per_s": theirs_tps, "ratio_ours_over_theirs": ours_tps / theirs_tps})
    return rows


def format_best_by_category(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return ""
    body = [[r["category"], r["ours"], _num(r["ours_tokens_per_s"]), r["llama_cpp"],
             _num(r["llama_cpp_tokens_per_s"]), f"{r['ratio_ours_over_theirs']:.2f}"] for r in rows]
    return _aligned("best of ours vs best of llama.cpp, per category (mean tok/s)",
                    ["category", "ours", "tok/s", "llama.cpp", "tok/s", "ours/theirs"], body, left=(0, 1, 3))


def format_comparison(rows: Sequence[dict[str, Any]], weight_dtype: str) -> str:
    if not rows:
        return ""
    head = ["llama.cpp", "tok/s", "accepted", "ours", "tok/s", "ours/theirs"]
    body = []
    for r in rows:
        acc = (r["spec"] or {}).get("accept_rate")
        body.append([r["llama_cpp"], _num(r["llama_cpp_tokens_per_s"]), "-" if acc is None else f"{acc:.0%}",
                     r["ours"] + ("" if r["same_weight_format"] else f" ({weight_dtype})"),
                     _num(r["ours_tokens_per_s"]),
                     "-" if r["ratio_ours_over_theirs"] is None else f"{r['ratio_ours_over_theirs']:.2f}"])
    return _aligned("ours vs llama.cpp (overall mean tok/s; same prompts, budgets and threads, interleaved)",
                    head, body, left=(0, 3))


def _aligned(title: str, head: list[str], body: list[list[str]], left: tuple[int, ...]) -> str:
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]

    def line(r: list[str]) -> str:
        return "  ".join(x.ljust(w) if i in left else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))

    return "\n".join([title, line(head), "  ".join("-" * w for w in widths)] + [line(b) for b in body])


def _num(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1f}"
