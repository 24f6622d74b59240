"""GGUF rows as stored, straight from the mapped file into the quantized kernel's layouts (``repack.cpp``).

Why: a model's load is mostly this move. The torch packers (``quant.pack_gguf``, ``pack_q4k``, ``pack_q6k``,
``quant_b32.pack_b32``) make several temporaries a weight, a chunk of rows at a time; the extension writes each
output byte once, 16-row groups in parallel, into memory advised for transparent huge pages. Both produce the same
bytes (``tests/unit/test_repack.py`` compares them on random blocks); where the extension cannot build, the loader
keeps the torch packers.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

import numpy as np
import torch

from .build import ExtensionBuildError, build_extension
from .quant import packed_dtype
from .quant_b32 import B32_FORMATS

__all__ = ["DECODABLE", "REPACK_FORMATS", "load_repack_extension", "repack", "round_int8"]

# GGUF type -> the kernel format its rows are repacked into, bytes untouched
REPACK_FORMATS = {"Q8_0": "int8", "Q4_0": "int4", "Q4_K": "q4k", "Q5_K": "q5k", "Q6_K": "q6k",
                  **{f.gguf: name for name, f in B32_FORMATS.items()}}
DECODABLE = frozenset({"F32", "F16", "BF16", *REPACK_FORMATS})  # types ``round_int8`` decodes
EXTENSION = "specdecode_repack"
_SOURCE = Path(__file__).with_name("repack.cpp")
_lock = threading.Lock()
_ext: Optional[ModuleType] = None
_error: Optional[str] = None  # set once a build failed: never retried in this process


def load_repack_extension() -> Optional[ModuleType]:
    """The compiled extension (built on first call, then cached), or None where it cannot build."""
    global _ext, _error
    if _ext is None and _error is None:
        with _lock:
            if _ext is None and _error is None:
                try:
                    _ext = build_extension(EXTENSION, _SOURCE)
                except ExtensionBuildError as exc:
                    _error = str(exc)
    return _ext


Part = tuple[str, np.ndarray, Optional[torch.Tensor]]  # GGUF type, stored rows [rows, bytes] (mapped), row order


def _marshal(parts: Sequence[Part]) -> tuple[list[str], list[int], list[int], list[torch.Tensor], list[int]]:
    kinds, bases, counts, index, row_bytes = [], [], [], [], []
    for kind, rows, order in parts:
        if rows.dtype != np.uint8 or rows.ndim != 2 or not rows.flags.c_contiguous:
            raise ValueError("repack takes each part's stored rows as one C-contiguous uint8 [rows, bytes] array")
        kinds.append(kind)
        bases.append(rows.ctypes.data)  # ``parts`` keeps the mapped rows alive through the call
        counts.append(rows.shape[0])
        index.append(torch.empty(0, dtype=torch.long) if order is None else order.to(torch.long))
        row_bytes.append(rows.shape[1])
    return kinds, bases, counts, index, row_bytes


def repack(parts: Sequence[Part], k: int) -> Optional[torch.Tensor]:
    """The matrix stacking ``parts`` (one GGUF type, ``REPACK_FORMATS``; ``k`` inputs a row) in that type's kernel
    layout, bytes untouched, marked by the format's dtype; None where the extension is unavailable (the caller
    packs in torch)."""
    ext = load_repack_extension()
    if ext is None:
        return None
    kinds, bases, counts, index, row_bytes = _marshal(parts)
    if len(set(kinds)) != 1 or len(set(row_bytes)) != 1:
        raise ValueError(f"repack moves one GGUF type with one row width, got {sorted(set(kinds))}")
    out = ext.repack(kinds[0], bases, counts, index, k, row_bytes[0])
    return out.view(packed_dtype(REPACK_FORMATS[kinds[0]]))


def round_int8(parts: Sequence[Part], k: int) -> Optional[torch.Tensor]:
    """The matrix stacking ``parts`` (types may differ: F32/F16/BF16 and the ``REPACK_FORMATS`` types) decoded and
    rounded once to int8: ``quant.quantize(decoded, "int8")``'s bytes in one pass; None where the extension is
    unavailable."""
    ext = load_repack_extension()
    if ext is None:
        return None
    kinds, bases, counts, index, row_bytes = _marshal(parts)
    out = ext.round_int8(kinds, bases, counts, index, k, row_bytes)
    return out.view(packed_dtype("int8"))
