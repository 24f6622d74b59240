"""`bench kernel-ab`'s inputs: random weights in every packed format the kernel computes, and --shapes."""

from __future__ import annotations

import pytest
import torch

from specdecode.bench import kernel_ab
from specdecode.kernels.quant import load_quant_extension, packed_format


@pytest.mark.parametrize("fmt", kernel_ab.FORMATS)
def test_random_weights_are_packed_in_the_format_and_give_finite_products(fmt: str) -> None:
    k = 512 if fmt in kernel_ab.K_FORMATS else 96
    w = kernel_ab.random_packed(48, k, fmt, torch.Generator().manual_seed(0))
    assert packed_format(w) == fmt
    y = load_quant_extension().quant_linear(torch.randn(3, k), w, None, None)
    assert y.shape == (3, 48) and torch.isfinite(y).all() and y.abs().sum() > 0


def test_shapes_are_parsed_and_bad_ones_refused_by_name() -> None:
    assert kernel_ab.parse_shapes("1600x960, 960X2560") == [(1600, 960), (960, 2560)]
    for bad in ("960", "ax960", "0x960"):
        with pytest.raises(SystemExit, match="--shapes"):
            kernel_ab.parse_shapes(bad)
