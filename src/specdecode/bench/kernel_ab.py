"""`specdecode bench kernel-ab`: the quantized kernel of this tree against the one at a git revision.

Why: a kernel change must be a pure speed change. Both builds run in one process, alternating call
sequence by call sequence, on the matrices of a Qwen2.5-0.5B-shaped decoder (24 layers of qkv
1152x896, o 896x896, gate/up 9728x896, down 896x4864: ~380 MB at int8, more than any L3, so every
call streams from DRAM as a decode step does). It first checks that both give bit-identical outputs,
then prints the median time of the whole sequence per build and their ratio, for each format, ISA
path and number of token rows.

    specdecode bench kernel-ab --rev 07cff47 [--formats int8,int4] [--isa vnni512] [--rows 1,5]

``--formats`` also takes the GGUF block formats the kernel computes as stored (q4k, q5k, q6k, q5_0, q4_1,
q5_1: random blocks with a sane fp16 scale), and ``--shapes`` other (out x in) matrices per layer, e.g.
SmolLM2-360M's short rows: ``--shapes 1280x960,960x960,5120x960,960x2560``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..kernels.build import CFLAGS, LDFLAGS
from ..kernels.quant import Q6K_BLOCK_BYTES, pack_q6k, quantize
from ..kernels.quant_b32 import B32_FORMATS, pack_b32
from ..kernels.quant_q4k import Q4K_BLOCK_BYTES, pack_q4k
from ..kernels.quant_q5k import Q5K_BLOCK_BYTES, pack_q5k
from .flags import parse_int_list

SOURCE = "src/specdecode/kernels/quant_linear.cpp"  # its path in the repository
SHAPES = [(1152, 896), (896, 896), (9728, 896), (896, 4864)]  # per layer: (out, in)
# GGUF super-block formats: (block bytes, offsets of the fp16 scales to make sane, packer)
K_FORMATS: dict[str, tuple[int, tuple[int, ...], Callable[[torch.Tensor], torch.Tensor]]] = {
    "q4k": (Q4K_BLOCK_BYTES, (0, 2), pack_q4k), "q5k": (Q5K_BLOCK_BYTES, (0, 2), pack_q5k),
    "q6k": (Q6K_BLOCK_BYTES, (208,), pack_q6k)}
FORMATS = ("int8", "int4", *K_FORMATS, *B32_FORMATS)


def random_packed(n: int, k: int, fmt: str, g: torch.Generator) -> torch.Tensor:
    """An [n, k] weight in ``fmt``'s packed layout: int8/int4 quantized from Gaussian weights, the GGUF formats
    from random blocks whose fp16 scales are set to 2^-10 (random bytes elsewhere: any bits are valid quants)."""
    if fmt in ("int8", "int4"):
        return quantize(torch.randn(n, k, generator=g) * 0.02, fmt)
    if fmt in K_FORMATS:
        size, scales, pack = K_FORMATS[fmt]
        per = 256
    else:
        f = B32_FORMATS[fmt]
        size, scales, per = f.block_bytes, tuple(x for x in (f.d, f.m) if x is not None), 32
        pack = lambda raw: pack_b32(raw, fmt)  # noqa: E731
    raw = torch.randint(0, 256, (n, k // per, size), dtype=torch.uint8, generator=g)
    half = torch.tensor([2.0 ** -10], dtype=torch.float16).view(torch.uint8)
    for o in scales:
        raw[:, :, o:o + 2] = half
    return pack(raw.view(n, -1))


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``--shapes``: comma-separated OUTxIN."""
    try:
        shapes = [(int(a), int(b)) for a, b in (x.lower().split("x") for x in text.split(",") if x.strip())]
    except ValueError:
        raise SystemExit(f"specdecode bench kernel-ab: error: --shapes {text!r}: give OUTxIN,OUTxIN,... "
                         "(e.g. 960x960,5120x960)") from None
    if not shapes or min(min(s) for s in shapes) < 1:
        raise SystemExit(f"specdecode bench kernel-ab: error: --shapes {text!r}: give positive OUTxIN pairs")
    return shapes


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("kernel-ab", help="the quantized kernel against its source at a git revision "
                                         "(bit-identical outputs, then time)",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", required=True, help="git revision whose quant_linear.cpp is 'before'")
    p.add_argument("--repo", default=None, help="the git checkout to read it from (default: the one holding this "
                                                "package, else the current directory)")
    p.add_argument("--formats", default="int8,int4", help=f"comma-separated, of {', '.join(FORMATS)} "
                                                            "(default: %(default)s)")
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES),
                   help="a layer's matrices, OUTxIN,... (K a multiple of 256 for q4k/q5k/q6k) (default: a "
                        "Qwen2.5-0.5B layer, %(default)s)")
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
    shapes = parse_shapes(args.shapes)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        print(f"specdecode bench kernel-ab: error: --formats {','.join(unknown)} unknown; choose from "
              f"{', '.join(FORMATS)}")
        return 2
    after_src = Path(__file__).resolve().parents[1] / "kernels" / "quant_linear.cpp"
    tmp = Path(tempfile.mkdtemp(prefix="quant-ab-"))
    old_src = tmp / "quant_linear_before.cpp"
    old_src.write_text(subprocess.run(["git", "-C", str(_repo(args.repo)), "show", f"{args.rev}:{SOURCE}"],
                                      check=True, capture_output=True, text=True).stdout)
    exts = {"before": _build("quant_ab_before", old_src, tmp / "before"),
            "after": _build("quant_ab_after", after_src, tmp / "after")}
    isa = None if args.isa == "auto" else args.isa
    for fmt in formats:
        g = torch.Generator().manual_seed(0)
        mats = [(random_packed(n, k, fmt, g), k) for _ in range(args.layers) for n, k in shapes]
        mbytes = sum(w.numel() * w.element_size() for w, _ in mats) / 1e6
        for m in parse_int_list(args.rows, "--rows"):
            xs = {k: torch.randn(m, k) for k in {k for _, k in shapes}}
            for w, k in mats[:len(shapes)]:
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
