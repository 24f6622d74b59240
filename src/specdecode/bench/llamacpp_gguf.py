"""llama.cpp in the bench, part 2: GGUF targets, lookup decoding, and building the peer methods.

``--target m.gguf`` (or a catalogued name such as ``smollm2-135m-instruct``): llama.cpp runs
**that very file**, no conversion step; format ``file`` in ``--llama-cpp-formats`` (the default
for a GGUF target) is the file as given, and its rows are named by the file's layer-matrix type
(``llama.cpp/q4_1``). ``q8_0``, ``q4_0``, ``bf16`` (or ``f16``) are made from the file by its
``llama-quantize --allow-requantize`` (an already quantized source needs the flag), cached as the
HF conversions are; ``q4_0-pure`` adds ``--pure`` (every matrix Q4_0, the output matrix too, where
llama.cpp's default recipe keeps it at higher precision: faster decoding, the fastest file it runs).
Our side loads the target as given; to time ours on a made form too, pass that file as ``--target``
(``bench.json`` lists their paths under ``llama_cpp.gguf``): ours reads Q8_0 and Q4_0 blocks as stored.

**Lookup decoding: ``llama-lookup``**, beside our ``lookup`` family, k = each ``--lookup-tokens``
(``--spec-draft-n-max k``). It drafts from n-grams of the context only (1..4-grams, compiled in;
no ``--lookup-cache-dynamic``, so no run learns from an earlier one), greedy, EOS ignored; its
summary lines are those of ``llama-speculative-simple`` and are read by the same parser.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Sequence

from ..config import ConfigError, SamplingConfig
from ..models import Model
from ..models.gguf import read_gguf
from ..models.gguf_file import is_gguf
from . import llamacpp as lc
from .runners import Method, Skipped

LOOKUP_BIN = "llama-lookup"
FILE = "file"  # the GGUF target as given
REQUANT_FORMATS = ("bf16", "f16", "q8_0", "q4_0", "q4_0-pure")  # what we ask llama-quantize to make from a GGUF


def is_gguf_path(path: str | Path) -> bool:
    return is_gguf(path)


def file_type(path: Path) -> str:
    """The GGUF's weight type, lower case (``q4_1``): the most common type of its layer matrices."""
    ckpt, _ = read_gguf(path)
    kinds = Counter(t for n, t in ckpt.types.items() if n.startswith("model.layers.") and n.endswith("proj.weight"))
    return kinds.most_common(1)[0][0].lower() if kinds else "gguf"


def gguf_meta(path: Path) -> dict[str, Any]:
    return read_gguf(path)[0].meta


def default_formats(target_path: str) -> str:
    return FILE if is_gguf_path(target_path) else ",".join(lc.FORMATS)


def parse_formats(text: str, gguf_target: bool) -> list[str]:
    """--llama-cpp-formats: for a GGUF target ``file`` and what llama-quantize makes from it; for an HF
    directory the converter's BF16 and its quantizations (``file`` = bf16 there)."""
    known = (FILE, *REQUANT_FORMATS) if gguf_target else (FILE, *lc.KNOWN_FORMATS)
    fmts = list(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    bad = [f for f in fmts if f not in known]
    if bad or not fmts:
        raise ConfigError(f"--llama-cpp-formats: unknown format(s) {bad or text!r}; choose from {', '.join(known)}")
    if not gguf_target:
        fmts = list(dict.fromkeys("bf16" if f == FILE else f for f in fmts))
    return fmts


def source_key(path: Path, version: str) -> str:
    st = path.stat()
    return hashlib.sha1(f"{version}|{path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]


def requantized(build: lc.LlamaCppBuild, src: Path, fmt: str) -> Path:
    """``src`` (a GGUF) in ``fmt`` by ``llama-quantize --allow-requantize``, cached; the file itself when it
    already is in that format."""
    if fmt == FILE or file_type(src) == fmt:
        return src
    base, pure = lc.split_pure(fmt)
    quant = build.binary(lc.QUANT_BIN)
    if quant is None:
        raise lc.LlamaCppError(f"no {lc.QUANT_BIN} in {build.bin_dir}: build it (scripts/build_llama_cpp.sh)")
    folder = lc.cache_root() / f"{src.stem}-{source_key(src, build.version)}"
    out = folder / f"{src.stem}-{fmt}.gguf"
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.gguf")
    flags = ["--allow-requantize"] + (["--pure"] if pure else [])
    lc._run_logged(f"{lc.QUANT_BIN} {' '.join(flags)} {base.upper()}",
                   [str(quant), *flags, str(src), str(tmp), base.upper()], folder / f"quantize-{fmt}.log")
    (folder / "source.json").write_text(json.dumps({"source": str(src.resolve()), "llama_cpp": build.version}))
    tmp.replace(out)
    return out


def peer_file(build: lc.LlamaCppBuild, model: Model, fmt: str) -> tuple[Path, str]:
    """The GGUF llama.cpp runs for ``model`` in ``fmt``, and the label of its rows (the format, or for
    ``file`` the GGUF's own type)."""
    path = Path(model.path)
    if is_gguf_path(path):
        out = requantized(build, path, fmt)
        return out, (file_type(out) if fmt == FILE else fmt)
    return lc.gguf_path(build, path, "bf16" if fmt == FILE else fmt), ("bf16" if fmt == FILE else fmt)


class LlamaCppLookup(lc.LlamaCppSpeculative):
    """llama-lookup: n-gram drafts from the context, k tokens at most, greedy, EOS ignored (module doc)."""

    family = "llama.cpp-lookup"

    def __init__(self, build: lc.LlamaCppBuild, target_gguf: Path, fmt: str, k: int, threads: int,
                 target: Model) -> None:
        super().__init__(build, target_gguf, target_gguf, fmt, k, threads, target)
        self.name = f"llama.cpp-lookup/{fmt}/k{k}"
        self.binary = build.binary(LOOKUP_BIN)

    def command(self, prompt_file: str, n_prompt: int, n_gen: int) -> list[str]:
        t = str(self.threads)
        # -n n_gen - 1: like llama-speculative-simple it stops once it has more than -n tokens
        return [str(self.binary), "-m", str(self.target_gguf), "--spec-draft-n-max", str(self.gamma),
                "-f", prompt_file, "-n", str(max(n_gen - 1, 0)), "-c", str(n_prompt + n_gen + self.gamma + 16),
                "--ignore-eos", "--temp", "0", "-s", "0", "-t", t, "-tb", t]


def build_methods(build: lc.LlamaCppBuild, target: Model, draft: Optional[Model], formats: Sequence[str],
                  gammas: Sequence[int], lookup_tokens: Sequence[int], threads: int, sampling: SamplingConfig,
                  log: Any = None) -> tuple[list[Method], list[Skipped], dict[str, str]]:
    """Per format: llama.cpp plain; speculative per γ (with a draft); lookup per k (``lookup_tokens``,
    empty when our lookup family is not run). Converts or quantizes on first use. Returns the methods,
    skipped entries with reasons, and the GGUF files used."""
    methods: list[Method] = []
    skipped: list[Skipped] = []
    files: dict[str, str] = {}

    def peer(model: Model, fmt: str) -> tuple[Path, str]:
        if log is not None and not (fmt == FILE and is_gguf_path(model.path)):
            print(f"llama.cpp: {model.name} as {fmt.upper()} (made once, then cached)", file=log)
        p, label = peer_file(build, model, fmt)
        files[f"{model.name}/{label}"] = str(p)
        return p, label

    def why_not_text(binary: str) -> Optional[str]:
        if build.binary(binary) is None:
            return f"no {binary} in {build.bin_dir} (scripts/build_llama_cpp.sh builds it)"
        if not sampling.greedy:
            return "greedy only (llama.cpp's sampled speculation is another algorithm than ours)"
        if target.tokenizer is None:
            return f"{target.path} has no tokenizer to turn our prompts into text"
        return None

    for fmt in formats:
        try:
            tgt, label = peer(target, fmt)
        except (lc.LlamaCppError, subprocess.TimeoutExpired, OSError, ValueError) as e:
            skipped.append(Skipped(f"llama.cpp/{fmt}", "llama.cpp-plain", lc.RUNTIME, str(e)))
            continue
        if f"llama.cpp/{label}" in {m.name for m in methods}:
            continue  # 'file' and the file's own type are one file
        methods.append(lc.LlamaCppPlain(build, tgt, label, threads))
        for g in gammas:
            reason = "no draft model (pass --draft DIR or FILE.gguf)" if draft is None else why_not_text(lc.SPEC_BIN)
            if reason is None:
                assert draft is not None  # else reason says so
                try:
                    methods.append(lc.LlamaCppSpeculative(build, tgt, peer(draft, fmt)[0], label, g, threads, target))
                    continue
                except (lc.LlamaCppError, subprocess.TimeoutExpired, OSError, ValueError) as e:
                    reason = str(e)
            skipped.append(Skipped(f"llama.cpp-spec/{label}/g{g}", "llama.cpp-spec", lc.RUNTIME, reason))
        for k in lookup_tokens:
            reason = why_not_text(LOOKUP_BIN)
            if reason is None:
                methods.append(LlamaCppLookup(build, tgt, label, k, threads, target))
            else:
                skipped.append(Skipped(f"llama.cpp-lookup/{label}/k{k}", LlamaCppLookup.family, lc.RUNTIME, reason))
    return methods, skipped, files
