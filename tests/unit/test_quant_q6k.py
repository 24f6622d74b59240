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
ROWS = list(range(1, 34))


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


def test_every_path_and_row_count_is_exact_and_batch_invariant() -> None:
    # 149 columns: two chunks of 4 side-by-side groups, one group alone, a plain tail of 5; K = 512: two
    # super-blocks. Each M-row call against the fp64 product of the exact weights with the int8-rounded
    # activations, against the scalar path bit for bit, and row by row against that row alone
    n, k = 149, 512
    raw = _raw_q6k(n, k, seed=7)
    p = Q.pack_q6k(raw)
    g = torch.Generator().manual_seed(1)
    x, b = torch.randn(max(ROWS), k, generator=g), torch.randn(n, generator=g)
    ref64 = ext.reference(x, p) + b.double()
    scale = ref64.abs().max().item()
    alone = torch.cat([ext.quant_linear(x[i:i + 1].contiguous(), p, b, "scalar") for i in range(x.shape[0])])
    assert (alone.double() - ref64).abs().max().item() < 1e-5 * scale
    for isa in ISAS:
        for m in ROWS:
            y = ext.quant_linear(x[:m].contiguous(), p, b, isa)
            assert torch.equal(y, alone[:m]), (isa, m)
        one = torch.cat([ext.quant_linear(x[i:i + 1].contiguous(), p, b, isa) for i in range(x.shape[0])])
        assert torch.equal(one, alone), isa


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


def test_reference_is_the_product_of_the_gguf_weights() -> None:
    # the kernel's fp64 reference is the dequantized Q6_K matrix times the int8-rounded activations: one-hot
    # rows read back each weight (d_x = 1/127, q_x = 127), and random rows land near the dense product
    n, k = 21, 256
    raw = _raw_q6k(n, k, seed=11)
    p = Q.pack_q6k(raw)
    deq = _gguf_dequant(raw, k).double()
    assert torch.allclose(ext.reference(torch.eye(k), p).T, deq, rtol=1e-6, atol=1e-12)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2))
    dense = x.double() @ deq.T
    assert (ext.reference(x, p) - dense).abs().max().item() < 0.03 * dense.abs().max().item()


def test_linear_dispatches_q6k_and_checks_k() -> None:
    n, k = 40, 256
    p = Q.pack_q6k(_raw_q6k(n, k, seed=5))
    x = torch.randn(2, 3, k, generator=torch.Generator().manual_seed(3))
    y = ext.linear(x, p, None, True)
    assert y.shape == (2, 3, n)
    assert torch.equal(y.view(6, n), ext.quant_linear(x.view(6, k), p, None, None))
    before, threads = Q.quant_isa(), torch.get_num_threads()
    try:  # linear() takes the forced path; at 2 threads (column groups split between them) the same bits
        for isa in ISAS:
            Q.set_quant_isa(isa)
            want = ext.quant_linear(x.view(6, k), p, None, "scalar")
            assert torch.equal(ext.linear(x, p, None, True).view(6, n), want)
        torch.set_num_threads(2)
        big = Q.pack_q6k(_raw_q6k(149, 256, seed=6))
        xs = x.view(6, k)
        assert torch.equal(ext.quant_linear(xs, big, None, None), ext.quant_linear(xs, big, None, "scalar"))
    finally:
        Q.set_quant_isa(before)
        torch.set_num_threads(threads)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        ext.quant_linear(torch.randn(1, 320), torch.zeros(n, 212 * 320 // 256 // 4, dtype=torch.int32), None, None)
    with pytest.raises(RuntimeError, match="bytes per row"):
        ext.quant_linear(torch.randn(1, 512), p, None, None)
    with pytest.raises(ValueError, match="210"):
        Q.pack_q6k(torch.zeros(4, 100, dtype=torch.uint8))
    with pytest.raises(ValueError, match="multiple of 256"):
        Q.dequantize(p, 320)
