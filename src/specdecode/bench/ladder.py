"""A size ladder beside llama.cpp: random-weight GGUFs at real model shapes, quantized by llama.cpp's own tool.

    specdecode bench ladder --llama-cpp DIR [--rungs 360m,1.7b] [--formats Q4_K_M,Q8_0,Q4_0] \\
        [--dir runs/ladder] [--threads 1] [--context 512] [--n 64] [--json OUT.json]

Why: every other figure of this project comes from one 135M model. Users run 1-8B files, and what
they meet there (peak memory, load time, bandwidth-bound decode speed) does not show at 135M.

Per rung it writes an F16 GGUF (llama architecture, the shape's real dimensions, SmolLM2's tokenizer
and vocabulary of 49,152 from the pulled SmolLM2-135M file, normal(0, 0.02) weights), quantizes it with
``llama-quantize`` into each format, and per file measures, ours then llama.cpp's, each in a new process:

* **peak RSS** (the child's ``ru_maxrss``) and **seconds from process start to the first token**
  (ours: ``specdecode generate`` of one token; llama.cpp: ``llama-simple`` of one token), the median of
  ``--load-reps`` starts in turn, each from a file read through first (a warm page cache for both);
* **plain decode tok/s** at ``--context`` tokens (``bench llamacpp-decode``'s two timed runs).

**The weights are random**: the text means nothing and acceptance cannot be read off them; memory, load
and speed can, since they depend on shapes and formats only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from ..models.gguf_file import parse_gguf
from ..models.loading import load_model, resolve_model_path
from ..models.pack_cache import forget
from ..sizing.costs import measure_costs, predicted_speedup
from .llamacpp import locate
from .llamacpp_decode import _ours_child, theirs


@dataclass(frozen=True)
class Shape:
    """The dimensions of a published model (its config.json), with SmolLM2's vocabulary."""

    name: str
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    tied: bool


SHAPES = {
    "360m": Shape("SmolLM2-360M", 960, 32, 15, 5, 2560, True),
    "1.7b": Shape("SmolLM2-1.7B", 2048, 24, 32, 32, 8192, True),
    "3b": Shape("Llama-3.2-3B", 3072, 28, 24, 8, 8192, True),
    "8b": Shape("Llama-3.1-8B", 4096, 32, 32, 8, 14336, False),
}
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id")


def _tensors(s: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """GGUF tensor names and numpy shapes ([rows, cols]) of a llama model of shape ``s``."""
    hd = s.dim // s.heads
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, s.dim))]
    for i in range(s.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (s.dim,)), (b + "attn_q.weight", (s.heads * hd, s.dim)),
                (b + "attn_k.weight", (s.kv_heads * hd, s.dim)), (b + "attn_v.weight", (s.kv_heads * hd, s.dim)),
                (b + "attn_output.weight", (s.dim, s.heads * hd)), (b + "ffn_norm.weight", (s.dim,)),
                (b + "ffn_gate.weight", (s.ffn, s.dim)), (b + "ffn_up.weight", (s.ffn, s.dim)),
                (b + "ffn_down.weight", (s.dim, s.ffn))]
    out.append(("output_norm.weight", (s.dim,)))
    if not s.tied:
        out.append(("output.weight", (vocab, s.dim)))
    return out


def write_f16(shape: Shape, tokenizer_gguf: Path, out: Path, seed: int = 0) -> None:
    """An F16 GGUF of ``shape`` with random weights, written a tensor at a time (never the whole model in memory)."""
    import gguf  # lazy: the optional gguf package (~20 ms), for this command alone

    meta, _ = parse_gguf(tokenizer_gguf)
    vocab = len(meta["tokenizer.ggml.tokens"])
    tmp = out.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"{shape.name} shape, random weights")
    w.add_block_count(shape.layers)
    w.add_context_length(8192)
    w.add_embedding_length(shape.dim)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(100000.0)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for key in _TOKENIZER_KEYS:
        if key not in meta:
            continue
        v = meta[key]
        if isinstance(v, list):
            w.add_array(key, v)
        elif isinstance(v, str):
            w.add_string(key, v)
        else:
            w.add_uint32(key, int(v))
    names = _tensors(shape, vocab)
    for name, dims in names:
        dt = np.float32 if len(dims) == 1 else np.float16
        w.add_tensor_info(name, dims, np.dtype(dt), int(np.prod(dims)) * np.dtype(dt).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, dims in names:
        if len(dims) == 1:
            w.write_tensor_data(np.ones(dims, dtype=np.float32))
        else:
            w.write_tensor_data((rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16))
    w.close()
    tmp.rename(out)


# Runs argv[1:] as a grandchild and prints its peak RSS (KiB) and wall seconds. Why a grandchild: Linux carries
# a process's peak RSS across exec, so a child forked from this (large) process would report at least this
# process's size; a grandchild forked from a bare interpreter starts from a few MB.
_MEASURE = """
import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print("SPECDECODE-MEASURE", os.waitstatus_to_exitcode(status), usage.ru_maxrss, time.perf_counter() - t0)
"""


def measure_first_token(cmd: list[str], threads: int) -> dict[str, float]:
    """Wall seconds from process start to exit after one token, and the process's peak RSS (MiB)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run([sys.executable, "-S", "-c", _MEASURE, *cmd], capture_output=True, text=True,
                       errors="replace", env=env, check=False, timeout=3600)
    line = next((x for x in p.stdout.splitlines() if x.startswith("SPECDECODE-MEASURE")), None)
    if line is None or line.split()[1] != "0":
        raise RuntimeError(f"{Path(cmd[0]).name} failed: {(p.stdout + p.stderr)[-1500:]}")
    _, _, kib, wall = line.split()
    return {"first_token_s": float(wall), "peak_rss_mib": int(kib) / 1024}


def warm(path: Path) -> None:
    """Read ``path`` through once, so a timed start finds it in the page cache whoever ran last (the second of two
    cold starts read the file the first had just cached: 5.4 s against 0.5 s at 3B Q8_0 was mostly the disk)."""
    with path.open("rb", buffering=0) as f:
        while f.read(1 << 24):
            pass


def load_pair(path: Path, ours: list[str], theirs: list[str], threads: int, reps: int
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ours and llama.cpp's start to a first token, ``reps`` times in turn from a warm file: each side's median
    run (by seconds) and every run's seconds. Before them, ours once with no packed-weights cache for the file
    (``first_start_s``: the first start ever, which packs the file and keeps it; the timed ones map it)."""
    forget(path)
    warm(path)
    first = measure_first_token(ours, threads)
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "theirs": []}
    for _ in range(max(1, reps)):
        for side, cmd in (("ours", ours), ("theirs", theirs)):
            warm(path)
            runs[side].append(measure_first_token(cmd, threads))
    out = []
    for side in ("ours", "theirs"):
        ranked = sorted(runs[side], key=lambda r: r["first_token_s"])
        out.append({**ranked[len(ranked) // 2], "first_token_runs_s": [r["first_token_s"] for r in runs[side]]})
    out[0].update(first_start_s=first["first_token_s"], first_start_peak_rss_mib=first["peak_rss_mib"])
    return out[0], out[1]


def _ours_cmd(gguf: Path, threads: int) -> list[str]:
    return [sys.executable, "-c", "import sys; from specdecode.cli import main; sys.exit(main())", "generate",
            "--target", str(gguf), "--prompt", "Hello", "--max-new-tokens", "1", "--drafter", "none"]


def _theirs_cmd(bin_dir: Path, gguf: Path, threads: int) -> list[str]:
    return [str(bin_dir / "llama-simple"), "-m", str(gguf), "-n", "1", "Hello"]


def costs(target: str, draft: Optional[str], context: int, max_gamma: int = 8) -> dict[str, Any]:
    """v(1..max_gamma) of the target's verify pass and c of a draft model's step (the child side): the
    engine's own cost measurement (``sizing.costs.measure_costs``) after a ``context``-token prompt."""
    t = load_model(target)
    d = load_model(draft) if draft else None
    prompt = torch.randint(100, min(t.vocab_size, 30000), (context,), generator=torch.Generator().manual_seed(0))
    m = measure_costs(t, d, max_gamma=max_gamma, reps=7, context=prompt.tolist())
    return {"v": list(m.v[1:]), "c": m.c if d is not None else None, "one_token_s": m.target_s[0]}


def predicted(c: float, v: list[float]) -> dict[str, dict[str, float]]:
    """The speedup the theory predicts (Leviathan et al.: E(α, γ) / (γc + v(γ)), the best γ of 1..len(v)) at
    α = 0.6, 0.7, 0.8: a prediction from measured costs, since random weights say nothing about α."""
    out = {}
    for alpha in (0.6, 0.7, 0.8):
        s, g = max((predicted_speedup(alpha, g, c, v[g - 1]), g) for g in range(1, len(v) + 1))
        out[str(alpha)] = {"speedup": s, "gamma": g}
    return out


def _costs_child(target: Path, draft: Optional[Path], threads: int, context: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "specdecode.bench.ladder", "--child-costs", str(target), "--context", str(context)]
    if draft is not None:
        cmd += ["--draft", str(draft)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600,
                       env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if p.returncode != 0:
        raise RuntimeError(f"costs on {target} failed: {p.stderr[-1500:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def quantize_file(quantize_bin: Path, f16: Path, fmt: str, out: Path) -> None:
    if out.is_file():
        return
    tmp = out.with_suffix(".tmp")
    subprocess.run([str(quantize_bin), str(f16), str(tmp), fmt], check=True, capture_output=True)
    tmp.rename(out)


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ap = sub.add_parser("ladder", help="random-weight GGUFs at real shapes (360M..8B), quantized by llama.cpp: "
                                       "peak RSS, load, decode tok/s, ours beside llama.cpp's",
                        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp build folder (scripts/build_llama_cpp.sh)")
    ap.add_argument("--rungs", default="360m,1.7b", help=f"comma-separated, of {', '.join(SHAPES)} "
                                                         "(default: %(default)s)")
    ap.add_argument("--formats", default="Q4_K_M,Q8_0,Q4_0", help="llama-quantize types (default: %(default)s)")
    ap.add_argument("--dir", default="runs/ladder", help="where the GGUF files go (default: %(default)s)")
    ap.add_argument("--tokenizer-gguf", default="smollm2-135m-instruct",
                    help="a GGUF whose tokenizer the rungs use, or a catalogue name (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="threads for both (default: %(default)s)")
    ap.add_argument("--context", type=int, default=512, help="context before the timed decode (default: %(default)s)")
    ap.add_argument("--n", type=int, default=64, help="decode steps timed (default: %(default)s)")
    ap.add_argument("--load-reps", type=int, default=3,
                    help="starts to a first token per side, in turn, each from a warm file; the median is reported")
    ap.add_argument("--no-speed", action="store_true", help="memory and load only")
    ap.add_argument("--no-costs", action="store_true", help="skip v(1..8), c and the predicted speedups")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.set_defaults(func=cmd_ladder)


def ladder_files(a: argparse.Namespace) -> list[tuple[str, str, Path]]:
    """(rung, format, file) for every rung and format, written and quantized when missing."""
    build = locate(a.llama_cpp)
    tok = resolve_model_path(a.tokenizer_gguf)
    root = Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for rung in a.rungs.split(","):
        if rung not in SHAPES:
            raise SystemExit(f"--rungs: unknown rung {rung!r}; use some of {', '.join(SHAPES)}")
        f16 = root / f"{rung}-F16.gguf"
        formats = [f for f in a.formats.split(",") if f]
        if not f16.is_file() and not all((root / f"{rung}-{f}.gguf").is_file() for f in formats):
            print(f"writing {f16} ({SHAPES[rung].name} shape, random weights)", file=sys.stderr)
            write_f16(SHAPES[rung], tok, f16)
        for fmt in formats:
            q = root / f"{rung}-{fmt}.gguf"
            print(f"quantizing {q.name}", file=sys.stderr)
            quantize_file(build.bin_dir / "llama-quantize", f16, fmt, q)
            out.append((rung, fmt, q))
    return out


def cmd_ladder(a: argparse.Namespace) -> int:
    build = locate(a.llama_cpp)
    rows: list[dict[str, Any]] = []
    files = ladder_files(a)
    for rung, fmt, path in files:
        row: dict[str, Any] = {"rung": rung, "format": fmt, "file_mib": path.stat().st_size / 2**20}
        row["ours"], row["llama.cpp"] = load_pair(path, _ours_cmd(path, a.threads),
                                                  _theirs_cmd(build.bin_dir, path, a.threads), a.threads, a.load_reps)
        if not a.no_speed:
            row["ours"]["tokens_per_s"] = _ours_child(str(path), a.threads, a.context, a.n)["tokens_per_s"]
            row["llama.cpp"]["tokens_per_s"] = theirs(build.bin_dir / "llama-bench", str(path), a.threads,
                                                      a.context, a.n)["tokens_per_s"]
        if not a.no_costs:
            smaller = [p for r, f, p in files if f == fmt and SHAPES[r].dim < SHAPES[rung].dim]
            draft = smaller[-1] if smaller else None
            row["costs"] = _costs_child(path, draft, a.threads, a.context)
            row["costs"]["draft"] = draft.name if draft else None
            if draft is not None:
                row["predicted"] = predicted(row["costs"]["c"], row["costs"]["v"])
        rows.append(row)
        print(_line(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"threads": a.threads, "context": a.context, "n": a.n, "rows": rows},
                                           indent=1))
    print()
    print(markdown(rows))
    return 0


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as the README's table: per file, ours beside llama.cpp's."""
    out = ["| rung | format | file MiB | peak RSS MiB, ours / llama.cpp | first token s, ours / llama.cpp "
           "| ours' first start ever s | decode tok/s, ours / llama.cpp (ratio) | v(4) | v(8) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o, t = r["ours"], r["llama.cpp"]
        speed = (f"{o['tokens_per_s']:.1f} / {t['tokens_per_s']:.1f} ({o['tokens_per_s'] / t['tokens_per_s']:.2f}×)"
                 if "tokens_per_s" in o else "")
        v = r.get("costs", {}).get("v")
        costs = f"{v[3]:.2f} | {v[7]:.2f}" if v else " | "
        out.append(f"| {SHAPES[r['rung']].name} | {r['format']} | {r['file_mib']:.0f} | {o['peak_rss_mib']:.0f} / "
                   f"{t['peak_rss_mib']:.0f} | {o['first_token_s']:.1f} / {t['first_token_s']:.1f} | "
                   f"{o.get('first_start_s', float('nan')):.1f} | {speed} | "
                   f"{costs} |")
    return "\n".join(out)


def _line(r: dict[str, Any]) -> str:
    o, t = r["ours"], r["llama.cpp"]
    speed = ""
    if "tokens_per_s" in o:
        speed = (f"  tok/s {o['tokens_per_s']:6.2f} vs {t['tokens_per_s']:6.2f} "
                 f"({o['tokens_per_s'] / t['tokens_per_s']:.2f}x)")
    extra = ""
    if "costs" in r:
        v = r["costs"]["v"]
        extra = f"  v(4) {v[3]:.2f} v(8) {v[7]:.2f}"
        if r.get("predicted"):
            extra += f"  c {r['costs']['c']:.3f} ({r['costs']['draft']})  predicted " + " ".join(
                f"{p['speedup']:.2f}x@{alpha}" for alpha, p in r["predicted"].items())
    return (f"{r['rung']:>5} {r['format']:<7} file {r['file_mib']:7.0f} MiB  peak RSS {o['peak_rss_mib']:7.0f} vs "
            f"{t['peak_rss_mib']:7.0f} MiB  first token {o['first_token_s']:5.1f} vs {t['first_token_s']:5.1f} s "
            f"(first start ever {o.get('first_start_s', float('nan')):.1f} s)"
            + speed + extra)


def main(argv: Optional[list[str]] = None) -> int:
    """The child side: ``--child-costs TARGET [--draft DRAFT] --context N`` prints one JSON line."""
    ap = argparse.ArgumentParser(prog="python -m specdecode.bench.ladder")
    ap.add_argument("--child-costs", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--context", type=int, default=512)
    a = ap.parse_args(argv)
    print(json.dumps(costs(a.child_costs, a.draft, a.context)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
