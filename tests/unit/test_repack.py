"""The C++ repack (``kernels/repack.cpp``) writes exactly the bytes the torch packers write, for every GGUF type it
moves, every row count across the 16-row groups and the plain tail, stacked parts and llama.cpp's q/k row order.
The torch packers are themselves checked against the ``gguf`` package's dequantization (test_quant_q4k.py, _q6k,
_b32, _kernel), so equal bytes mean the same weights."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch

from specdecode.kernels import quant as Q
from specdecode.kernels.repack import DECODABLE, REPACK_FORMATS, load_repack_extension, repack, round_int8
from specdecode.models.tables import decode_rows

if load_repack_extension() is None:
    pytest.skip("the repack extension does not build here", allow_module_level=True)

BLOCK = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
         "Q5_0": (32, 22), "Q4_1": (32, 20), "Q5_1": (32, 24)}
TORCH_PACKERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q8_0": lambda raw: Q.pack_gguf(raw, "int8"), "Q4_0": lambda raw: Q.pack_gguf(raw, "int4"),
    "Q4_K": Q.pack_q4k, "Q5_K": Q.pack_q5k, "Q6_K": Q.pack_q6k,
    **{kind: (lambda raw, fmt=fmt: Q.pack_b32(raw, fmt)) for kind, fmt in REPACK_FORMATS.items()
       if fmt.startswith("q") and fmt not in ("q4k", "q5k", "q6k")}}


def _rows(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random stored rows: every byte random (the move never reads a value, so any bytes must survive it)."""
    elems, size = BLOCK[kind]
    return np.random.default_rng(seed).integers(0, 256, size=(n, k // elems * size), dtype=np.uint8)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_every_gguf_type_the_kernel_reads_is_covered() -> None:
    assert set(TORCH_PACKERS) == set(REPACK_FORMATS) == set(BLOCK)


@pytest.mark.parametrize("kind", sorted(BLOCK))
@pytest.mark.parametrize("n", [*range(1, 34), 48, 71])
def test_the_same_bytes_as_the_torch_packer(kind: str, n: int) -> None:
    k = 512 if BLOCK[kind][0] == 256 else 96
    rows = _rows(kind, n, k, seed=n)
    ours = repack([(kind, rows, None)], k)
    ref = TORCH_PACKERS[kind](torch.from_numpy(rows.copy()))
    assert ours is not None and ours.dtype == ref.dtype == Q.packed_dtype(REPACK_FORMATS[kind])
    assert ours.shape == ref.shape and torch.equal(_bytes(ours), _bytes(ref))


@pytest.mark.parametrize("kind", sorted(BLOCK))
def test_stacked_parts_in_their_own_row_order(kind: str) -> None:
    """q|k|v from three tensors, q and k reordered (llama.cpp's permutation undone): what the loader hands over."""
    k = 256
    parts = [_rows(kind, n, k, seed=s) for s, n in ((1, 40), (2, 24), (3, 9))]
    orders = [torch.randperm(40, generator=torch.Generator().manual_seed(0)), torch.arange(24).flip(0), None]
    ours = repack([(kind, p, o) for p, o in zip(parts, orders)], k)
    stacked = np.concatenate([p if o is None else p[o.numpy()] for p, o in zip(parts, orders)])
    assert ours is not None and torch.equal(_bytes(ours), _bytes(TORCH_PACKERS[kind](torch.from_numpy(stacked))))


def test_bad_input_is_refused_with_what_was_wrong() -> None:
    rows = _rows("Q4_K", 16, 256, seed=0)
    with pytest.raises(ValueError, match="no kernel layout for GGUF type Q3_K"):
        repack([("Q3_K", rows, None)], 256)
    with pytest.raises(ValueError, match="multiple of 256"):
        repack([("Q4_K", rows, None)], 300)
    with pytest.raises(ValueError, match="Q4_K rows of 512 inputs hold 288 bytes, not 144"):
        repack([("Q4_K", rows, None)], 512)
    with pytest.raises(ValueError, match="out of range"):
        repack([("Q4_K", rows, torch.full((16,), 16))], 256)
    with pytest.raises(ValueError, match="C-contiguous uint8"):
        repack([("Q4_K", rows[:, ::2], None)], 256)


SCALES = {"Q8_0": (0,), "Q4_0": (0,), "Q5_0": (0,), "Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2),
          "Q6_K": (208,)}


def _valid_rows(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    """Stored rows with finite weights: random bytes, every fp16 scale (and min) a moderate value of either sign;
    F32/F16/BF16 rows random normal weights."""
    g = np.random.default_rng(seed)
    if kind in ("F32", "F16"):
        return (g.standard_normal((n, k)) * 0.05).astype(np.float32 if kind == "F32" else np.float16).view(np.uint8)
    if kind == "BF16":
        return ((g.standard_normal((n, k)) * 0.05).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(
            np.uint8)
    rows = _rows(kind, n, k, seed)
    elems, size = BLOCK[kind]
    blocks = rows.reshape(n, k // elems, size)
    for at in SCALES[kind]:
        v = g.uniform(0.2, 1.0, (n, k // elems)) * g.choice([-1, 1], (n, k // elems)) * 2e-3
        blocks[:, :, at:at + 2] = v.astype(np.float16).view(np.uint8).reshape(n, k // elems, 2)
    return rows


def _rounded_in_torch(parts: list[tuple[str, np.ndarray, torch.Tensor | None]], k: int) -> torch.Tensor:
    dense = [decode_rows(torch.from_numpy(r if o is None else r[o.numpy()]), kind, k) for kind, r, o in parts]
    return Q.quantize(torch.cat(dense), "int8")


@pytest.mark.parametrize("kind", sorted(DECODABLE))
@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 48])
def test_rounding_once_gives_the_torch_rounding_bytes(kind: str, n: int) -> None:
    k = 512
    part = (kind, _valid_rows(kind, n, k, seed=n), None)
    ours = round_int8([part], k)
    ref = _rounded_in_torch([part], k)
    assert ours is not None and ours.dtype == ref.dtype == torch.int8 and torch.equal(_bytes(ours), _bytes(ref))


def test_a_mixed_q4k_m_projection_rounds_as_torch_does() -> None:
    """q|k|v with v in Q6_K (a Q4_K_M file's layers), q and k in llama.cpp's row order, and a Q5_K part."""
    k = 256
    parts = [("Q4_K", _valid_rows("Q4_K", 48, k, 1), torch.randperm(48, generator=torch.Generator().manual_seed(1))),
             ("Q4_K", _valid_rows("Q4_K", 16, k, 2), torch.arange(16).flip(0)),
             ("Q6_K", _valid_rows("Q6_K", 21, k, 3), None), ("Q5_K", _valid_rows("Q5_K", 7, k, 4), None)]
    ours = round_int8(parts, k)
    assert ours is not None and torch.equal(_bytes(ours), _bytes(_rounded_in_torch(parts, k)))


def test_zero_tiny_and_huge_blocks_round_as_torch_does() -> None:
    k = 128
    w = np.zeros((17, k), dtype=np.float32)
    w[1, :32] = 1e-9  # a scale that rounds to 0 in fp16: the block stays zeros
    w[2, 32:64] = 1e7  # a scale past fp16's range: inf
    w[3] = np.linspace(-1, 1, k)
    w[4, ::7] = -2.5  # ties of w / d
    part = ("F32", w.view(np.uint8), None)
    ours = round_int8([part], k)
    assert ours is not None and torch.equal(_bytes(ours), _bytes(_rounded_in_torch([part], k)))


def test_round_int8_refuses_a_type_it_cannot_decode() -> None:
    rows = np.zeros((16, 110), dtype=np.uint8)
    with pytest.raises(ValueError, match="cannot decode GGUF type Q3_K"):
        round_int8([("Q3_K", rows, None)], 256)
