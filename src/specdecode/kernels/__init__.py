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
multiply-adds per cycle of the fp32 path (verifying several tokens costs little
more than one). fp32 weights are unaffected (computed as by ``fast_linear``).

``SPECDECODE_KERNEL_ISA`` = scalar | avx2 | avx512 | avx512bf16 (read once when
the extension loads; default: the best the CPU has) forces a code path, for
comparisons and tests; ``set_kernel_isa`` changes it at runtime. Paths agree to
fp32 rounding, not bit for bit.

The extension is compiled on first use with ``torch.utils.cpp_extension.load``
and cached under ``$TORCH_EXTENSIONS_DIR`` if set, else
``~/.cache/specdecode/torch_extensions``. If it cannot be built (no compiler, no
ninja, a non-x86 CPU without AVX2), one warning is logged and everything falls
back to ``F.linear``. ``SPECDECODE_FAST_LINEAR=0`` turns the fast path off.

Nothing enables it by default: call ``enable_fast_linear()`` (it installs the
kernel with ``specdecode.ops.set_linear_impl``), or ``enable_fast_linear(bf16_dot=True)``
for the bf16-dot variant.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Optional

import torch
import torch.nn.functional as F

from .. import ops
from .build import ExtensionBuildError, build_extension

__all__ = [
    "enable_fast_linear", "fast_linear", "fast_linear_available", "fast_linear_bf16", "fast_linear_enabled",
    "fast_linear_mode", "kernel_isa", "load_extension", "native_linear", "set_kernel_isa",
]

logger = logging.getLogger(__name__)

ENV_VAR = "SPECDECODE_FAST_LINEAR"
ISA_ENV_VAR = "SPECDECODE_KERNEL_ISA"  # read by the extension itself when it loads
_SOURCE = Path(__file__).with_name("smallm_linear.cpp")

_lock = threading.Lock()
_ext: Optional[ModuleType] = None
_load_error: Optional[str] = None  # set once a build failed: never retried in this process
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
    global _ext, _load_error
    if _ext is not None or _load_error is not None:
        return _ext
    with _lock:
        if _ext is not None or _load_error is not None:
            return _ext
        try:
            ext = build_extension("specdecode_smallm_linear", _SOURCE)
        except ExtensionBuildError as exc:  # no compiler / ninja / headers: fall back to eager, once
            _load_error = str(exc)
            return None
        if not ext.has_avx2():
            _load_error = "this CPU has no AVX2/FMA"
            return None
        requested = os.environ.get(ISA_ENV_VAR, "").strip().lower().replace("_", "")
        if requested and requested != "auto" and requested != ext.isa():  # unknown or not on this CPU
            logger.warning("%s=%s: using %s (this CPU supports up to %s)", ISA_ENV_VAR, requested, ext.isa(),
                           ext.best_isa())
        _ext = ext
        return _ext


def fast_linear_available() -> bool:
    """Whether the kernel is usable here (builds it on first call); logs one warning if not."""
    if _env_disabled():
        return False
    if load_extension() is None:
        _warn_once(_load_error or "unknown error")
        return False
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


def fast_linear_mode() -> Optional[str]:
    """Which kernel variant is the installed ``specdecode.ops.linear``: "fp32", "bf16_dot", or None."""
    if _ext is None:
        return None
    if ops._linear_impl is _ext.linear:
        return "fp32"
    if ops._linear_impl is _ext.linear_bf16_dot:
        return "bf16_dot"
    return None


def fast_linear_enabled() -> bool:
    """Whether the kernel (either variant) is the installed ``specdecode.ops.linear`` implementation."""
    return fast_linear_mode() is not None


def enable_fast_linear(enabled: bool = True, bf16_dot: bool = False) -> bool:
    """Install (or, with False, remove) the kernel as ``specdecode.ops.linear``; True if it is active.

    ``bf16_dot=True`` installs the bf16-dot variant (see ``fast_linear_bf16``): faster
    with bf16 weights, x rounded to bf16; the default keeps exact fp32 products.
    Returns False, leaving ``F.linear`` in place, when ``SPECDECODE_FAST_LINEAR=0``
    or the kernel cannot be built here.
    """
    if not enabled:
        if fast_linear_enabled():
            ops.set_linear_impl(None)
        return False
    if not fast_linear_available():
        ops.set_linear_impl(None)  # as documented: F.linear is what runs now
        return False
    assert _ext is not None
    # The extension's own entry points: checks and the eager fallback are in C++,
    # so the per-call cost over F.linear is one pybind call.
    ops.set_linear_impl(_ext.linear_bf16_dot if bf16_dot else _ext.linear)
    return True


def kernel_isa() -> Optional[str]:
    """The code path the kernel uses now ("scalar", "avx2", "avx512", "avx512bf16"), None if unavailable."""
    return _ext.isa() if fast_linear_available() else None  # type: ignore[union-attr]


def set_kernel_isa(isa: str = "auto") -> str:
    """Use another code path ("auto": the best this CPU has); returns the previous one.

    Raises RuntimeError if the kernel is unavailable or the CPU lacks that instruction set.
    """
    if not fast_linear_available():
        raise RuntimeError(f"fast linear kernel unavailable: {_load_error or 'disabled'}")
    return _ext.set_isa(isa)  # type: ignore[union-attr]


def native_linear() -> Optional[tuple[int, bool]]:
    """The installed ``ops.linear`` as C++ can call it: (function address, bf16_dot), (0, False) for
    ``F.linear`` (eager ``at::linear``), or None for any other implementation (then only Python may call it)."""
    if ops._linear_impl is F.linear:
        return 0, False
    mode = fast_linear_mode()
    if mode is None:
        return None
    assert _ext is not None
    return int(_ext.linear_address()), mode == "bf16_dot"
