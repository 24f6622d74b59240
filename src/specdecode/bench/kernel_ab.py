"""`specdecode bench kernel-ab`: the quantized kernel of this tree against the one at a git revision.

Why: a kernel change must be a pure speed change. Both builds run in one process, alternating call
sequence by call sequence, on the matrices of a Qwen2.5-0.5B-shaped decoder (24 layers of qkv
1152x896, o 896x896, gate/up 9728x896, down 896x4864: ~380 MB at int8, more than any L3, so every
call streams from DRAM as a decode step does). It first checks that both give bit-identical outputs,
then prints the median time of the whole sequence per build and their ratio, for each format, ISA
path and number of token rows.

    specdecode bench kernel-ab --rev 07cff47 [--formats int8,int4] [--isa vnni512] [--rows 1,5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..kernels.build import CFLAGS, LDFLAGS
from ..kernels.quant import quantize
from .flags import parse_int_list

SOURCE = "src/specdecode/kernels/quant_linear.cpp"  # its path in the repository
SHAPES = [(1152, 896), (896, 896), (9728, 896), (896, 4864)]  # per layer: (out, in)


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("kernel-ab", help="the quantized kernel against its source at a git revision "
                                         "(bit-identical outputs, then time)",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", required=True, help="git revision whose quant_linear.cpp is 'before'")
    p.add_argument("--repo", default=None, help="the git checkout to read it from (default: the one holding this "
                                                "package, else the current directory)")
    p.add_argument("--formats", default="int8,int4", help="(default: %(default)s)")
    p.add_argument("--isa", default="auto",
                   help="auto, scalar, avx2, avxvnni or vnni512 (both builds take the same path)")
    p.add_argument("--rows", default="1,5", help="token rows per call (1: a decode step; 5: verifying 4 drafts)")
    p.add_argument("--layers", type=int, default=24, help="(default: %(default)s)")
    p.add_argument("--reps", type=int, default=7, help="timed rounds (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="(default: %(default)s)")
    p.set_defaults(func=cmd_kernel_ab)


def _build(name: str, source: Path, build_dir: Path) -> Any:
    import torch.utils.cpp_extension as cpp  # lazy: ~80 ms (setuptools), for this command alone

    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp.load(name=name, sources=[str(source)], extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                    build_directory=str(build_dir))


def _repo(given: str | None) -> Path:
    if given:
        return Path(given)
    here = Path(__file__).resolve().parents[3]  # src/specdecode/bench/ -> the checkout, when installed editable
    return here if (here / ".git").exists() else Path.cwd()


def cmd_kernel_ab(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    after_src = Path(__file__).resolve().parents[1] / "kernels" / "quant_linear.cpp"
    tmp = Path(tempfile.mkdtemp(prefix="quant-ab-"))
    old_src = tmp / "quant_linear_before.cpp"
    old_src.write_text(subprocess.run(["git", "-C", str(_repo(args.repo)), "show", f"{args.rev}:{SOURCE}"],
                                      check=True, capture_output=True, text=True).stdout)
    exts = {"before": _build("quant_ab_before", old_src, tmp / "before"),
            "after": _build("quant_ab_after", after_src, tmp / "after")}
    isa = None if args.isa == "auto" else args.isa
    for fmt in [f.strip() for f in args.formats.split(",") if f.strip()]:
        torch.manual_seed(0)
        mats = [(quantize(torch.randn(n, k) * 0.02, fmt), k) for _ in range(args.layers) for n, k in SHAPES]
        mbytes = sum(w.numel() for w, _ in mats) / 1e6
        for m in parse_int_list(args.rows, "--rows"):
            xs = {k: torch.randn(m, k) for k in {k for _, k in SHAPES}}
            for w, k in mats[:len(SHAPES)]:
                a, b = (e.quant_linear(xs[k], w, None, isa) for e in exts.values())
                if not torch.equal(a, b):
                    print(f"{fmt} rows={m}: the two builds disagree: not a pure speed change")
                    return 1
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
                  f"({mbytes / 1e3 / before:.1f} GB/s), after {1e3 * after:.1f} ms "
                  f"({mbytes / 1e3 / after:.1f} GB/s), speedup {before / after:.3f}, outputs bit-identical",
                  flush=True)
    return 0
