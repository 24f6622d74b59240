"""GGUF's other blocks of 32 as stored for the kernel: Q5_0, Q4_1 and Q5_1 (``quant_linear.cpp``'s b32 formats).

Each keeps the file's bits and bytes (5.5, 5 and 6 bits a weight), so the kernel computes the file's own weights,
``d * (q - 16)`` (Q5_0) or ``d * q + m`` (Q4_1, Q5_1), with no second rounding; held in int8 they would cost 8.5
bits a weight and be rounded again. The low 4 bits of q are int4's nibbles in int4's interleave (GGUF's Q4 byte j
holds elements j and j + 16 of its block, the pair our int4 byte holds), the 5th bit goes to a plane of one 64-byte
vector per group and block, then the fp16 d and m. A packed matrix is marked by its dtype, as the other formats
are (``quant.packed_dtype``): q5_0 uint16, q4_1 uint32, q5_1 uint64.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

GROUP = 16  # weight rows interleaved per group: quant_linear.cpp's G (quant.GROUP)


class B32(NamedTuple):
    """Where a GGUF block keeps its parts (byte offsets; None: absent) and the dtype that marks our packing."""

    gguf: str
    block_bytes: int
    d: int
    m: Optional[int]
    qh: Optional[int]
    qs: int
    dtype: torch.dtype


B32_FORMATS = {
    "q5_0": B32("Q5_0", 22, 0, None, 2, 6, torch.uint16),
    "q4_1": B32("Q4_1", 20, 0, 2, None, 4, torch.uint32),
    "q5_1": B32("Q5_1", 24, 0, 2, 4, 8, torch.uint64),
}
B32_DTYPES = {name: f.dtype for name, f in B32_FORMATS.items()}


def _plane(qh: torch.Tensor) -> torch.Tensor:
    """GGUF's 5th bits ([n, nb, 4] bytes: a little-endian uint32, bit e for element e) as our plane bytes
    [n, nb, 4]: byte i holds at bit s + 4h the 5th bit of element 16h + 4s + i (step s, low or high nibble h), so
    the kernel moves each step's bits to bit 4 with one shift."""
    bits = (qh.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1  # [n, nb, byte, bit]: element 8 * byte + bit
    bits = bits.reshape(*qh.shape[:2], 2, 4, 4)  # [n, nb, h, s, i]
    out = torch.zeros(*qh.shape[:2], 4, dtype=torch.uint8)
    for h in range(2):
        for s in range(4):
            out |= bits[:, :, h, s] << (s + 4 * h)
    return out


def pack_b32(raw: torch.Tensor, fmt: str) -> torch.Tensor:
    """GGUF ``fmt`` rows as stored ([N, K / 32 * block bytes] uint8) in the kernel's layout (the same bytes a row,
    marked by ``B32_FORMATS[fmt].dtype``), moving bytes and the 5th bits only (``quant_linear.cpp`` has the layout).
    A group of 16 rows: the nibbles per block and step of 4 inputs [row][4 bytes] (256 bytes a block), the plane
    (64 bytes a block), the rows' fp16 d (32 a block), m (32 a block); a tail row: GGUF's qs per block, then its qh,
    d and m per block."""
    f = B32_FORMATS[fmt]
    if raw.dim() != 2 or raw.shape[1] % f.block_bytes:
        raise ValueError(f"{f.gguf} rows are [N, K / 32 * {f.block_bytes}] bytes, got shape {tuple(raw.shape)}")
    n = raw.shape[0]
    blocks = raw.contiguous().view(torch.uint8).view(n, -1, f.block_bytes)
    nb = blocks.shape[1]
    out = torch.empty(n, nb * f.block_bytes, dtype=torch.uint8)
    full = n // GROUP * GROUP
    if full:
        ng = full // GROUP
        grp = out[:full].view(ng, GROUP * nb * f.block_bytes)
        grp[:, :256 * nb].view(ng, nb, 4, GROUP, 4).copy_(  # [group, block, step s, row, i]
            blocks[:full, :, f.qs:f.qs + 16].reshape(ng, GROUP, nb, 4, 4).permute(0, 2, 3, 1, 4))
        off = 256 * nb
        parts = [] if f.qh is None else [(_plane(blocks[:full, :, f.qh:f.qh + 4]), 4)]
        parts.append((blocks[:full, :, f.d:f.d + 2], 2))
        if f.m is not None:
            parts.append((blocks[:full, :, f.m:f.m + 2], 2))
        for part, size in parts:  # per block, the 16 rows' bytes one after another
            grp[:, off:off + GROUP * size * nb].view(ng, nb, GROUP, size).copy_(
                part.reshape(ng, GROUP, nb, size).permute(0, 2, 1, 3))
            off += GROUP * size * nb
    if full < n:
        t, r = out[full:], n - full
        fields = [(f.qs, 16)] + ([] if f.qh is None else [(f.qh, 4)]) + [(f.d, 2)] + ([] if f.m is None else [(f.m, 2)])
        off = 0
        for at, size in fields:
            t[:, off:off + size * nb].view(r, nb, size).copy_(blocks[full:, :, at:at + size])
            off += size * nb
    return out.view(f.dtype)


def unpack_b32(packed: torch.Tensor, k: int, fmt: str) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """q [N, k] (fp32, unsigned: 0..15 or 0..31), fp32 d [N, k / 32] and m [N, k / 32] (None for q5_0) of a packed
    matrix."""
    f = B32_FORMATS[fmt]
    if k % 32:
        raise ValueError(f"a {fmt} (GGUF {f.gguf}) matrix has K a multiple of 32, got {k}")
    n, nb = packed.shape[0], k // 32
    raw = packed.contiguous().view(torch.uint8).view(n, nb * f.block_bytes)
    nib = torch.empty(n, nb, 16, dtype=torch.uint8)  # per block, GGUF's qs order
    hi = torch.zeros(n, nb, 32, dtype=torch.uint8)  # per block, the 5th bit of each element
    d = torch.empty(n, nb, 2, dtype=torch.uint8)
    m = torch.empty(n, nb, 2, dtype=torch.uint8)
    full = n // GROUP * GROUP
    if full:
        ng = full // GROUP
        grp = raw[:full].view(ng, GROUP * nb * f.block_bytes)
        nib[:full] = grp[:, :256 * nb].reshape(ng, nb, 4, GROUP, 4).permute(0, 3, 1, 2, 4).reshape(full, nb, 16)
        off = 256 * nb
        if f.qh is not None:
            plane = grp[:, off:off + 64 * nb].reshape(ng, nb, GROUP, 4).permute(0, 2, 1, 3).reshape(full, nb, 1, 1, 4)
            shifts = (torch.arange(4, dtype=torch.uint8).view(1, 4) + 4 * torch.arange(2, dtype=torch.uint8).view(2, 1))
            hi[:full] = ((plane >> shifts.view(1, 1, 2, 4, 1)) & 1).reshape(full, nb, 32)  # [h, s, i] = element order
            off += 64 * nb
        d[:full] = grp[:, off:off + 32 * nb].reshape(ng, nb, GROUP, 2).permute(0, 2, 1, 3).reshape(full, nb, 2)
        off += 32 * nb
        if f.m is not None:
            m[:full] = grp[:, off:off + 32 * nb].reshape(ng, nb, GROUP, 2).permute(0, 2, 1, 3).reshape(full, nb, 2)
    if full < n:
        t, r = raw[full:], n - full
        nib[full:] = t[:, :16 * nb].reshape(r, nb, 16)
        off = 16 * nb
        if f.qh is not None:
            qh = t[:, off:off + 4 * nb].reshape(r, nb, 4, 1)
            hi[full:] = ((qh >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(r, nb, 32)
            off += 4 * nb
        d[full:] = t[:, off:off + 2 * nb].reshape(r, nb, 2)
        if f.m is not None:
            m[full:] = t[:, off + 2 * nb:off + 4 * nb].reshape(r, nb, 2)
    q = (torch.cat([nib & 15, nib >> 4], dim=-1) | (hi << 4)).float().view(n, k)
    df = d.view(torch.float16).view(n, nb).float()
    return q, df, (m.view(torch.float16).view(n, nb).float() if f.m is not None else None)


def dequantize_b32(packed: torch.Tensor, k: int, fmt: str) -> torch.Tensor:
    """The fp32 [N, k] matrix: GGUF's own dequantization bit for bit, ``d * (q - 16)`` (exact) or ``d * q + m``
    (the addition rounds once)."""
    q, d, m = unpack_b32(packed, k, fmt)
    n = q.shape[0]
    blocks = q.view(n, -1, 32)
    if m is None:
        return (d.unsqueeze(-1) * (blocks - 16)).view(n, k)
    return (d.unsqueeze(-1) * blocks + m.unsqueeze(-1)).view(n, k)


__all__ = ["B32", "B32_DTYPES", "B32_FORMATS", "dequantize_b32", "pack_b32", "unpack_b32"]
