"""The kernel's q5k format: GGUF Q5_K blocks packed as stored (``pack_q5k``, bytes and fifth bits moved, never
rounded). Dequantized, it is gguf-py's Q5_K dequantization bit for bit; a corrupted byte, a flipped fifth bit or a
plane read at the wrong shift all differ. Every ISA path and row count: ``test_quant_kformats.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdecode.kernels import quant as Q
from specdecode.kernels import quant_q5k

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

ext = Q.load_quant_extension()


def _raw_q5k(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random valid Q5_K rows [n, k / 256 * 176]: random bytes (every nibble and fifth bit), with finite moderate
    fp16 d and dmin."""
    g = np.random.default_rng(seed)
    raw = g.integers(0, 256, size=(n, k // 256, 176), dtype=np.uint8)
    d = g.uniform(0.2, 1.0, size=(n, k // 256, 2)) * g.choice([-1, 1], size=(n, k // 256, 2)) * 2e-3
    raw[:, :, 0:4] = d.astype(np.float16).view(np.uint8).reshape(n, k // 256, 4)
    return torch.from_numpy(raw.reshape(n, -1))


def _gguf_dequant(raw: torch.Tensor, k: int) -> torch.Tensor:
    out = gguf_quants.dequantize(raw.numpy(), GGMLQuantizationType.Q5_K)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).view(raw.shape[0], k)


@pytest.mark.parametrize("n,k", [(37, 512), (64, 256), (5, 768), (149, 1024), (16, 256)])
def test_pack_is_exact_against_gguf_dequantization(n: int, k: int) -> None:
    raw = _raw_q5k(n, k, seed=n + k)
    p = Q.pack_q5k(raw)
    assert p.dtype == Q.packed_dtype("q5k") == torch.int64 and Q.is_packed(p) and Q.packed_format(p) == "q5k"
    assert p.shape == (n, ext.packed_row_bytes(k, "q5k") // 8) and ext.packed_row_bytes(k, "q5k") * 8 / k <= 5.75
    ref = _gguf_dequant(raw, k)
    assert torch.equal(Q.dequantize(p, k), ref)
    ids = torch.tensor([0, n - 1, n // 2, 3 % n, n - 1])
    assert torch.equal(Q.dequantize_rows(p, ids, k), ref[ids])


def test_a_wrong_fifth_bit_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    n, k = 32, 512
    raw = _raw_q5k(n, k, seed=3)
    ref = _gguf_dequant(raw, k)
    p = Q.pack_q5k(raw)
    bad = p.view(torch.uint8).clone().view(-1)
    bad[2368] ^= 1  # group 0, super-block 0: the plane's first byte (row 0, sub-block 0)
    assert not torch.equal(Q.dequantize(bad.view(n, -1).view(torch.int64), k), ref)
    raw2 = raw.clone()
    raw2[5, 176 + 16] ^= 4  # row 5, super-block 1: sub-block 2's fifth bit of input 0
    assert not torch.equal(Q.dequantize(Q.pack_q5k(raw2), k), ref)
    # the kernel multiplies what the reference dequantizes: the same corruption moves its output
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(ext.quant_linear(x, p, None, None),
                           ext.quant_linear(x, bad.view(n, -1).view(torch.int64), None, None))

    planes = quant_q5k._planes
    monkeypatch.setattr(quant_q5k, "_planes", lambda qh: torch.roll(planes(qh), 1, dims=-1))
    assert not torch.equal(Q.dequantize(Q.pack_q5k(raw), k), ref)
