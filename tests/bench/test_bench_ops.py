"""`specdecode bench ops`: operators per plain decode step on the eager path, counted by difference."""

from __future__ import annotations

from pathlib import Path

import specdecode as sd
from specdecode.bench import ops


def test_counts_scale_with_layers_and_cancel_the_set_up(tiny_dirs: dict[str, Path]) -> None:
    target = sd.load_model(tiny_dirs["llama"], fast=False)
    got = ops.per_step(target, 4)
    layers = target.config.n_layers
    # every layer runs its projections each step: at least 4 products a layer (qkv, o, gate|up, down)
    assert got["gemm_per_step"] >= 4 * layers and got["aten_per_step"] > got["gemm_per_step"]
    assert got["host_ms_per_step"] > 0
    again = ops.per_step(target, 8)  # the prompt's prefill and set-up cancel: the same count per step
    assert abs(again["aten_per_step"] - got["aten_per_step"]) <= 0.05 * got["aten_per_step"]
