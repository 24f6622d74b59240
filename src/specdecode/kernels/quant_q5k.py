"""GGUF Q5_K as stored for the kernel: the q5k format (``quant_linear.cpp`` has the layout).

Q5_K is Q4_K with a fifth bit per weight (5.5 bits a weight): a super-block of 256 keeps fp16 d and dmin, 6-bit
scales and mins per 32, 32 bytes of fifth bits and 128 of nibbles, and ``w = d * sc * q - dmin * m`` with q in
0..31. Held in int8 it would cost 8.5 bits a weight and a second rounding; here the kernel computes the file's
own weights. The layout is q4k's with the fifth bits after each group's super-block, as the b32 formats' plane
(a byte per row and step of 4 inputs), so the kernel's q4k walks merge them with the b32 shifts. Marked by dtype
int64 (``quant.packed_dtype``). The C++ repack (``repack.cpp``) writes the same bytes in one pass; this is the
reference the tests compare it with.
"""

from __future__ import annotations

import torch

from .quant_q4k import Q4K_ROW_SB, pack_q4k, unpack_q4k

GROUP = 16  # weight rows interleaved per group: quant_linear.cpp's G
# GGUF Q5_K super-block: fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 32 of fifth bits, 128 of nibbles
Q5K_BLOCK_BYTES = 176
Q5K_ROW_SB = 184  # ours a row and super-block: q4k's 148, the 32 bytes of 5th bits, 4 zero bytes
_Q4K_GROUP_SB = GROUP * Q4K_ROW_SB  # 2368: where a group's super-block's planes start


def _as_q4k(blocks: torch.Tensor) -> torch.Tensor:
    """Q5_K super-blocks [n, nsb, 176] without their fifth bits: Q4_K super-blocks [n, nsb, 144]."""
    return torch.cat([blocks[..., :16], blocks[..., 48:]], dim=-1)


def _planes(qh: torch.Tensor) -> torch.Tensor:
    """GGUF's fifth bits [n, nsb, 32] (sub-block j's input e: bit j of byte e) as our planes [n, nsb, 8, 4]:
    per sub-block j, byte i holds at bit s + 4h the fifth bit of its input 16h + 4s + i."""
    bits = (qh.unsqueeze(-2) >> torch.arange(8, dtype=torch.uint8).view(8, 1)) & 1  # [n, nsb, j, e]
    bits = bits.view(*qh.shape[:2], 8, 2, 4, 4)  # [.., j, h, s, i]
    out = torch.zeros(*qh.shape[:2], 8, 4, dtype=torch.uint8)
    for h in range(2):
        for s in range(4):
            out |= bits[..., h, s, :] << (s + 4 * h)
    return out


def pack_q5k(raw: torch.Tensor) -> torch.Tensor:
    """GGUF Q5_K rows as stored ([N, K / 256 * 176] uint8) as the kernel's q5k format ([N, K / 256 * 23] int64 over
    K / 256 * 184 bytes a row), moving bytes and fifth bits only. K must be a multiple of 256."""
    if raw.dim() != 2 or raw.shape[1] % Q5K_BLOCK_BYTES:
        raise ValueError(f"Q5_K rows are [N, K / 256 * {Q5K_BLOCK_BYTES}] bytes, got shape {tuple(raw.shape)}")
    n = raw.shape[0]
    blocks = raw.contiguous().view(torch.uint8).view(n, -1, Q5K_BLOCK_BYTES)
    nsb = blocks.shape[1]
    q4 = pack_q4k(_as_q4k(blocks).reshape(n, -1)).view(torch.uint8)
    qh = blocks[..., 16:48]
    out = torch.zeros(n, nsb * Q5K_ROW_SB, dtype=torch.uint8)
    full = n // GROUP * GROUP
    if full:
        ng = full // GROUP
        grp = out[:full].view(ng, nsb, GROUP * Q5K_ROW_SB)
        grp[:, :, :_Q4K_GROUP_SB] = q4[:full].reshape(ng, nsb, _Q4K_GROUP_SB)
        grp[:, :, _Q4K_GROUP_SB:_Q4K_GROUP_SB + 512].view(ng, nsb, 8, GROUP, 4).copy_(
            _planes(qh[:full]).view(ng, GROUP, nsb, 8, 4).permute(0, 2, 3, 1, 4))
    if full < n:
        t = out[full:].view(n - full, nsb, Q5K_ROW_SB)
        t[:, :, :Q4K_ROW_SB] = q4[full:].reshape(n - full, nsb, Q4K_ROW_SB)
        t[:, :, Q4K_ROW_SB:Q4K_ROW_SB + 32] = qh[full:]
    return out.view(torch.int64)


def dequantize_q5k(packed: torch.Tensor, k: int) -> torch.Tensor:
    """The fp32 [N, k] matrix of a q5k weight: GGUF's Q5_K dequantization bit for bit, (d * sc) * q - dmin * m in
    fp32 (only the subtraction rounds)."""
    if k % 256:
        raise ValueError(f"a q5k (GGUF Q5_K) matrix has K a multiple of 256, got {k}")
    n, nsb = packed.shape[0], k // 256
    raw = packed.contiguous().view(torch.uint8).view(n, nsb * Q5K_ROW_SB)
    q4 = torch.empty(n, nsb * Q4K_ROW_SB, dtype=torch.uint8)
    hi = torch.empty(n, nsb, 8, 32, dtype=torch.uint8)  # per sub-block, its inputs' fifth bits in input order
    full = n // GROUP * GROUP
    if full:
        ng = full // GROUP
        grp = raw[:full].view(ng, nsb, GROUP * Q5K_ROW_SB)
        q4[:full] = grp[:, :, :_Q4K_GROUP_SB].reshape(full, -1)
        plane = grp[:, :, _Q4K_GROUP_SB:_Q4K_GROUP_SB + 512].reshape(ng, nsb, 8, GROUP, 4).permute(0, 3, 1, 2, 4)
        shifts = (torch.arange(4, dtype=torch.uint8).view(1, 4) + 4 * torch.arange(2, dtype=torch.uint8).view(2, 1))
        bits = (plane.reshape(ng, GROUP, nsb, 8, 1, 1, 4) >> shifts.view(2, 4, 1)) & 1  # [.., j, h, s, i]
        hi[:full] = bits.reshape(full, nsb, 8, 32)
    if full < n:
        t = raw[full:].view(n - full, nsb, Q5K_ROW_SB)
        q4[full:] = t[:, :, :Q4K_ROW_SB].reshape(n - full, -1)
        qh = t[:, :, Q4K_ROW_SB:Q4K_ROW_SB + 32]  # [r, nsb, e]: bit j is sub-block j's input e
        hi[full:] = ((qh.unsqueeze(-2) >> torch.arange(8, dtype=torch.uint8).view(8, 1)) & 1)
    v, ds, dm = unpack_q4k(q4.view(torch.int16), k)
    v = v + 16 * hi.view(n, k).float()
    return (v.view(n, -1, 32) * ds.unsqueeze(-1) - dm.unsqueeze(-1)).view(n, k)


__all__ = ["Q5K_BLOCK_BYTES", "Q5K_ROW_SB", "dequantize_q5k", "pack_q5k"]
