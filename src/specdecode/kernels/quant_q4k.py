"""GGUF Q4_K as stored for the kernel: the q4k format (``quant_linear.cpp`` has the layout), its packer and the
reader the tests and the q5k format (``quant_q5k.py``, Q4_K plus a fifth bit) build on."""

from __future__ import annotations

import torch

GROUP = 16  # weight rows interleaved per group: quant_linear.cpp's G

Q4K_BLOCK_BYTES = 144  # GGUF Q4_K super-block: fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 of nibbles
Q4K_ROW_SB = 148  # our q4k bytes per row and super-block: 128 of nibbles, 8 scales, 8 mins, fp16 d, fp16 dmin


def _q4k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 scale bytes [..., 12] -> 6-bit scales and mins [..., 8] (llama.cpp's get_scale_min_k4)."""
    s = scales.view(*scales.shape[:-1], 3, 4)
    d, m, md = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], dim=-1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], dim=-1)
    return sc, mn


def pack_q4k(raw: torch.Tensor) -> torch.Tensor:
    """GGUF Q4_K rows as stored ([N, K / 256 * 144] uint8) as the kernel's q4k format ([N, K / 256 * 74] int16
    over K / 256 * 148 bytes a row), moving bytes only: the kernel computes Q4_K's weights d * sc * q - dmin * m
    exactly as stored (``quant_linear.cpp`` has the layout and arithmetic). K must be a multiple of 256."""
    if raw.dim() != 2 or raw.shape[1] % Q4K_BLOCK_BYTES:
        raise ValueError(f"Q4_K rows are [N, K / 256 * {Q4K_BLOCK_BYTES}] bytes, got shape {tuple(raw.shape)}")
    n = raw.shape[0]
    blocks = raw.contiguous().view(torch.uint8).view(n, -1, Q4K_BLOCK_BYTES)
    nsb = blocks.shape[1]
    sc, mn = _q4k_scale_min(blocks[:, :, 4:16])  # [n, nsb, 8] each
    # quants: per 64-weight chunk i, byte t holds q[64i + t] (low) and q[64i + 32 + t] (high); ours per
    # sub-block j (32 weights): byte t < 16 holds v[32j + t] | v[32j + 16 + t] << 4
    qs = blocks[:, :, 16:].view(n, nsb, 4, 2, 16)
    a, b = qs[:, :, :, 0], qs[:, :, :, 1]
    q = torch.stack([(a & 15) | (b << 4), (a >> 4) | (b & 0xF0)], dim=3)  # [n, nsb, chunk, sub-block, 16]
    rb = nsb * Q4K_ROW_SB
    out = torch.empty(n, rb, dtype=torch.uint8)
    full = n // GROUP * GROUP
    if full:
        ng = full // GROUP
        grp = out[:full].view(ng, nsb, GROUP * Q4K_ROW_SB)  # a group's super-blocks, one after another
        # [group, sb, sub-block, step s, row, i]
        grp[:, :, :2048].view(ng, nsb, 8, 4, GROUP, 4).copy_(
            q[:full].reshape(ng, GROUP, nsb, 8, 4, 4).permute(0, 2, 3, 4, 1, 5))
        grp[:, :, 2048:2176].view(ng, nsb, 8, GROUP).copy_(sc[:full].view(ng, GROUP, nsb, 8).permute(0, 2, 3, 1))
        grp[:, :, 2176:2304].view(ng, nsb, 8, GROUP).copy_(mn[:full].view(ng, GROUP, nsb, 8).permute(0, 2, 3, 1))
        grp[:, :, 2304:2368].view(ng, nsb, 2, GROUP, 2).copy_(
            blocks[:full, :, :4].reshape(ng, GROUP, nsb, 2, 2).permute(0, 2, 3, 1, 4))
    if full < n:
        t = out[full:].view(n - full, nsb, Q4K_ROW_SB)
        t[:, :, :128].view(n - full, nsb, 8, 16).copy_(q[full:].reshape(n - full, nsb, 8, 16))
        t[:, :, 128:136].copy_(sc[full:])
        t[:, :, 136:144].copy_(mn[full:])
        t[:, :, 144:148].copy_(blocks[full:, :, :4])
    return out.view(torch.int16)


def unpack_q4k(packed: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Nibbles v [N, k] (fp32) and the exact fp32 d * sc, dmin * m [N, k / 32] of a q4k matrix."""
    if k % 256:
        raise ValueError(f"a q4k (GGUF Q4_K) matrix has K a multiple of 256, got {k}")
    n, nsb = packed.shape[0], k // 256
    raw = packed.contiguous().view(torch.uint8).view(n, nsb * Q4K_ROW_SB)
    q8 = torch.empty(n, nsb, 8, 16, dtype=torch.uint8)  # per sub-block, the plain row order
    sc = torch.empty(n, nsb, 8, dtype=torch.uint8)
    mn = torch.empty(n, nsb, 8, dtype=torch.uint8)
    dd = torch.empty(n, nsb, 2, 2, dtype=torch.uint8)
    full = n // GROUP * GROUP
    if full:
        ng = full // GROUP
        grp = raw[:full].view(ng, nsb, GROUP * Q4K_ROW_SB)
        q8[:full] = grp[:, :, :2048].reshape(ng, nsb, 8, 4, GROUP, 4).permute(0, 4, 1, 2, 3, 5).reshape(q8[:full].shape)
        sc[:full] = grp[:, :, 2048:2176].reshape(ng, nsb, 8, GROUP).permute(0, 3, 1, 2).reshape(full, nsb, 8)
        mn[:full] = grp[:, :, 2176:2304].reshape(ng, nsb, 8, GROUP).permute(0, 3, 1, 2).reshape(full, nsb, 8)
        dd[:full] = grp[:, :, 2304:2368].reshape(ng, nsb, 2, GROUP, 2).permute(0, 3, 1, 2, 4).reshape(full, nsb, 2, 2)
    if full < n:
        t = raw[full:].view(n - full, nsb, Q4K_ROW_SB)
        q8[full:] = t[:, :, :128].reshape(n - full, nsb, 8, 16)
        sc[full:] = t[:, :, 128:136]
        mn[full:] = t[:, :, 136:144]
        dd[full:] = t[:, :, 144:148].reshape(n - full, nsb, 2, 2)
    v = torch.cat([q8 & 15, q8 >> 4], dim=-1).float().view(n, k)
    d = dd.view(torch.float16).view(n, nsb, 2).float()  # d, dmin
    ds = (d[:, :, :1] * sc.float()).view(n, nsb * 8)
    dm = (d[:, :, 1:] * mn.float()).view(n, nsb * 8)
    return v, ds, dm


__all__ = ["Q4K_BLOCK_BYTES", "Q4K_ROW_SB", "pack_q4k", "unpack_q4k"]
