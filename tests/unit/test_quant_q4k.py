"""The kernel's q4k format: GGUF Q4_K blocks packed as stored (``pack_q4k``, bytes moved, never rounded) and
multiplied as stored. Dequantized, it is gguf-py's Q4_K dequantization bit for bit; the kernel matches an fp64
product of those weights with the int8-rounded activations, every ISA path gives the scalar path's bits, and
each token row of an M-row call gives the bits it gives alone (1 to 33 rows), with plain tail rows and a bias."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdecode.kernels import quant as Q
from specdecode.kernels import quant_q4k

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

ext = Q.load_quant_extension()


def _raw_q4k(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random valid Q4_K rows [n, k / 256 * 144]: random bytes, with finite moderate fp16 d and dmin."""
    g = np.random.default_rng(seed)
    raw = g.integers(0, 256, size=(n, k // 256, 144), dtype=np.uint8)
    d = (g.uniform(0.2, 1.0, size=(n, k // 256, 2)) * g.choice([-1, 1], size=(n, k // 256, 2)) * 2e-3)
    raw[:, :, 0:4] = d.astype(np.float16).view(np.uint8).reshape(n, k // 256, 4)
    return torch.from_numpy(raw.reshape(n, -1))


def _gguf_dequant(raw: torch.Tensor, k: int) -> torch.Tensor:
    out = gguf_quants.dequantize(raw.numpy(), GGMLQuantizationType.Q4_K)
    return torch.from_numpy(np.ascontiguousarray(out)).view(raw.shape[0], k)


@pytest.mark.parametrize("n,k", [(37, 512), (64, 256), (5, 768), (149, 1024)])
def test_pack_is_exact_against_gguf_dequantization(n: int, k: int) -> None:
    raw = _raw_q4k(n, k, seed=n + k)
    p = Q.pack_q4k(raw)
    assert p.dtype == Q.packed_dtype("q4k") == torch.int16 and Q.is_packed(p) and Q.packed_format(p) == "q4k"
    assert p.shape == (n, ext.q4k_row_bytes(k) // 2) and ext.q4k_row_bytes(k) * 8 / k <= 4.75
    ref = _gguf_dequant(raw, k)
    assert torch.equal(Q.dequantize(p, k), ref)
    ids = torch.tensor([0, n - 1, n // 2, 3 % n, n - 1])
    assert torch.equal(Q.dequantize_rows(p, ids, k), ref[ids])


def test_a_wrong_format_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # the exactness check above can fail: a corrupted scale byte in the packed tensor, a flipped bit in the
    # raw GGUF bytes, or scales unpacked without their high 2 bits (a plausible get_scale_min slip) all differ
    n, k = 32, 512
    raw = _raw_q4k(n, k, seed=3)
    ref = _gguf_dequant(raw, k)
    p = Q.pack_q4k(raw)
    assert torch.equal(Q.dequantize(p, k), ref)
    bad = p.view(torch.uint8).clone().view(-1)
    bad[2048] ^= 1  # group 0, super-block 0: sub-block 0's scale of row 0
    assert not torch.equal(Q.dequantize(bad.view(n, -1).view(torch.int16), k), ref)
    raw2 = raw.clone()
    raw2[5, 144 + 4] ^= 2  # row 5, super-block 1: scale 0's low bits
    assert not torch.equal(Q.dequantize(Q.pack_q4k(raw2), k), ref)

    def low_bits_only(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = scales.reshape(*scales.shape[:-1], 3, 4)
        d, m, md = s[..., 0, :], s[..., 1, :], s[..., 2, :]
        return torch.cat([d & 63, md & 15], dim=-1), torch.cat([m & 63, md >> 4], dim=-1)

    monkeypatch.setattr(quant_q4k, "_q4k_scale_min", low_bits_only)
    assert not torch.equal(Q.dequantize(Q.pack_q4k(raw), k), ref)
