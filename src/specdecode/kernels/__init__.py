"""Fast small-M linear for the CPU (the target verifying gamma+1 tokens at once).

``fast_linear(x, weight, bias)`` is a drop-in for ``F.linear``: when x is fp32 on
the CPU with at most 64 rows (product of its leading dims) and the weight is a
contiguous fp32 or bf16 [N, K] matrix, it runs a C++ kernel (AVX-512 or AVX2/FMA,
chosen at runtime) that reads each weight row once for all rows of x; anything
else goes to ``F.linear`` (a bf16 weight with fp32 x is cast to fp32 there).
Each output row is bit-identical whatever the number of rows in the call.

``fast_linear_bf16(x, weight, bias)`` is the "bf16 dot" variant: with a bf16
weight, x is rounded to bf16 (nearest even) and the exact products are summed in
fp32, i.e. ``F.linear(x.bfloat16().float(), weight.float(), bias)`` up to fp32
summation order; on CPUs with AVX512_BF16 that is ``vdpbf16ps``, about twice the
multiply-adds per cycle of the fp32 path where it issues at the FMA rate, and on
CPUs with AMX-BF16 (Sapphire Rapids on, where Linux grants the tile state) one
tile instruction multiplies 16 weight rows by up to 16 token rows, so a pass over
16 tokens costs little more than one. fp32 weights are unaffected (computed as by
``fast_linear``).

``SPECDECODE_KERNEL_ISA`` = scalar | avx2 | avx512 | avx512bf16 | amx (read once when
the extension loads; default: the best the CPU has; ``avxvnni``, the quantized
kernel's AVX-VNNI path, means avx2 here) forces a code path, for
comparisons and tests; ``set_kernel_isa`` changes it at runtime (for the whole
process: it picks the extension's instructions, not a model's arithmetic). Paths
agree to fp32 rounding, not bit for bit; ``supported_isas`` lists this CPU's.
A call of up to 6 token rows (a decode step, a short verification pass) on the AVX-512 paths
can read its weight rows one after another, one stream, which Zen's prefetchers follow best
(plain decoding 1.15-1.25x on SmolLM2 in bf16), the same bits either way: a model loaded on an
AMD CPU whose weights exceed the last-level cache does so (``for_weights``; a model held in
cache is bound by arithmetic, where it is slower); ``SPECDECODE_KERNEL_STREAMS=1|4`` or
``set_kernel_streams`` sets it for every model instead.

The extension is compiled on first use with ``torch.utils.cpp_extension.load``
and cached under ``$TORCH_EXTENSIONS_DIR`` if set, else
``~/.cache/specdecode/torch_extensions``. If it cannot be built (no compiler, no
ninja, a non-x86 CPU without AVX2), one warning is logged and everything falls
back to ``F.linear``. ``SPECDECODE_FAST_LINEAR=0`` turns the fast path off. Every fall-back is
recorded for the server's /health (``build.extension_problems``).

Which kernels a model runs with belongs to that model, not to the process:
``load_model(path, fast=..., matmul=...)`` picks a ``Kernels`` (``select_kernels``)
and installs it on the module (``install_kernels``), so an eager baseline and a
fast model can run side by side in one process.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Optional, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from .build import BUILD_FAILED, ExtensionBuildError, build_extension, report_fallback
from .fused import fused_ops_available, load_fused_extension

__all__ = [
    "EAGER", "Kernels", "LinearFn", "fast_linear", "fast_linear_available", "fast_linear_bf16", "for_weights",
    "install_kernels", "last_level_cache_bytes",
    "ISAS", "kernel_isa", "kernel_streams", "load_extension", "select_kernels", "set_kernel_isa",
    "set_kernel_streams", "supported_isas",
]


class LinearFn(Protocol):
    """``F.linear``'s call shape (bias optional), which every installed projection kernel takes."""

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, /) -> torch.Tensor:
        ...


logger = logging.getLogger(__name__)

ENV_VAR = "SPECDECODE_FAST_LINEAR"
ISA_ENV_VAR = "SPECDECODE_KERNEL_ISA"  # read by the extension itself when it loads
STREAMS_ENV_VAR = "SPECDECODE_KERNEL_STREAMS"  # every model's weight streams (the extensions read it too)
_SOURCE = Path(__file__).with_name("smallm_linear.cpp")
EXTENSION = "specdecode_smallm_linear"

_lock = threading.Lock()
_ext: Optional[ModuleType] = None
_load_error: Optional[str] = None  # set once a build failed: never retried in this process
_load_reason = BUILD_FAILED  # /health's name for _load_error
_warned = False


def _env_disabled() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() in {"0", "false", "no", "off"}


def _warn_once(msg: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        logger.warning("fast small-M linear is off, using F.linear: %s", msg)


def load_extension() -> Optional[ModuleType]:
    """The compiled extension (built on first call, then cached), or None if it cannot be built."""
    global _ext, _load_error, _load_reason
    if _ext is not None or _load_error is not None:
        return _ext
    with _lock:
        if _ext is not None or _load_error is not None:
            return _ext
        try:
            ext = build_extension(EXTENSION, _SOURCE)
        except ExtensionBuildError as exc:  # no compiler / ninja / headers: fall back to eager, once
            _load_error = str(exc)
            return None
        if not ext.has_avx2():
            _load_error, _load_reason = "this CPU has no AVX2/FMA", "no_avx2"
            report_fallback(EXTENSION, _load_reason, _load_error)
            return None
        requested = os.environ.get(ISA_ENV_VAR, "").strip().lower().replace("_", "")
        quant_only = requested in ("avxvnni", "avx-vnni", "vnni256") and ext.isa() == "avx2"  # the int8/int4 path
        if requested and requested != "auto" and requested != ext.isa() and not quant_only:  # unknown or absent
            logger.warning("%s=%s: using %s (this CPU supports up to %s)", ISA_ENV_VAR, requested, ext.isa(),
                           ext.best_isa())
        _ext = ext
        return _ext


def fast_linear_available() -> bool:
    """Whether the kernel is usable here (builds it on first call); logs one warning if not, and records
    why for /health (``report_fallback``: the switch is read on every call, so it may turn back on)."""
    if _env_disabled():
        report_fallback(EXTENSION, "disabled", f"{ENV_VAR}={os.environ.get(ENV_VAR, '')} turns it off")
        return False
    if load_extension() is None:
        _warn_once(_load_error or "unknown error")
        report_fallback(EXTENSION, _load_reason, _load_error or "")
        return False
    report_fallback(EXTENSION, None)
    return True


def fast_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear`` drop-in; the small-M kernel when it applies (see the module docstring)."""
    if not _env_disabled() and (_ext is not None or fast_linear_available()):
        return _ext.linear(x, weight, bias)  # type: ignore[union-attr]
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
        if bias is not None:
            bias = bias.to(x.dtype)
    elif bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    return F.linear(x, weight, bias)


def fast_linear_bf16(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``fast_linear`` in bf16-dot mode: a bf16 weight meets x rounded to bf16 (exact products, fp32 sums)."""
    if not _env_disabled() and (_ext is not None or fast_linear_available()):
        return _ext.linear_bf16_dot(x, weight, bias)  # type: ignore[union-attr]
    if x.dtype == torch.float32 and weight.dtype == torch.bfloat16:
        x = x.bfloat16().float()  # the kernel's math, eagerly
    return fast_linear(x, weight, bias)


def kernel_isa() -> Optional[str]:
    """The code path the kernel uses now ("scalar", "avx2", "avx512", "avx512bf16", "amx"), None if unavailable."""
    return _ext.isa() if fast_linear_available() else None  # type: ignore[union-attr]


ISAS = ("scalar", "avx2", "avx512", "avx512bf16", "amx")  # the kernel's code paths, each needing more of the CPU


def kernel_streams() -> Optional[int]:
    """A one-token call's weight streams: 1 (one row after another) or 4 (blocks of rows, the default); None if
    the kernel is unavailable."""
    return int(_ext.streams()) if fast_linear_available() else None  # type: ignore[union-attr]


def set_kernel_streams(n: int = 0) -> int:
    """1 or 4 weight streams for one-token calls, 0 this CPU's default; returns the previous. Speed only: the
    same bits. RuntimeError if the kernel is unavailable."""
    if not fast_linear_available():
        raise RuntimeError(f"fast linear kernel unavailable: {_load_error or 'disabled'}")
    return int(_ext.set_streams(n))  # type: ignore[union-attr]


def supported_isas() -> tuple[str, ...]:
    """The code paths this CPU can run, in ``ISAS`` order (empty when the kernel is unavailable):
    what comparison scripts offer, marking the others absent instead of failing on them."""
    if not fast_linear_available():
        return ()
    assert _ext is not None
    return ISAS[: ISAS.index(_ext.best_isa()) + 1]


def set_kernel_isa(isa: str = "auto") -> str:
    """Use another code path ("auto": the best this CPU has); returns the previous one.

    Raises RuntimeError if the kernel is unavailable or the CPU lacks that instruction set.
    """
    if not fast_linear_available():
        raise RuntimeError(f"fast linear kernel unavailable: {_load_error or 'disabled'}")
    return _ext.set_isa(isa)  # type: ignore[union-attr]


@dataclass(frozen=True)
class Kernels:
    """What one model computes its projections and decode-step layers with.

    Held by the model (``install_kernels``), never by the process, so two models in one
    process can differ: the bench's eager baseline beside the fast target, a draft
    with other settings than its target.

    ``linear``: every projection (``F.linear`` or the small-M kernel). ``fused``: the fused
    decode-op extension for Llama layers, or None for the eager layer. ``native``: ``linear``
    as C++ can call it, (function address, bf16_dot), with (0, False) meaning ``at::linear``;
    None when only Python can call it (then the fused path loops over layers in Python).
    ``mode``: "eager", "fp32" or "bf16_dot", what the cost cache and the bench record.
    ``streams``: a one-token call's weight streams, 1 where the model chose one (``for_weights``), else 0 (the
    process setting: ``kernel_streams``).
    """

    linear: LinearFn = F.linear
    fused: Optional[ModuleType] = None
    native: Optional[tuple[int, bool]] = (0, False)
    mode: str = "eager"
    streams: int = 0

    @property
    def fast(self) -> bool:
        """Whether the small-M kernel does the projections."""
        return self.mode != "eager"

    def describe(self) -> str:
        """A short label, e.g. "bf16_dot/avx2+fused": the cost cache key (timings differ per kernel and code path)."""
        label = self.mode
        if self.fast and _ext is not None:
            label += f"/{_ext.isa()}"
        return label + ("+fused" if self.fused is not None else "")


EAGER = Kernels()


def select_kernels(fast: bool, matmul: str, device: torch.device) -> Kernels:
    """The kernels a model loaded on ``device`` runs with: the small-M kernel (``matmul`` "bf16":
    bf16-dot products for bf16 weights, "fp32": exact products) and the fused ops on the CPU when
    ``fast`` and they build here, else ``EAGER`` (a failed build logs one line, once)."""
    if not fast or device.type != "cpu" or not fast_linear_available():
        return EAGER
    assert _ext is not None
    bf16_dot = matmul == "bf16"
    fused = load_fused_extension() if fused_ops_available() else None
    return Kernels(linear=_ext.linear_bf16_dot if bf16_dot else _ext.linear, fused=fused,
                   native=(int(_ext.linear_address(False)), bf16_dot), mode="bf16_dot" if bf16_dot else "fp32")


def last_level_cache_bytes() -> Optional[int]:
    """The largest CPU cache's size (Linux sysfs), None where unknown."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper() if f.is_file() else ""
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        digits = text.rstrip("KM")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def for_weights(kernels: Kernels, weight_bytes: int) -> Kernels:
    """``kernels`` for a model of ``weight_bytes`` dense weights: its decode steps and short verification passes
    read one weight stream where that pays, on an AMD CPU (its prefetchers follow one stream best) when the weights
    exceed the last-level cache, so that a step reads them from memory (plain decoding, Zen 5, 1 thread: SmolLM2-135M
    bf16 1.15-1.25x, the bundled code model 1.35-1.5x). A model held in cache is bound by arithmetic, where one row
    at a time pays a horizontal sum a row (the bundled 2-block draft model's steps 0.85-0.9x): it keeps the blocks.
    Unchanged where ``SPECDECODE_KERNEL_STREAMS`` sets every model's, or the kernel is not the small-M one."""
    if not kernels.fast or _ext is None or os.environ.get(STREAMS_ENV_VAR) or not _ext.is_amd():
        return kernels
    llc = last_level_cache_bytes()
    if llc is None or weight_bytes <= llc or kernels.linear not in (_ext.linear, _ext.linear_bf16_dot):
        return kernels
    bf16_dot = kernels.linear == _ext.linear_bf16_dot
    native = (int(_ext.linear_address(True)), bf16_dot) if kernels.native is not None else None
    return replace(kernels, linear=_ext.linear_bf16_dot_one if bf16_dot else _ext.linear_one, native=native,
                   streams=1)


def install_kernels(module: nn.Module, kernels: Kernels) -> None:
    """Make ``module`` and every submodule that reads kernels (a class attribute ``kernels``,
    ``EAGER`` by default, so a module built for training runs eager) use ``kernels``."""
    for m in module.modules():
        if isinstance(getattr(type(m), "kernels", None), Kernels):
            setattr(m, "kernels", kernels)  # nn.Module's __setattr__ is typed for tensors and modules only
