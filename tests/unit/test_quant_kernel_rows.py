"""The quantized kernel's multi-row paths (verification passes of 2-16 token rows, and longer prefills):
every row of a call of any size gives the bits the single-row (decode) path gives it, on every ISA path this
CPU has and at 1 and 2 threads, so speculative verification stays exact relative to the quantized model."""

from __future__ import annotations

import pytest
import torch

from specdecode.kernels import quant as Q

ext = Q.load_quant_extension()
ISAS = tuple(ext.supported_isas())  # this CPU's paths, scalar first
ROWS = list(range(1, 17)) + [17, 24, 33]  # verification passes, and more than one 16-row walk (prefill)


def _case(n: int, k: int, m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g), torch.randn(m, k, generator=g), torch.randn(n, generator=g)


def _rows_one_by_one(x: torch.Tensor, p: torch.Tensor, b: torch.Tensor, isa: str) -> torch.Tensor:
    return torch.cat([ext.quant_linear(x[i:i + 1].contiguous(), p, b, isa) for i in range(x.shape[0])])


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("n,k", [(149, 576), (64, 144)])
def test_every_row_count_matches_the_single_row_path(fmt: str, n: int, k: int) -> None:
    # 149 columns: two chunks of 4 side-by-side groups, one group alone, a plain tail of 5; K = 144: a
    # partial last block. Each row of an m-row call against that row alone (the decode path), every path
    # against the scalar one
    w, x, b = _case(n, k, max(ROWS), seed=n + k)
    p = Q.quantize(w, fmt)
    ref = _rows_one_by_one(x, p, b, "scalar")
    for isa in ISAS:
        assert torch.equal(_rows_one_by_one(x, p, b, isa), ref), (fmt, isa, "one row")
        for m in ROWS:
            y = ext.quant_linear(x[:m].contiguous(), p, b, isa)
            assert torch.equal(y, ref[:m]), (fmt, isa, m)
        # and a row's result does not depend on where in the call it sits
        y = ext.quant_linear(x[5:12].contiguous(), p, b, isa)
        assert torch.equal(y, ref[5:12]), (fmt, isa, "offset")


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_every_row_count_is_thread_count_invariant(fmt: str) -> None:
    # 300 columns: 18 groups and a tail, which 2 threads split at a chunk boundary of their own
    w, x, b = _case(300, 576, 16, seed=7)
    p = Q.quantize(w, fmt)
    ref = _rows_one_by_one(x, p, b, "scalar")
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for isa in ISAS[1:]:
                for m in range(1, 17):
                    assert torch.equal(ext.quant_linear(x[:m].contiguous(), p, b, isa), ref[:m]), (isa, threads, m)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_multi_row_paths_at_the_extremes(fmt: str) -> None:
    # activations and weights at the ends of their ranges: the int16 sums of the AVX2 paths (int4: 8
    # steps of maddubs per block) must not saturate or wrap, whatever the row count
    n, k = 48, 256
    g = torch.Generator().manual_seed(3)
    w = torch.where(torch.rand(n, k, generator=g) < 0.5, -1.0, 1.0)
    w[:, ::32] *= 1.0001  # int4: the block peak at one end of the range, every other weight at +-d
    x = torch.where(torch.rand(16, k, generator=g) < 0.5, -1.0, 1.0)
    x[:8] = x[:8].abs()  # rows of one sign: the largest |block dot|
    x[8:12] = -x[8:12].abs()
    p = Q.quantize(w, fmt)
    ref = ext.reference(x, p)
    for isa in ISAS:
        for m in (1, 4, 8, 16):
            y = ext.quant_linear(x[:m].contiguous(), p, None, isa).double()
            assert (y - ref[:m]).abs().max().item() < 1e-5 * ref.abs().max().item(), (isa, m)


@pytest.mark.parametrize("fmt", ["int8", "int4", "q4k", "q5k", "q6k", "q5_0", "q4_1", "q5_1"])
def test_every_call_reads_one_or_four_streams_to_the_same_bits(fmt: str) -> None:
    # a call (a decode step's one token row, a verification pass's several, register blocks of 5 + 4 and int8's
    # K segments at 17) reads 1 weight stream on AMD and 4 side by side elsewhere: both walks, and the CPU's
    # default, give the scalar path's bits; 149 columns: two chunks of 4 groups, one alone and a tail
    from specdecode.bench.kernel_ab import random_packed

    g = torch.Generator().manual_seed(11)
    p = random_packed(149, 512, fmt, g)
    x, b = torch.randn(17, 512, generator=g), torch.randn(149, generator=g)
    for m in (1, 2, 5, 8, 9, 17):
        for bias in (b, None):  # without one, calls of up to 8 rows store their sums straight (groups_vnni_run)
            ref = ext.quant_linear(x[:m], p, bias, "scalar")
            for isa in ISAS[1:]:
                for streams in (0, 1, 4):
                    got = ext.quant_linear(x[:m], p, bias, isa, streams)
                    assert torch.equal(got, ref), (fmt, m, isa, streams, bias is None)


def test_streams_take_one_or_four_and_name_the_fix() -> None:
    before = Q.set_quant_streams(1)
    try:
        assert Q.quant_streams() == 1
        assert Q.set_quant_streams(0) == 1 and Q.quant_streams() == (1 if ext.is_amd() else 4)
        with pytest.raises(RuntimeError, match="streams must be 1, 4 or 0"):
            ext.set_streams(3)
        with pytest.raises(RuntimeError, match="streams must be 1, 4 or 0"):
            ext.quant_linear(torch.zeros(1, 64), Q.quantize(torch.zeros(16, 64), "int8"), None, None, 2)
    finally:
        Q.set_quant_streams(before)
