"""Small dense ops on the decode path that do not depend on a model's choice of kernels.

The projections are not here: each model runs them with its own ``Kernels``
(``specdecode.kernels``), chosen when it is loaded.
"""

from __future__ import annotations

import torch

from .kernels.fused import loaded_fused_extension


def argmax_list(logits: torch.Tensor) -> list[int]:
    """``logits.argmax(-1)`` of a [V] or [R, V] tensor as a flat list of R ints (first maximum, NaN
    counting as the maximum, as torch). The fused CPU op when it is loaded: greedy decoding takes
    one per verified row and draft step, and ATen's costs ~9 µs per 8192-entry row."""
    ext = loaded_fused_extension()
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
