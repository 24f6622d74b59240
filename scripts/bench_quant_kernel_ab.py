"""Before/after for the quantized kernel: this tree's ``quant_linear.cpp`` against the one at a git revision.

Both builds run in one process, alternating call sequence by call sequence, on the matrices of a
Qwen2.5-0.5B-shaped decoder (24 layers of qkv 1152x896, o 896x896, gate/up 9728x896, down
896x4864: ~380 MB at int8, more than any L3, so every call streams from DRAM as a decode step does).
It first checks that both give bit-identical outputs, then prints the median time of the whole
sequence per build and their ratio, for each format, ISA path and number of token rows.

    python scripts/bench_quant_kernel_ab.py --rev 07cff47 --formats int8,int4 --isa vnni512 --rows 1,5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.utils.cpp_extension as cpp

from specdecode.kernels.build import CFLAGS, LDFLAGS
from specdecode.kernels.quant import quantize

SOURCE = "src/specdecode/kernels/quant_linear.cpp"
SHAPES = [(1152, 896), (896, 896), (9728, 896), (896, 4864)]  # per layer: (out, in)


def build(name: str, source: Path, build_dir: Path):  # type: ignore[no-untyped-def]
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp.load(name=name, sources=[str(source)], extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                    build_directory=str(build_dir))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", required=True, help="git revision whose quant_linear.cpp is 'before'")
    ap.add_argument("--formats", default="int8,int4")
    ap.add_argument("--isa", default="auto", help="auto, scalar, avx2 or vnni512 (both builds take the same path)")
    ap.add_argument("--rows", default="1,5", help="token rows per call (1: a decode step; 5: verifying 4 drafts)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="quant-ab-"))
    old_src = tmp / "quant_linear_before.cpp"
    old_src.write_text(subprocess.run(["git", "-C", str(root), "show", f"{args.rev}:{SOURCE}"], check=True,
                                      capture_output=True, text=True).stdout)
    exts = {"before": build("quant_ab_before", old_src, tmp / "before"),
            "after": build("quant_ab_after", root / SOURCE, tmp / "after")}
    isa = None if args.isa == "auto" else args.isa
    for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
        torch.manual_seed(0)
        mats = [(quantize(torch.randn(n, k) * 0.02, fmt), k) for _ in range(args.layers) for n, k in SHAPES]
        mbytes = sum(w.numel() for w, _ in mats) / 1e6
        for m in [int(r) for r in args.rows.split(",")]:
            xs = {k: torch.randn(m, k) for k in {k for _, k in SHAPES}}
            for w, k in mats[:len(SHAPES)]:
                a, b = (e.quant_linear(xs[k], w, None, isa) for e in exts.values())
                assert torch.equal(a, b), "the two builds disagree: not a pure speed change"
            times: dict[str, list[float]] = {name: [] for name in exts}
            for r in range(args.reps + 1):  # the first round warms up
                for name, ext in (list(exts.items()) if r % 2 == 0 else list(exts.items())[::-1]):
                    t0 = time.perf_counter()
                    for w, k in mats:
                        ext.quant_linear(xs[k], w, None, isa)
                    if r:
                        times[name].append(time.perf_counter() - t0)
            before, after = (statistics.median(times[n]) for n in ("before", "after"))
            print(f"{fmt} isa={args.isa} rows={m} ({mbytes:.0f} MB of weights): before {1e3 * before:.1f} ms "
                  f"({mbytes / 1e3 / before:.1f} GB/s), after {1e3 * after:.1f} ms ({mbytes / 1e3 / after:.1f} GB/s), "
                  f"speedup {before / after:.3f}, outputs bit-identical", flush=True)


if __name__ == "__main__":
    main()
