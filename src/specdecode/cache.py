"""Static KV cache: preallocated once, written at positions, rolled back by moving a length.

Rollback never copies: ``trim(n)`` only moves the host-side length of a row, and
stale entries past a row's length are never attended (the causal mask admits
key j for a query at position p only if j <= p) and get overwritten by the next
write. Lengths live on the host as plain ints so the decode loop needs no
device sync to know where to write.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import torch


class ContextLengthError(ValueError):
    """A sequence would exceed the cache (the model's context window)."""


@dataclass
class AttentionMeta:
    """Everything a forward pass needs to know about where its tokens go.

    Built once per forward (not per layer). ``positions`` (for RoPE) and
    ``mask`` are made on first use: the fused CPU layer needs neither, and on a
    small model every tensor op per step is measurable.
    """

    rows: slice
    starts: list[int]  # per-row write offset
    n_new: int  # T
    kv_len: int  # number of cache slots attention reads
    contiguous: bool  # all rows start at the same offset -> slice write
    arange: torch.Tensor  # the cache's [max_len] position ramp

    @cached_property
    def positions(self) -> torch.Tensor:
        """[B, T] int64 positions of the new tokens."""
        if self.contiguous:
            s = self.starts[0]
            return self.arange[s : s + self.n_new].unsqueeze(0).expand(len(self.starts), self.n_new)
        offs = torch.tensor(self.starts, device=self.arange.device).unsqueeze(1)
        return offs + self.arange[: self.n_new].unsqueeze(0)

    @cached_property
    def mask(self) -> Optional[torch.Tensor]:
        """[B, 1, T, kv_len] bool, True = attend; None when a single query attends to everything before it."""
        if self.n_new == 1 and self.contiguous:
            return None
        end = self.kv_len
        return self.arange[:end].view(1, 1, 1, end) <= self.positions.view(len(self.starts), 1, self.n_new, 1)


class KVCache:
    """Keys and values for every layer: ``[layers, batch, kv_heads, max_len, head_dim]``."""

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # per-layer views made once: indexing self.k[layer] every layer of every step costs dispatch time
        self._k_layers = list(self.k.unbind(0))
        self._v_layers = list(self.v.unbind(0))
        self.max_len = max_len
        self.batch_size = batch_size
        self.lengths: list[int] = [0] * batch_size
        self.device = torch.device(device)
        self._arange = torch.arange(max_len, device=device)

    def k_layer(self, layer: int) -> torch.Tensor:
        """Keys of one layer, ``[batch, kv_heads, max_len, head_dim]`` (a view, written in place)."""
        return self._k_layers[layer]

    def v_layer(self, layer: int) -> torch.Tensor:
        return self._v_layers[layer]

    def k_layers(self) -> list[torch.Tensor]:
        """Every layer's key view, in order (the list itself; do not modify)."""
        return self._k_layers

    def v_layers(self) -> list[torch.Tensor]:
        return self._v_layers

    def length(self, row: int = 0) -> int:
        return self.lengths[row]

    def trim(self, n: int, row: int = 0) -> int:
        """Forget the last ``n`` tokens of ``row``; returns the new length."""
        if n < 0 or n > self.lengths[row]:
            raise ValueError(f"cannot trim {n} tokens from a row holding {self.lengths[row]}")
        self.lengths[row] -= n
        return self.lengths[row]

    def set_length(self, length: int, row: int = 0) -> None:
        if length < 0 or length > self.lengths[row]:
            raise ValueError(f"set_length({length}) would grow row {row} beyond its {self.lengths[row]} written tokens")
        self.lengths[row] = length

    def reset(self, row: Optional[int] = None) -> None:
        if row is None:
            self.lengths = [0] * self.batch_size
        else:
            self.lengths[row] = 0

    def prepare(self, n_new: int, rows: Optional[slice] = None) -> AttentionMeta:
        """Plan a forward that appends ``n_new`` tokens to each row in ``rows``."""
        rows = rows if rows is not None else slice(0, self.batch_size)
        starts = self.lengths[rows]
        end = max(starts) + n_new
        if end > self.max_len:
            raise ContextLengthError(
                f"sequence of {end} tokens exceeds the context window of {self.max_len}; "
                "use a shorter prompt or fewer new tokens"
            )
        contiguous = all(s == starts[0] for s in starts)
        return AttentionMeta(rows, list(starts), n_new, end, contiguous, self._arange)

    def commit(self, meta: AttentionMeta) -> None:
        """Advance the lengths of the rows a forward wrote."""
        for i, r in enumerate(range(*meta.rows.indices(self.batch_size))):
            self.lengths[r] = meta.starts[i] + meta.n_new

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, meta: AttentionMeta) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new keys/values ``[B, H, T, D]`` and return the live cache views to attend over."""
        kc, vc = self._k_layers[layer], self._v_layers[layer]
        if meta.rows != slice(0, self.batch_size):
            kc, vc = kc[meta.rows], vc[meta.rows]
        if meta.contiguous:
            s = meta.starts[0]
            kc[:, :, s : s + meta.n_new] = k
            vc[:, :, s : s + meta.n_new] = v
        else:
            b_idx = torch.arange(k.shape[0], device=k.device).unsqueeze(1).expand_as(meta.positions)
            kc[b_idx, :, meta.positions] = k.transpose(1, 2)
            vc[b_idx, :, meta.positions] = v.transpose(1, 2)
        return kc[:, :, : meta.kv_len], vc[:, :, : meta.kv_len]
