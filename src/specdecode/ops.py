"""Dense ops on the decode path, with one switch for the fast small-M CPU kernel.

Every projection in the models goes through ``linear`` so that a faster kernel
(issue: small-M linear on the CPU) can be swapped in for all of them at once.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from .kernels.fused import fused_ops

LinearFn = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor]], torch.Tensor]

_linear_impl: LinearFn = F.linear


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return _linear_impl(x, weight, bias)


def set_linear_impl(fn: Optional[LinearFn]) -> LinearFn:
    """Install a linear implementation (None restores ``F.linear``); returns the previous one."""
    global _linear_impl
    previous = _linear_impl
    _linear_impl = fn if fn is not None else F.linear
    return previous


def linear_impl_name() -> str:
    """Which linear runs now (part of the cost model's cache key: timings differ per kernel)."""
    return "F.linear" if _linear_impl is F.linear else getattr(_linear_impl, "__qualname__", repr(_linear_impl))


def argmax_list(logits: torch.Tensor) -> list[int]:
    """``logits.argmax(-1)`` of a [V] or [R, V] tensor as a flat list of R ints (first maximum, NaN
    counting as the maximum, as torch). The fused CPU op when it is loaded: greedy decoding takes
    one per verified row and draft step, and ATen's costs ~9 µs per 8192-entry row."""
    ext = fused_ops()
    if ext is not None and logits.dtype == torch.float32 and logits.device.type == "cpu" and logits.dim() <= 2:
        rows = logits if logits.dim() == 2 else logits.unsqueeze(0)
        if rows.shape[-1] > 0 and rows.stride(-1) == 1:
            return ext.argmax_rows(rows)
    return logits.argmax(dim=-1).reshape(-1).tolist()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:  # skip the two casts: dispatch time is most of a tiny draft's step
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    # transformers' LlamaRMSNorm arithmetic for narrow dtypes: normalise in fp32, cast, then scale.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)
