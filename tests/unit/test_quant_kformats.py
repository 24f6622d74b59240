"""What the kernel's K-quant formats share, for each of them (q4k: GGUF Q4_K; q5k: GGUF Q5_K; q6k: GGUF Q6_K;
each format's own packing and corruption tests are in ``test_quant_q4k.py``, ``_q5k.py`` and ``_q6k.py``): every
ISA path and row count from 1 to 33 gives the scalar path's bits and each row the bits it gives alone, the fp64
reference is the product of the file's exact weights, and ``linear`` dispatches the format and refuses a wrong K."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import test_quant_q4k as Q4
import test_quant_q5k as Q5
import test_quant_q6k as Q6
from specdecode.kernels import quant as Q

ext = Q.load_quant_extension()
ISAS = tuple(ext.supported_isas())  # this CPU's paths, scalar first
ROWS = list(range(1, 34))


@dataclass(frozen=True)
class Format:
    name: str
    pack: Callable[[torch.Tensor], torch.Tensor]
    raw: Callable[..., torch.Tensor]  # (n, k, seed) -> random valid GGUF rows
    gguf_dequant: Callable[[torch.Tensor, int], torch.Tensor]
    block_bytes: int  # GGUF bytes per 256 weights
    wrong_k: Callable[[int], torch.Tensor]  # a packed-looking [n, ...] tensor for K = 320
    atol: float  # the reference's absolute tolerance on one weight


FORMATS = [
    Format("q4k", Q.pack_q4k, Q4._raw_q4k, Q4._gguf_dequant, 144,
           lambda n: Q.pack_q4k(Q4._raw_q4k(n, 256))[:, :74 * 320 // 256], 1e-9),
    Format("q5k", Q.pack_q5k, Q5._raw_q5k, Q5._gguf_dequant, 176,
           lambda n: torch.zeros(n, 184 * 320 // 256 // 8, dtype=torch.int64), 1e-9),
    Format("q6k", Q.pack_q6k, Q6._raw_q6k, Q6._gguf_dequant, 210,
           lambda n: torch.zeros(n, 212 * 320 // 256 // 4, dtype=torch.int32), 1e-12),
]


@pytest.fixture(params=FORMATS, ids=lambda f: f.name)
def fmt(request: pytest.FixtureRequest) -> Format:
    return request.param


def test_every_path_and_row_count_is_exact_and_batch_invariant(fmt: Format) -> None:
    # 149 columns: two chunks of 4 side-by-side groups, one group alone, a plain tail of 5; K = 512: two
    # super-blocks. Each M-row call against the fp64 product of the exact weights with the int8-rounded
    # activations, against the scalar path bit for bit, and row by row against that row alone
    n, k = 149, 512
    p = fmt.pack(fmt.raw(n, k, seed=7))
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


def test_reference_is_the_product_of_the_gguf_weights(fmt: Format) -> None:
    # the kernel's fp64 reference is the dequantized matrix times the int8-rounded activations: one-hot rows
    # read back each weight (d_x = 1/127, q_x = 127), and random rows land near the dense product
    n, k = 21, 256
    raw = fmt.raw(n, k, seed=11)
    p = fmt.pack(raw)
    deq = fmt.gguf_dequant(raw, k).double()
    assert torch.allclose(ext.reference(torch.eye(k), p).T, deq, rtol=1e-6, atol=fmt.atol)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2))
    dense = x.double() @ deq.T
    assert (ext.reference(x, p) - dense).abs().max().item() < 0.03 * dense.abs().max().item()


def test_linear_dispatches_the_format_and_checks_k(fmt: Format) -> None:
    n, k = 40, 256
    p = fmt.pack(fmt.raw(n, k, seed=5))
    assert Q.packed_format(p) == fmt.name
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
        big = fmt.pack(fmt.raw(149, 256, seed=6))
        xs = x.view(6, k)
        assert torch.equal(ext.quant_linear(xs, big, None, None), ext.quant_linear(xs, big, None, "scalar"))
    finally:
        Q.set_quant_isa(before)
        torch.set_num_threads(threads)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        ext.quant_linear(torch.randn(1, 320), fmt.wrong_k(n), None, None)
    with pytest.raises(RuntimeError, match="bytes per row"):
        ext.quant_linear(torch.randn(1, 512), p, None, None)
    with pytest.raises(ValueError, match=str(fmt.block_bytes)):
        fmt.pack(torch.zeros(4, 100, dtype=torch.uint8))
    with pytest.raises(ValueError, match="multiple of 256"):
        Q.dequantize(p, 320)
