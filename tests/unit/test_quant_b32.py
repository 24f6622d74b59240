"""The kernel's b32 formats: GGUF Q5_0, Q4_1 and Q5_1 blocks packed as stored (``pack_b32``: bytes moved, the 5th
bits moved to a plane, never rounded) and multiplied as stored. Dequantized, each is gguf-py's dequantization bit
for bit; the kernel matches an fp64 product of those weights with the int8-rounded activations, every ISA path
gives the scalar path's bits, and each token row of an M-row call gives the bits it gives alone (1 to 33 rows),
with plain tail rows, a bias, and the integer sums at their extremes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdecode.kernels import quant as Q
from specdecode.kernels import quant_b32 as B

gguf = pytest.importorskip("gguf")

ext = Q.load_quant_extension()
ISAS = tuple(ext.supported_isas())  # this CPU's paths, scalar first
ROWS = list(range(1, 34))
FORMATS = list(B.B32_FORMATS)


def _raw(fmt: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random valid rows [n, k / 32 * block bytes]: random bytes (every q and 5th bit), finite moderate fp16 d and m
    of either sign."""
    f = B.B32_FORMATS[fmt]
    g = np.random.default_rng(seed)
    raw = g.integers(0, 256, size=(n, k // 32, f.block_bytes), dtype=np.uint8)
    for at in (f.d, f.m):
        if at is not None:
            v = g.uniform(0.2, 1.0, size=(n, k // 32)) * g.choice([-1, 1], size=(n, k // 32)) * 2e-2
            raw[:, :, at:at + 2] = v.astype(np.float16).view(np.uint8).reshape(n, k // 32, 2)
    return torch.from_numpy(raw.reshape(n, -1))


def _gguf_dequant(fmt: str, raw: torch.Tensor, k: int) -> torch.Tensor:
    qtype = gguf.GGMLQuantizationType[B.B32_FORMATS[fmt].gguf]
    out = gguf.quants.dequantize(raw.numpy(), qtype)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).view(raw.shape[0], k)


@pytest.fixture(params=FORMATS)
def fmt(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("n,k", [(37, 512), (64, 256), (5, 96), (149, 1024), (16, 32), (33, 160)])
def test_pack_is_exact_against_gguf_dequantization(fmt: str, n: int, k: int) -> None:
    raw = _raw(fmt, n, k, seed=n + k)
    p = Q.pack_b32(raw, fmt)
    assert p.dtype == Q.packed_dtype(fmt) and Q.is_packed(p) and Q.packed_format(p) == fmt
    assert p.shape[1] * p.element_size() == ext.packed_row_bytes(k, fmt) == raw.shape[1]  # the file's bytes a row
    ref = _gguf_dequant(fmt, raw, k)
    assert torch.equal(Q.dequantize(p, k), ref)
    ids = torch.tensor([0, n - 1, n // 2, 3 % n, n - 1])
    assert torch.equal(Q.dequantize_rows(p, ids, k), ref[ids])


def test_quantized_blocks_pack_exactly(fmt: str) -> None:
    # what a real file holds: gguf's own quantization of a dense matrix
    qtype = gguf.GGMLQuantizationType[B.B32_FORMATS[fmt].gguf]
    raw = gguf.quants.quantize(np.random.default_rng(1).standard_normal((40, 128)).astype(np.float32), qtype)
    p = Q.pack_b32(torch.from_numpy(raw), fmt)
    assert torch.equal(Q.dequantize(p, 128), _gguf_dequant(fmt, torch.from_numpy(raw), 128))


def test_a_wrong_format_is_caught(fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the exactness check above can fail: a flipped byte in a group's plane, d or m and in a tail row, a flipped qh
    # bit in the file's bytes, or the plane's bits in another order all differ
    n, k = 37, 64
    f = B.B32_FORMATS[fmt]
    raw = _raw(fmt, n, k, seed=3)
    ref = _gguf_dequant(fmt, raw, k)
    p = Q.pack_b32(raw, fmt)
    group = 16 * k // 32 * f.block_bytes  # bytes of one 16-row group (2 blocks a row)
    spots = [3, 256 * 2 + 64 * 2 * (f.qh is not None) + 1, group * 2 + 5]  # quants, a d, a tail row's nibbles
    if f.qh is not None:
        spots.append(256 * 2 + 70)  # group 0, block 1's plane
    for at in spots:
        bad = p.view(torch.uint8).clone().view(-1)
        bad[at] ^= 0x11
        assert not torch.equal(Q.dequantize(bad.view(n, -1).view(p.dtype), k), ref), at
    if f.qh is None:
        return
    raw2 = raw.clone()
    raw2[20, f.block_bytes + f.qh + 1] ^= 4  # row 20 (a group row), block 1: element 10's 5th bit
    assert not torch.equal(Q.dequantize(Q.pack_b32(raw2, fmt), k), ref)

    def reversed_plane(qh: torch.Tensor) -> torch.Tensor:
        bits = (qh.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1
        bits = bits.reshape(*qh.shape[:2], 2, 4, 4)
        out = torch.zeros(*qh.shape[:2], 4, dtype=torch.uint8)
        for h in range(2):
            for s in range(4):
                out |= bits[:, :, h, s] << (4 * h + 3 - s)
        return out

    monkeypatch.setattr(B, "_plane", reversed_plane)
    assert not torch.equal(Q.dequantize(Q.pack_b32(raw, fmt), k), ref)


@pytest.mark.parametrize("k", [512, 96])
def test_every_path_and_row_count_is_exact_and_batch_invariant(fmt: str, k: int) -> None:
    # 149 columns: two chunks of 4 side-by-side groups, one group alone, a plain tail of 5; K = 512 (16 blocks) and
    # 96 (3: an odd count, the regions off 64-byte lines). Each M-row call against the fp64 product of the exact
    # weights with the int8-rounded activations, against the scalar path bit for bit, and row by row against that
    # row alone
    n = 149
    p = Q.pack_b32(_raw(fmt, n, k, seed=7), fmt)
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


def test_integer_sums_at_their_extremes(fmt: str) -> None:
    # every q at its largest (31 or 15) against activations all +127 or all -127: the AVX2 path's int16 sums
    # (maddubs over a block's steps) at their bound, exact on every path
    f = B.B32_FORMATS[fmt]
    n, k = 69, 256
    raw = _raw(fmt, n, k, seed=2).view(n, -1, f.block_bytes)
    raw[:, :, f.qs:f.qs + 16] = 0xff
    if f.qh is not None:
        raw[:, :, f.qh:f.qh + 4] = 0xff
    p = Q.pack_b32(raw.reshape(n, -1), fmt)
    x = torch.cat([torch.ones(2, k), -torch.ones(2, k), torch.randn(1, k)])
    ref64 = ext.reference(x, p)
    want = ext.quant_linear(x, p, None, "scalar")
    assert (want.double() - ref64).abs().max().item() < 1e-5 * ref64.abs().max().item()
    for isa in ISAS:
        assert torch.equal(ext.quant_linear(x, p, None, isa), want), isa


def test_reference_is_the_product_of_the_gguf_weights(fmt: str) -> None:
    # the kernel's fp64 reference is the dequantized matrix times the int8-rounded activations: one-hot rows read
    # back each weight (d_x = 1/127, q_x = 127), and random rows land near the dense product
    n, k = 21, 128
    raw = _raw(fmt, n, k, seed=11)
    p = Q.pack_b32(raw, fmt)
    deq = _gguf_dequant(fmt, raw, k).double()
    assert torch.allclose(ext.reference(torch.eye(k), p).T, deq, rtol=1e-6, atol=1e-9)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2))
    dense = x.double() @ deq.T
    assert (ext.reference(x, p) - dense).abs().max().item() < 0.03 * dense.abs().max().item()


def test_linear_dispatches_the_format_and_checks_k(fmt: str) -> None:
    n, k = 40, 256
    p = Q.pack_b32(_raw(fmt, n, k, seed=5), fmt)
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
        big = Q.pack_b32(_raw(fmt, 149, 256, seed=6), fmt)
        xs = x.view(6, k)
        assert torch.equal(ext.quant_linear(xs, big, None, None), ext.quant_linear(xs, big, None, "scalar"))
    finally:
        Q.set_quant_isa(before)
        torch.set_num_threads(threads)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ext.quant_linear(torch.randn(1, 48), torch.zeros(n, 48 * 2, dtype=torch.uint8).view(p.dtype), None, None)
    with pytest.raises(RuntimeError, match="bytes per row"):
        ext.quant_linear(torch.randn(1, 512), p, None, None)
    with pytest.raises(ValueError, match=str(B.B32_FORMATS[fmt].block_bytes)):
        Q.pack_b32(torch.zeros(4, 7, dtype=torch.uint8), fmt)
    with pytest.raises(ValueError, match="multiple of 32"):
        Q.dequantize(p, 250)
