"""The kernel's q6k format: GGUF Q6_K blocks packed as stored (``pack_q6k``: bytes moved and split into a nibble
plane and a 2-bit plane, never rounded) and multiplied as stored. Dequantized, it is gguf-py's Q6_K dequantization
bit for bit; the kernel matches an fp64 product of those weights with the int8-rounded activations, every ISA path
gives the scalar path's bits, and each token row of an M-row call gives the bits it gives alone (1 to 33 rows),
with plain tail rows and a bias."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdecode.kernels import quant as Q

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

ext = Q.load_quant_extension()
ISAS = tuple(ext.supported_isas())  # this CPU's paths, scalar first


def _raw_q6k(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random valid Q6_K rows [n, k / 256 * 210]: random bytes (int8 scales any value), a finite moderate fp16 d."""
    g = np.random.default_rng(seed)
    raw = g.integers(0, 256, size=(n, k // 256, 210), dtype=np.uint8)
    d = g.uniform(0.2, 1.0, size=(n, k // 256, 1)) * g.choice([-1, 1], size=(n, k // 256, 1)) * 1e-4
    raw[:, :, 208:210] = d.astype(np.float16).view(np.uint8).reshape(n, k // 256, 2)
    return torch.from_numpy(raw.reshape(n, -1))


def _gguf_dequant(raw: torch.Tensor, k: int) -> torch.Tensor:
    out = gguf_quants.dequantize(raw.numpy(), GGMLQuantizationType.Q6_K)
    return torch.from_numpy(np.ascontiguousarray(out)).view(raw.shape[0], k)


@pytest.mark.parametrize("n,k", [(37, 512), (64, 256), (5, 768), (149, 1024)])
def test_pack_is_exact_against_gguf_dequantization(n: int, k: int) -> None:
    raw = _raw_q6k(n, k, seed=n + k)
    p = Q.pack_q6k(raw)
    assert p.dtype == Q.packed_dtype("q6k") == torch.int32 and Q.is_packed(p) and Q.packed_format(p) == "q6k"
    assert p.shape == (n, ext.q6k_row_bytes(k) // 4) and ext.q6k_row_bytes(k) * 8 / k <= 6.9
    ref = _gguf_dequant(raw, k)
    assert torch.equal(Q.dequantize(p, k), ref)
    ids = torch.tensor([0, n - 1, n // 2, 3 % n, n - 1])
    assert torch.equal(Q.dequantize_rows(p, ids, k), ref[ids])


def test_a_wrong_format_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # the exactness check above can fail: a flipped high bit or scale byte in the packed tensor (group and tail),
    # a flipped qh bit in the raw GGUF bytes, or the 2-bit parts read in the wrong order all differ
    n, k = 37, 512
    raw = _raw_q6k(n, k, seed=3)
    ref = _gguf_dequant(raw, k)
    p = Q.pack_q6k(raw)
    assert torch.equal(Q.dequantize(p, k), ref)
    for at in (2048 + 70, 3072 + 5, 16 * 424 * 2 + 128 + 3):  # group 0 high bits and a scale; a tail row's high bits
        bad = p.view(torch.uint8).clone().view(-1)
        bad[at] ^= 4
        assert not torch.equal(Q.dequantize(bad.view(n, -1).view(torch.int32), k), ref), at
    raw2 = raw.clone()
    raw2[5, 210 + 128 + 7] ^= 16  # row 5, super-block 1: a qh bit
    assert not torch.equal(Q.dequantize(Q.pack_q6k(raw2), k), ref)

    def swapped(blocks: torch.Tensor) -> torch.Tensor:
        m, nsb = blocks.shape[:2]
        ql = blocks[:, :, :128].reshape(m, nsb, 2, 1, 64)
        qh = blocks[:, :, 128:192].reshape(m, nsb, 2, 1, 32)
        lo = torch.cat([ql & 15, ql >> 4], dim=3).reshape(m, nsb, 2, 4, 32)
        hi = torch.cat([(qh >> s) & 3 for s in (0, 4, 2, 6)], dim=3)  # quarters 1 and 2 swapped
        return (lo | (hi << 4)).reshape(m, nsb, 256)

    monkeypatch.setattr(Q, "_q6k_q", swapped)
    assert not torch.equal(Q.dequantize(Q.pack_q6k(raw), k), ref)


def test_extreme_values_do_not_overflow() -> None:
    # q = 63 everywhere (ql, qh all ones) against activations at +-127: the largest integer dots (the avx2
    # path's int16 sums of two steps of maddubs are closest to their limit here); every path equals the reference
    n, k = 48, 256
    raw = _raw_q6k(n, k, seed=9)
    raw.view(n, 1, 210)[:, :, :192] = 255
    p = Q.pack_q6k(raw)
    x = torch.ones(4, k)
    x[1] = -1
    x[2, ::2] = -1
    x[3, :] = torch.tensor([1.0, -1.0]).repeat(k // 2).flip(0)
    ref64 = ext.reference(x, p)
    want = ext.quant_linear(x, p, None, "scalar")
    assert (want.double() - ref64).abs().max().item() < 1e-5 * ref64.abs().max().item()
    for isa in ISAS:
        assert torch.equal(ext.quant_linear(x, p, None, isa), want), isa
