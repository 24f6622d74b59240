"""Fused decode-step ops for Llama-family layers on the CPU (``decode_ops.cpp``).

A small model's decode step on a CPU is mostly dispatch overhead: ~50 ATen ops
per layer for a few thousand FLOPs each. With these ops a layer's non-matmul
work is three calls (RMSNorm fused with the residual add, attention with RoPE
and the KV-cache write, SiLU-gating), which cuts the draft's step time, and so
c, the draft/target cost ratio that every speculative speedup divides by.

A model uses them when it was loaded with the small-M kernel (``load_model(...,
fast=True)``, the default; see ``specdecode.kernels.Kernels``); ``SPECDECODE_FUSED_OPS=0``
keeps the eager layer. Models use them only for fp32 activations on the CPU with a KV
cache (decode and verification), stored as fp32, fp16 or bf16 (``load_model(..., kv_dtype=)``:
the kernel rounds new keys/values to it once and widens stored ones exactly, computing in fp32);
training and other dtypes/devices run the eager ops. On AVX-512 attention over an fp16/bf16 cache runs 16 lanes
wide with the 8-wide walk's bits (``attention_isa``/``set_attention_isa`` on the extension;
``SPECDECODE_KERNEL_ISA=avx2`` keeps 8).
Helpers that are exact either way (``ops.argmax_list``, ``sampling.draw``) use the
extension whenever it is loaded (``loaded_fused_extension``).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from types import ModuleType
from typing import Optional

from .build import BUILD_FAILED, ExtensionBuildError, build_extension, report_fallback

__all__ = ["fused_ops_available", "load_fused_extension", "loaded_fused_extension"]

logger = logging.getLogger(__name__)

ENV_VAR = "SPECDECODE_FUSED_OPS"
_SOURCE = Path(__file__).with_name("decode_ops.cpp")
EXTENSION = "specdecode_decode_ops"
_lock = threading.Lock()
_ext: Optional[ModuleType] = None
_error: Optional[str] = None  # set once a build failed: never retried in this process
_reason = BUILD_FAILED  # /health's name for _error
_warned = False


def load_fused_extension() -> Optional[ModuleType]:
    """The compiled extension (built on first call, then cached), or None if it cannot be used here."""
    global _ext, _error, _reason
    if _ext is not None or _error is not None:
        return _ext
    with _lock:
        if _ext is None and _error is None:
            try:
                ext = build_extension(EXTENSION, _SOURCE)
            except ExtensionBuildError as exc:
                _error = str(exc)
                return None
            if not ext.has_avx2():
                _error, _reason = "this CPU has no AVX2/FMA/F16C", "no_avx2"
                report_fallback(EXTENSION, _reason, _error)
                return None
            _ext = ext
    return _ext


def fused_ops_available() -> bool:
    """Whether the fused ops can run here (builds them on first call); logs one warning if not, and records
    why for /health (``report_fallback``: the switch is read on every call, so it may turn back on)."""
    global _warned
    if os.environ.get(ENV_VAR, "").strip().lower() in {"0", "false", "no", "off"}:
        report_fallback(EXTENSION, "disabled", f"{ENV_VAR}={os.environ.get(ENV_VAR, '')} turns it off")
        return False
    if load_fused_extension() is None:
        if not _warned:
            _warned = True
            logger.warning("fused decode ops are off, using eager ops: %s", _error)
        report_fallback(EXTENSION, _reason, _error or "")
        return False
    report_fallback(EXTENSION, None)
    return True


def loaded_fused_extension() -> Optional[ModuleType]:
    """The extension if something already loaded it (never builds it): for exact helper ops that
    need no model's say, such as an argmax or an inverse-CDF draw."""
    return _ext
