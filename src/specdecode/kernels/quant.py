"""Quantized weights for the CPU kernel: int8 (Q8_0) and int4 (Q4_0) blocks of 32 with fp16 scales.
(Over 450 lines: each block format's packer sits beside its dequantizer, the pair the tests compare.)

Formats (``quant_linear.cpp`` has the byte layout). Both are symmetric, llama.cpp's Q8_0 and Q4_0
in arithmetic, so our figures compare with theirs at the same bits per weight (8.5 and 4.5):

- int8: ``d = max|w| / 127`` per block (rounded to fp16), ``q = round(w / d)``. Zero points buy
  nothing at 8 bits (the rounding error is already ~0.2% of the block's range).
- int4: llama.cpp's Q4_0 rule: ``d = w* / -8`` with ``w*`` the block's value of largest magnitude, so
  that value is represented exactly and the other side gets 7 steps; ``q = round(w / d) + 8`` in
  0..15. Measured on the bundled target's layer matrices, a min/zero-point format (Q4_1: scale and
  minimum per block) lowers the relative RMS weight error only from 0.085 to 0.078 (Q8_0: 0.0053),
  for another 16 bits per block (5 bits per weight, +11% bytes, so +11% time on a bandwidth-bound
  step) and a per-block activation-sum term in the integer loop. Q4_0 costs +0.6% held-out
  perplexity there, and the quantized drafter, its main user, needs
  only proposals the target accepts, so the cheaper format wins.

- q4k: GGUF's Q4_K as stored (``pack_q4k``, int16-marked; 4.625 bits per weight): super-blocks of 256 with
  fp16 d and dmin and 6-bit scales and mins per 32, ``w = d * sc * q - dmin * m``. Only loaded, never made
  here (``quantize`` makes int8 / int4); the kernel computes those weights exactly, no second rounding.
- q6k: GGUF's Q6_K as stored (``pack_q6k``, int32-marked; 6.625 bits per weight): super-blocks of 256 with fp16 d
  and int8 scales per 16, q in 0..63 split into a nibble plane and a 2-bit plane, ``w = (d * sc) * (q - 32)``.
  Likewise only loaded, computed exactly as stored.
- q5k: GGUF's Q5_K as stored (``quant_q5k.pack_q5k``, int64-marked; 5.75 bits per weight as held): q4k with a fifth
  bit per weight, ``w = d * sc * q - dmin * m``, q in 0..31. Likewise only loaded, computed exactly as stored.
- q5_0, q4_1, q5_1: GGUF's Q5_0, Q4_1 and Q5_1 blocks of 32 as stored (``quant_b32.pack_b32``; 5.5, 5 and 6 bits per
  weight): int4's nibbles, a plane of 5th bits, fp16 d (and min m), ``w = d * (q - 16)`` or ``d * q + m``. Likewise
  only loaded, computed exactly as stored.

Activations are quantized to int8 per row and block of 32 inside the call; products are integer
dot products (AVX-512 VNNI ``vpdpbusd``, AVX-VNNI's 256-bit ``vpdpbusd`` on AVX2 CPUs that have it,
or AVX2 ``maddubs``/``madd``, chosen at runtime; the scalar path elsewhere). Rows are batch-invariant,
so speculative verification is exact relative to the quantized model. ``SPECDECODE_KERNEL_ISA=avx2``
or ``=avxvnni`` (read when the extension loads) or ``set_quant_isa`` forces a path; ``quant_isa`` says
which runs. A call (a decode step, a verification pass, a prefill) reads one weight stream on AMD and 4 side
by side elsewhere, what each vendor's prefetchers read fastest (``docs/cpu.md``);
``SPECDECODE_KERNEL_STREAMS=1|4`` or ``set_quant_streams`` overrides it, with the same bits either way.

A model with quantized matrices keeps its embedding table dense (a lookup, not a product) and
multiplies by a quantized copy of the output matrix; ``quantized_kernels`` wraps the model's
dense kernels so one function pointer (for the fused whole-stack loop) serves both kinds.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Mapping, Optional

import torch

from . import Kernels, fast_linear_available, load_extension
from .build import ExtensionBuildError, build_extension, source_files, source_key
from .quant_b32 import B32_DTYPES, dequantize_b32, pack_b32
from .quant_q4k import pack_q4k, unpack_q4k
from .quant_q5k import dequantize_q5k, pack_q5k

__all__ = [
    "QUANT_FORMATS",
    "QuantUnavailableError",
    "dequantize",
    "dequantize_rows",
    "dequantize_rows_torch",
    "is_packed",
    "load_quant_extension",
    "pack_b32",
    "pack_blocks",
    "pack_gguf",
    "pack_q4k",
    "pack_q5k",
    "pack_q6k",
    "pack_draft",
    "packed_dtype",
    "packed_format",
    "quant_isa",
    "quant_streams",
    "quantize",
    "quantized_kernels",
    "set_quant_isa",
    "set_quant_streams",
]

logger = logging.getLogger(__name__)

QUANT_FORMATS = ("int8", "int4")
_SOURCE = Path(__file__).with_name("quant_linear.cpp")
_lock = threading.Lock()
_ext: Optional[ModuleType] = None
_error: Optional[str] = None


class QuantUnavailableError(RuntimeError):
    """The quantized kernel cannot run here (no compiler, or a failed build)."""


def load_quant_extension() -> ModuleType:
    """The compiled extension (built on first call, cached), or ``QuantUnavailableError`` saying why not."""
    global _ext, _error
    if _ext is None and _error is None:
        with _lock:
            if _ext is None and _error is None:
                try:
                    _ext = build_extension("specdecode_quant_linear", _SOURCE)
                except ExtensionBuildError as exc:
                    _error = str(exc)
    if _ext is None:
        raise QuantUnavailableError(f"the quantized CPU kernel is unavailable: {_error}")
    return _ext


_DTYPES = {"int8": torch.int8, "int4": torch.uint8, "q4k": torch.int16, "q6k": torch.int32, "q5k": torch.int64,
           **B32_DTYPES}


def packed_dtype(fmt: str) -> torch.dtype:
    """The tensor dtype that marks a packed weight of ``fmt`` (int8 -> int8, int4 -> uint8, q4k -> int16,
    q6k -> int32, q5k -> int64, q5_0 -> uint16, q4_1 -> uint32, q5_1 -> uint64)."""
    return _DTYPES.get(fmt, torch.uint8)


def packed_format(w: torch.Tensor) -> Optional[str]:
    """"int8", "int4", "q4k", "q5k", "q6k", "q5_0", "q4_1" or "q5_1" for a packed weight (by its dtype), None for a
    dense one."""
    return next((f for f, dt in _DTYPES.items() if w.dtype == dt), None)


def is_packed(w: torch.Tensor) -> bool:
    return w.dtype in _DTYPES.values()


GROUP = 16  # weight rows interleaved per group (quant_linear.cpp has the layout)


def _blocks(w: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """``w`` [N, K] as fp32 blocks [N, Kp / 32, 32], zero padded to Kp = K rounded up to 32."""
    n, k = w.shape
    kp = (k + 31) // 32 * 32
    wf = w.detach().to(torch.float32)
    if kp != k:
        wf = torch.nn.functional.pad(wf, (0, kp - k))
    return wf.view(n, kp // 32, 32), n, kp


def _row_bytes(fmt: str, kp: int) -> int:
    qb = kp if fmt == "int8" else kp // 2
    return (qb + 2 * (kp // 32) + 3) // 4 * 4


def quantize(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """Pack a dense [N, K] matrix as ``fmt`` ("int8" or "int4"): a [N, row bytes] int8/uint8 tensor.

    Rows go in groups of 16, interleaved 4 inputs at a time, so the kernel's vector lanes are 16
    output columns (one float multiply-add per block for all of them, no horizontal sums); the
    last N % 16 rows stay plain. ``dequantize`` reads both back."""
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantized format {fmt!r}; use one of {', '.join(QUANT_FORMATS)}")
    if w.dim() != 2:
        raise ValueError(f"only matrices are quantized, got shape {tuple(w.shape)}")
    blocks, n, kp = _blocks(w.cpu())
    if fmt == "int8":
        d = (blocks.abs().amax(-1) / 127.0).to(torch.float16)
        df = d.float().unsqueeze(-1)
        # in place: each new 4-byte-a-weight temporary costs its page faults as well as a pass (2-3x here)
        q = blocks / df.clamp_min(1e-30)
        q.round_().clamp_(-127, 127).masked_fill_(~(df > 0), 0)  # a block whose scale rounds to 0 stays 0
        q = q.to(torch.int8).view(torch.uint8)  # [n, nb, 32]
    else:
        idx = blocks.abs().argmax(-1, keepdim=True)
        peak = blocks.gather(-1, idx).squeeze(-1)
        d = (peak / -8.0).to(torch.float16)
        df = d.float().unsqueeze(-1)
        v = blocks / torch.where(df != 0, df, torch.ones(()))
        v.masked_fill_(df == 0, 0).round_().add_(8).clamp_(0, 15)
        q = v.to(torch.uint8)  # [n, nb, 32], v in 0..15
    return pack_blocks(q.view(torch.int8) if fmt == "int8" else q, d, fmt)


def pack_blocks(q: torch.Tensor, d: torch.Tensor, fmt: str) -> torch.Tensor:
    """Pack integer blocks as stored (no rounding): the layout ``quantize`` produces.

    ``q`` [N, nb, 32]: int8 values (int8) or 0..15 (int4, uint8; the weight is ``(q - 8) * d``);
    ``d`` [N, nb] fp16 scales. This is how GGUF's Q8_0 and Q4_0 blocks enter the kernel
    unchanged: their arithmetic is ours."""
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quantized format {fmt!r}; use one of {', '.join(QUANT_FORMATS)}")
    n, nb = d.shape
    kp = nb * 32
    q = q.reshape(n, nb, 32).contiguous()
    q = q.view(torch.uint8) if fmt == "int8" else q.to(torch.uint8)
    d = d.to(torch.float16)
    scales = d.contiguous().view(torch.uint8).view(n, nb, 2)
    rb = _row_bytes(fmt, kp)
    full = n // GROUP * GROUP
    out = torch.zeros(n, rb, dtype=torch.uint8)
    if full:
        ng = full // GROUP
        g = q[:full].view(ng, GROUP, nb, 32)
        if fmt == "int8":  # [group, block, step of 4 inputs, row, 4]
            quants = g.view(ng, GROUP, nb, 8, 4).permute(0, 2, 3, 1, 4).reshape(ng, -1)
        else:  # low nibble: inputs 4s + i, high nibble: 16 + 4s + i
            g = g.view(ng, GROUP, nb, 2, 4, 4)
            quants = (g[:, :, :, 0] | (g[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4).reshape(ng, -1)
        sc = scales[:full].view(ng, GROUP, nb, 2).permute(0, 2, 1, 3).reshape(ng, -1)
        body = torch.cat([quants, sc], dim=1)
        grouped = torch.zeros(ng, GROUP * rb, dtype=torch.uint8)
        grouped[:, : body.shape[1]] = body
        out[:full] = grouped.view(full, rb)
    if full < n:
        t = q[full:]
        if fmt == "int8":
            tq = t.reshape(n - full, kp)
        else:
            t = t.view(n - full, nb, 2, 16)
            tq = (t[:, :, 0] | (t[:, :, 1] << 4)).reshape(n - full, kp // 2)
        out[full:, : tq.shape[1]] = tq
        out[full:, tq.shape[1]: tq.shape[1] + 2 * nb] = scales[full:].reshape(n - full, 2 * nb)
    return out.view(packed_dtype(fmt))


GGUF_BLOCK_BYTES = {"int8": 34, "int4": 18}  # Q8_0: fp16 d + 32 int8; Q4_0: fp16 d + 16 bytes of nibble pairs


def pack_gguf(raw: torch.Tensor, fmt: str) -> torch.Tensor:
    """``pack_blocks`` of GGUF Q8_0 (int8) or Q4_0 (int4) rows as stored ([N, nb * 34 or 18] uint8), moving
    bytes only: a Q4_0 byte j holds elements j and j + 16 of its block, the same pair our int4 byte holds,
    so neither format is unpacked (a load of a 1 GB file spends memory bandwidth, not arithmetic, here)."""
    n = raw.shape[0]
    size = GGUF_BLOCK_BYTES[fmt]
    blocks = raw.view(torch.uint8).reshape(n, -1, size)
    nb = blocks.shape[1]
    qb = nb * (size - 2)
    rb = _row_bytes(fmt, nb * 32)
    out = torch.zeros(n, rb, dtype=torch.uint8)
    full = n // GROUP * GROUP
    if full:
        ng = full // GROUP
        step = 8 if fmt == "int8" else 4  # steps of 4 inputs a block: int8 8 of 4 bytes, int4 4 of 4 byte pairs
        quants = blocks[:full, :, 2:].reshape(ng, GROUP, nb, step, 4).permute(0, 2, 3, 1, 4)
        grouped = out[:full].view(ng, GROUP * rb)
        grouped[:, :GROUP * qb].view(ng, nb, step, GROUP, 4).copy_(quants)
        scales = blocks[:full, :, :2].reshape(ng, GROUP, nb, 2).permute(0, 2, 1, 3)
        grouped[:, GROUP * qb: GROUP * qb + GROUP * nb * 2].view(ng, nb, GROUP, 2).copy_(scales)
    if full < n:
        out[full:, :qb] = blocks[full:, :, 2:].reshape(n - full, qb)
        out[full:, qb: qb + 2 * nb] = blocks[full:, :, :2].reshape(n - full, 2 * nb)
    return out.view(packed_dtype(fmt))


Q6K_BLOCK_BYTES = 210  # GGUF Q6_K super-block: 128 bytes of low nibbles, 64 of 2-bit high parts, 16 int8 scales, fp16 d
Q6K_ROW_SB = 212  # our q6k bytes per row and super-block: 128 of nibbles, 64 of high bits, 16 scales, fp16 d, 2 zero


def _q6k_q(blocks: torch.Tensor) -> torch.Tensor:
    """Q6_K super-blocks [n, nsb, 210] -> q [n, nsb, 256] uint8 in 0..63 (gguf-py's Q6_K order)."""
    n, nsb = blocks.shape[:2]
    ql = blocks[:, :, :128].reshape(n, nsb, 2, 1, 64)  # per half of 128 weights: ql[l] for l < 64
    qh = blocks[:, :, 128:192].reshape(n, nsb, 2, 1, 32)
    lo = torch.cat([ql & 15, ql >> 4], dim=3).reshape(n, nsb, 2, 4, 32)  # quarter 0..3 of the half
    hi = torch.cat([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=3)  # [n, nsb, 2, 4, 32]
    return (lo | (hi << 4)).reshape(n, nsb, 256)


def pack_q6k(raw: torch.Tensor) -> torch.Tensor:
    """GGUF Q6_K rows as stored ([N, K / 256 * 210] uint8) as the kernel's q6k format ([N, K / 256 * 53] int32
    over K / 256 * 212 bytes a row), moving and splitting bytes only: a nibble plane in int4's order and a 2-bit
    plane, so the kernel computes Q6_K's weights (d * sc) * (q - 32) exactly as stored (``quant_linear.cpp`` has
    the layout and arithmetic). K must be a multiple of 256."""
    if raw.dim() != 2 or raw.shape[1] % Q6K_BLOCK_BYTES:
        raise ValueError(f"Q6_K rows are [N, K / 256 * {Q6K_BLOCK_BYTES}] bytes, got shape {tuple(raw.shape)}")
    n = raw.shape[0]
    blocks = raw.contiguous().view(torch.uint8).view(n, -1, Q6K_BLOCK_BYTES)
    nsb = blocks.shape[1]
    q = _q6k_q(blocks).view(n, nsb, 8, 2, 4, 4)  # [row, sb, block j, half, step s, i]
    lo, hi = q & 15, q >> 4
    nib = lo[:, :, :, 0] | (lo[:, :, :, 1] << 4)  # [n, nsb, j, s, i]
    # high bits: per block j and step pair p, byte (row, i) holds q >> 4 of input 16h + 4(2p + e) + i at bits 4e + 2h
    h = hi.view(n, nsb, 8, 2, 2, 2, 4)  # [n, nsb, j, half, p, e, i]
    qh = (h[:, :, :, 0, :, 0] | (h[:, :, :, 1, :, 0] << 2) | (h[:, :, :, 0, :, 1] << 4)
          | (h[:, :, :, 1, :, 1] << 6))  # [n, nsb, j, p, i]
    sc = blocks[:, :, 192:208]
    rb = nsb * Q6K_ROW_SB
    out = torch.zeros(n, rb, dtype=torch.uint8)
    full = n // GROUP * GROUP
    if full:
        ng = full // GROUP
        grp = out[:full].view(ng, nsb, GROUP * Q6K_ROW_SB)
        grp[:, :, :2048].view(ng, nsb, 8, 4, GROUP, 4).copy_(
            nib[:full].reshape(ng, GROUP, nsb, 8, 4, 4).permute(0, 2, 3, 4, 1, 5))
        grp[:, :, 2048:3072].view(ng, nsb, 8, 2, GROUP, 4).copy_(
            qh[:full].reshape(ng, GROUP, nsb, 8, 2, 4).permute(0, 2, 3, 4, 1, 5))
        grp[:, :, 3072:3328].view(ng, nsb, 16, GROUP).copy_(sc[:full].reshape(ng, GROUP, nsb, 16).permute(0, 2, 3, 1))
        grp[:, :, 3328:3360].view(ng, nsb, GROUP, 2).copy_(
            blocks[:full, :, 208:210].reshape(ng, GROUP, nsb, 2).permute(0, 2, 1, 3))
    if full < n:
        t = out[full:].view(n - full, nsb, Q6K_ROW_SB)
        t[:, :, :128].view(n - full, nsb, 8, 16).copy_(nib[full:].reshape(n - full, nsb, 8, 16))
        hp = hi[full:].reshape(n - full, nsb, 64, 4)  # plain: q >> 4 of input k at byte k / 4, bits 2 (k % 4)
        t[:, :, 128:192].copy_(hp[..., 0] | (hp[..., 1] << 2) | (hp[..., 2] << 4) | (hp[..., 3] << 6))
        t[:, :, 192:210].copy_(blocks[full:, :, 192:210])
    return out.view(torch.int32)


def _unpack_q6k(packed: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q - 32 [N, k] (fp32) and the exact fp32 d * sc [N, k / 16] of a q6k matrix."""
    if k % 256:
        raise ValueError(f"a q6k (GGUF Q6_K) matrix has K a multiple of 256, got {k}")
    n, nsb = packed.shape[0], k // 256
    raw = packed.contiguous().view(torch.uint8).view(n, nsb * Q6K_ROW_SB)
    nib = torch.empty(n, nsb, 8, 16, dtype=torch.uint8)  # per block, int4's plain order
    hi = torch.empty(n, nsb, 8, 2, 16, dtype=torch.uint8)  # per block and half, q >> 4 in input order
    sc = torch.empty(n, nsb, 16, dtype=torch.uint8)
    d = torch.empty(n, nsb, 2, dtype=torch.uint8)
    full = n // GROUP * GROUP
    if full:
        ng = full // GROUP
        grp = raw[:full].view(ng, nsb, GROUP * Q6K_ROW_SB)
        nibs = grp[:, :, :2048].reshape(ng, nsb, 8, 4, GROUP, 4).permute(0, 4, 1, 2, 3, 5)
        nib[:full] = nibs.reshape(full, nsb, 8, 16)
        qh = grp[:, :, 2048:3072].reshape(ng, nsb, 8, 2, GROUP, 4).permute(0, 4, 1, 2, 3, 5)  # [g, c, sb, j, p, i]
        parts = torch.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=-2)  # [.., p, field 2e + h, i]
        parts = parts.reshape(ng, GROUP, nsb, 8, 2, 2, 2, 4)  # [.., p, e, h, i]
        hi[:full] = parts.permute(0, 1, 2, 3, 6, 4, 5, 7).reshape(full, nsb, 8, 2, 16)  # [.., h, (p, e, i)]
        sc[:full] = grp[:, :, 3072:3328].reshape(ng, nsb, 16, GROUP).permute(0, 3, 1, 2).reshape(full, nsb, 16)
        d[:full] = grp[:, :, 3328:3360].reshape(ng, nsb, GROUP, 2).permute(0, 2, 1, 3).reshape(full, nsb, 2)
    if full < n:
        t = raw[full:].view(n - full, nsb, Q6K_ROW_SB)
        nib[full:] = t[:, :, :128].reshape(n - full, nsb, 8, 16)
        hp = torch.stack([(t[:, :, 128:192] >> s) & 3 for s in (0, 2, 4, 6)], dim=-1)
        hi[full:] = hp.reshape(n - full, nsb, 8, 2, 16)
        sc[full:] = t[:, :, 192:208]
        d[full:] = t[:, :, 208:210]
    lo = torch.stack([nib & 15, nib >> 4], dim=3)  # [n, nsb, j, half, 16]
    q = (lo | (hi << 4)).view(n, k).float() - 32
    ds = d.view(torch.float16).float() * sc.view(torch.int8).float()  # [n, nsb, 16]
    return q, ds.view(n, nsb * 16)


def _unpack(packed: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer weights [N, Kp] (int8: q; int4: v - 8) and fp32 scales [N, nb] of a packed matrix."""
    fmt = "int8" if packed.dtype == torch.int8 else "int4"
    n, kp = packed.shape[0], (k + 31) // 32 * 32
    nb = kp // 32
    qb = kp if fmt == "int8" else kp // 2
    raw = packed.contiguous().view(torch.uint8)
    full = n // GROUP * GROUP
    q = torch.empty(n, nb, 32, dtype=torch.float32)
    scales = torch.empty(n, nb, dtype=torch.float32)
    if full:
        ng = full // GROUP
        grp = raw[:full].reshape(ng, GROUP * raw.shape[1])
        qz = grp[:, : GROUP * qb]
        if fmt == "int8":
            g = qz.view(ng, nb, 8, GROUP, 4).permute(0, 3, 1, 2, 4).reshape(ng * GROUP, nb, 32)
            q[:full] = g.view(torch.int8).float()
        else:
            g = qz.view(ng, nb, 4, GROUP, 4).permute(0, 3, 1, 2, 4)  # [group, row, block, s, i]
            lo, hi = (g & 15).reshape(full, nb, 16), (g >> 4).reshape(full, nb, 16)
            q[:full] = torch.cat([lo, hi], dim=2).float() - 8
        sc = grp[:, GROUP * qb: GROUP * qb + GROUP * nb * 2].contiguous().view(ng, nb, GROUP, 2)
        scales[:full] = sc.permute(0, 2, 1, 3).contiguous().view(torch.float16).view(full, nb).float()
    if full < n:
        t = raw[full:]
        if fmt == "int8":
            q[full:] = t[:, :kp].contiguous().view(torch.int8).float().view(n - full, nb, 32)
        else:
            b = t[:, : kp // 2].reshape(n - full, nb, 16)
            q[full:] = torch.cat([b & 15, b >> 4], dim=2).float() - 8
        scales[full:] = t[:, qb: qb + 2 * nb].contiguous().view(torch.float16).float()
    return q.view(n, kp), scales


def dequantize(packed: torch.Tensor, k: int) -> torch.Tensor:
    """The fp32 [N, k] matrix a packed weight stands for (tests and quality reports). For q4k, Q4_K's own
    dequantization bit for bit: (d * sc) * q - dmin * m in fp32, where only the subtraction rounds; for q6k, Q6_K's:
    (d * sc) * (q - 32) in fp32; for q5_0 / q4_1 / q5_1, GGUF's d * (q - 16) / d * q + m in fp32."""
    if packed.dtype == torch.int64:
        return dequantize_q5k(packed, k)
    if packed.dtype == torch.int16:
        v, ds, dm = unpack_q4k(packed, k)
        n = v.shape[0]
        return (v.view(n, -1, 32) * ds.unsqueeze(-1) - dm.unsqueeze(-1)).view(n, k)
    b32 = next((f for f, dt in B32_DTYPES.items() if packed.dtype == dt), None)
    if b32 is not None:
        return dequantize_b32(packed, k, b32)
    if packed.dtype == torch.int32:
        q6, ds6 = _unpack_q6k(packed, k)
        n = q6.shape[0]
        return (ds6.unsqueeze(-1) * q6.view(n, -1, 16)).view(n, k)
    q, scales = _unpack(packed, k)
    n, kp = q.shape
    return (q.view(n, kp // 32, 32) * scales.view(n, -1, 1)).view(n, kp)[:, :k]


def dequantize_rows(packed: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """fp32 rows ``ids`` (1-D int64) of the [N, k] matrix a packed weight stands for: a table kept packed, looked up
    (by the kernel extension, row by row; where it cannot build, ``dequantize_rows_torch``)."""
    try:
        ext = load_quant_extension()
    except QuantUnavailableError:
        return dequantize_rows_torch(packed, ids, k)
    return ext.dequantize_rows(packed.contiguous(), ids, k)


def dequantize_rows_torch(packed: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """``dequantize_rows`` in torch: rows are interleaved in groups of 16, so each wanted row's whole group is
    decoded (0.36 ms a step at Gemma 3 270M's 640-wide table, 3% of its decode step)."""
    n, rb = packed.shape
    full = n // GROUP * GROUP
    out = torch.empty(ids.numel(), k, dtype=torch.float32)
    grouped = ids < full
    if bool(grouped.any()):
        sel = ids[grouped]
        groups, inv = torch.unique(sel // GROUP, return_inverse=True)
        part = packed[:full].view(full // GROUP, GROUP, rb).index_select(0, groups).reshape(-1, rb)
        out[grouped] = dequantize(part, k)[inv * GROUP + sel % GROUP]
    if not bool(grouped.all()):
        out[~grouped] = dequantize(packed[full:], k)[ids[~grouped] - full]
    return out


def quant_isa() -> str:
    """The path the kernel takes now: "vnni512", "avxvnni", "avx2" or "scalar"."""
    return load_quant_extension().isa()


def set_quant_isa(isa: str = "auto") -> str:
    """Force a path ("auto", "scalar", "avx2", "avxvnni", "vnni512"); returns the previous one. RuntimeError if
    this CPU lacks it."""
    return load_quant_extension().set_isa(isa)


def quant_streams() -> int:
    """Weight streams a call reads side by side: 1 (AMD's default) or 4 (elsewhere)."""
    return int(load_quant_extension().streams())


def set_quant_streams(n: int = 0) -> int:
    """1 or 4 weight streams a call reads, 0 this CPU's default; returns the previous. Speed only: the
    results are the same bits."""
    return int(load_quant_extension().set_streams(n))


def quantized_kernels(dense: Kernels, fmt: str) -> Kernels:
    """``dense`` (the model's small-M kernels) with packed weights going to the quantized kernel.

    The quantized kernel needs fp32 activations; a model with packed weights therefore needs the
    fast CPU path. Raises ``QuantUnavailableError`` when the extension cannot build."""
    ext = load_quant_extension()
    if not dense.fast or not fast_linear_available():
        raise QuantUnavailableError("quantized weights need the fast CPU kernel (it is off: fast=False, "
                                    "--no-fast-linear or SPECDECODE_FAST_LINEAR=0, or it could not build)")
    small = load_extension()
    assert small is not None and dense.native is not None
    ext.set_dense_linear(int(small.linear_address()))
    bf16_dot = dense.native[1]
    qlinear = ext.linear

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return qlinear(x, weight, bias, bf16_dot)

    # the source's hash in the label: the label keys the cost cache, and c measured with an older
    # build of this kernel would steer gamma="auto" by another kernel's speed
    return replace(dense, linear=linear, native=(int(ext.linear_address()), bf16_dot),
                   mode=f"{fmt}-{ext.isa()}.{source_key(source_files(_SOURCE))[:8]}+{dense.mode}")


def pack_draft(dense: Kernels, fmt: Optional[str], mats: Mapping[str, torch.Tensor], who: str
               ) -> tuple[Kernels, dict[str, torch.Tensor], Optional[str]]:
    """A drafter's matrices packed as ``fmt`` with the kernels that read them: (kernels, packed, fmt).

    Right after a target pass a draft's weights come from memory, not cache, so half the bytes is
    about half the draft's time. A draft's rounding changes what is proposed, never what is accepted. Where the
    quantized kernel cannot run (no fast kernel, not the CPU), the dense matrices and kernels come back
    with fmt None, after one warning."""
    if fmt is None:
        return dense, dict(mats), None
    try:
        kernels = quantized_kernels(dense, fmt)
    except QuantUnavailableError as e:
        logger.warning("%s: the draft keeps its dense weights (%s)", who, e)
        return dense, dict(mats), None
    return kernels, {name: quantize(w, fmt) for name, w in mats.items()}, fmt
