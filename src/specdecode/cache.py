"""Static KV cache: preallocated once, written at positions, rolled back by moving a length.

Rollback never copies: ``trim(n)`` only moves the host-side length of a row, and
stale entries past a row's length are never attended (the causal mask admits
key j for a query at position p only if j <= p) and get overwritten by the next
write. Lengths live on the host as plain ints so the decode loop needs no
device sync to know where to write. After a tree pass, ``keep(indices)`` packs
the accepted path's entries to the front of what that pass wrote, copying only
entries that move.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Sequence, cast

import numpy as np
import torch


class ContextLengthError(ValueError):
    """A sequence would exceed the cache (the model's context window)."""


@dataclass
class AttentionMeta:
    """Everything a forward pass needs to know about where its tokens go (and what to record).

    Built once per forward (not per layer). ``slots``, ``positions`` (for RoPE)
    and ``mask`` are made on first use: the fused CPU layer needs none of them,
    and on a small model every tensor op per step is measurable.

    New tokens always go to cache slots ``start .. start + T - 1`` of their row.
    ``tree`` ([B, T, T] or [T, T] bool, as the caller gave it) lets new token i see
    only itself and the new tokens j with ``tree[b, i, j]`` (its draft-tree
    ancestors) besides every key already in the row; None is the ordinary causal
    chain. RoPE/learned positions are ``explicit_positions`` when given, else
    ``start + depth`` under a tree (depth = ancestors), else the slots.
    """

    rows: slice
    starts: list[int]  # per-row write offset
    n_new: int  # T
    kv_len: int  # number of cache slots attention reads
    contiguous: bool  # all rows start at the same offset -> slice write
    arange: torch.Tensor  # the cache's [max_len] position ramp
    tree: Optional[torch.Tensor] = None  # [B, T, T] or [T, T] bool ancestor matrix, or None (causal chain)
    explicit_positions: Optional[torch.Tensor] = None  # [B, T] int64, or None (derived)
    capture: Optional[tuple[int, ...]] = None  # record the final hidden and these layers' residual streams
    hidden: Optional[torch.Tensor] = None  # set by the model when capture is not None
    layer_states: Optional[dict[int, torch.Tensor]] = None  # likewise
    # a fixed-shape pass (``Model.fixed_rows``): the module runs ``fixed`` rows, the T real ones first and
    # padding after; attention reads the cache's whole capacity, and only the real rows are written
    fixed: Optional[int] = None
    # a replayed pass (``models/graphs.py``): all ``fixed`` rows written at these [B, fixed] slots, held in a
    # tensor so that a CUDA graph reads them (positions and mask are then preset as tensors too)
    write_slots: Optional[torch.Tensor] = None

    @cached_property
    def slots(self) -> torch.Tensor:
        """[B, T] int64 cache slots of the new tokens (start + arange(T) per row)."""
        if self.contiguous:
            s = self.starts[0]
            return self.arange[s : s + self.n_new].unsqueeze(0).expand(len(self.starts), self.n_new)
        offs = torch.tensor(self.starts, device=self.arange.device).unsqueeze(1)
        return offs + self.arange[: self.n_new].unsqueeze(0)

    @cached_property
    def write_index(self) -> torch.Tensor:
        """[T] int64 slots of the new tokens when every row starts at the same offset (``contiguous``)."""
        s = self.starts[0]
        return self.arange[s : s + self.n_new]

    @cached_property
    def ancestors(self) -> Optional[torch.Tensor]:
        """[B, T, T] bool: ``tree`` per row with the diagonal set (a token always sees itself, which also
        keeps a padding row's dummy tokens from attending to nothing). The fused path does this in C++."""
        if self.tree is None:
            return None
        t = self.n_new
        return self.tree.expand(len(self.starts), t, t) | torch.eye(t, dtype=torch.bool, device=self.tree.device)

    @cached_property
    def positions(self) -> torch.Tensor:
        """[B, T] int64 positions of the new tokens (RoPE / learned position index); [B, fixed] in a
        fixed-shape pass, the padding rows at position 0."""
        real = self._real_positions()
        if self.fixed is None:
            return real
        return torch.cat([real, real.new_zeros(real.shape[0], self.fixed - self.n_new)], 1)

    def _real_positions(self) -> torch.Tensor:
        if self.explicit_positions is not None:
            return self.explicit_positions
        if self.tree is None:
            return self.slots
        ancestors = self.ancestors
        assert ancestors is not None  # a tree is set
        offs = torch.tensor(self.starts, device=self.arange.device).unsqueeze(1)
        return offs + ancestors.sum(-1) - 1

    @cached_property
    def mask(self) -> Optional[torch.Tensor]:
        """[B, 1, T, kv_len] bool, True = attend; None when a single query attends to everything before it.
        In a fixed-shape pass [B, 1, fixed, capacity]: the real rows as always, the padding rows on key 0."""
        if self.fixed is not None:
            return self._fixed_mask()
        end = self.kv_len
        ancestors = self.ancestors
        if ancestors is not None:  # a tree
            b, t = len(self.starts), self.n_new
            offs = torch.tensor(self.starts, device=self.arange.device).view(b, 1, 1)
            mask = (self.arange[:end].view(1, 1, end) < offs).expand(b, t, end).clone()  # the row's prefix
            mask.scatter_(2, self.slots.unsqueeze(1).expand(b, t, t), ancestors)  # plus ancestors and self
            return mask.unsqueeze(1)
        if self.n_new == 1 and self.contiguous:
            return None
        return self.arange[:end].view(1, 1, 1, end) <= self.slots.view(len(self.starts), 1, self.n_new, 1)

    def _fixed_mask(self) -> torch.Tensor:
        assert self.fixed is not None
        b, t, cap = len(self.starts), self.n_new, self.arange.numel()
        keys = self.arange.view(1, 1, cap)
        ancestors = self.ancestors
        if ancestors is None:
            real = keys <= self.slots.view(b, t, 1)
        else:
            offs = torch.tensor(self.starts, device=self.arange.device).view(b, 1, 1)
            real = (keys < offs).expand(b, t, cap).clone()
            real.scatter_(2, self.slots.unsqueeze(1).expand(b, t, t), ancestors)
        return torch.cat([real, (keys == 0).expand(b, self.fixed - t, cap)], 1).unsqueeze(1)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Zeros that cost nothing until written, on the CPU: an anonymous ``mmap``, whose pages the OS zeroes
    on first touch. Why: a server's cache for 16 rows of SmolLM2's 8,192 tokens is 3 GB, and
    ``torch.zeros`` wrote all of it before the first request (9.7 s of a 15 s start) though a row only
    touches what it fills. In 4 KB pages (``MADV_NOHUGEPAGE``): ``numpy.zeros`` asks for huge pages, and
    a row's first prefill then zeroed a 2 MB page for each layer's keys and values of each head it
    wrote, 0.5-0.6 s (in a VM) of every row's first request; decoding at 2k-4k tokens of context was as
    fast either way, within this machine's noise. Page-aligned, so 64-byte aligned as torch's own
    allocations."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux; elsewhere the OS's default pages
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.from_numpy(np.frombuffer(buf, dtype=np.uint8)).view(dtype).view(shape)


class KVCache:
    """Keys and values for every layer: ``[layers, batch, kv_heads, max_len, head_dim]``.

    ``dtype`` is the storage dtype, which may be narrower than the model's compute dtype (an fp16
    cache under fp32 activations: half the bytes a long-context decode step streams). A write
    rounds the new keys/values once to it; the fused CPU attention widens them on load, and
    ``update`` hands the eager layer views widened to the compute dtype."""

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        storage: Optional[torch.Tensor] = None,
    ) -> None:
        """``storage``: the [2, layers, batch, kv_heads, max_len, head_dim] tensor to hold keys and values in (one
        lent by a pool, ``models/graphs.py``), else new lazy zeros."""
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        # keys and values in one allocation, each half contiguous: a layer's pair view lets the eager pass
        # write both in one op (``write_pair``)
        if storage is not None and (tuple(storage.shape) != (2, *shape) or storage.dtype != dtype):
            raise ValueError(f"cache storage must be {(2, *shape)} {dtype}, got {tuple(storage.shape)} {storage.dtype}")
        kv = lazy_zeros((2, *shape), dtype, device) if storage is None else storage
        self.storage: Optional[torch.Tensor] = kv  # None for a layer view (``over_layers``)
        self.k, self.v = kv[0], kv[1]
        # per-layer views made once: indexing self.k[layer] every layer of every step costs dispatch time
        self._k_layers = list(self.k.unbind(0))
        self._v_layers = list(self.v.unbind(0))
        self._kv_layers: Optional[list[torch.Tensor]] = list(kv.unbind(1))  # [2, batch, kv_heads, max_len, hd]
        self.max_len = max_len
        self.batch_size = batch_size
        self.lengths: list[int] = [0] * batch_size
        # where each row's last forward wrote (start, count): what ``keep`` compacts
        self.last_start: list[int] = [0] * batch_size
        self.last_count: list[int] = [0] * batch_size
        self.device = torch.device(device)
        self.dtype = dtype
        self._arange = torch.arange(max_len, device=device)

    @classmethod
    def over_layers(cls, k_layers: Sequence[Optional[torch.Tensor]], v_layers: Sequence[Optional[torch.Tensor]]
                    ) -> "KVCache":
        """A cache whose layer i is the given ``[batch, kv_heads, max_len, head_dim]`` tensors (views
        of other caches, shared, not copied; None for a layer nothing runs), with lengths of its own.

        Why: a layer-skip draft runs the target's first layers exactly as the target does, so it
        attends over the target's own entries for them and keeps its own only for the layers that
        differ (``drafters/layerskip.py``). ``move_row`` and ``keep`` need whole tensors and are
        not available on such a view."""
        first = next(t for t in k_layers if t is not None)
        self = cls.__new__(cls)
        self.k = self.v = None  # type: ignore[assignment]
        self._kv_layers = None
        self.storage = None
        # None stands only at layers nothing runs, so nothing reads them through k_layer/v_layer
        self._k_layers = cast(list[torch.Tensor], list(k_layers))
        self._v_layers = cast(list[torch.Tensor], list(v_layers))
        self.batch_size, self.max_len = first.shape[0], first.shape[2]
        self.lengths = [0] * self.batch_size
        self.last_start, self.last_count = [0] * self.batch_size, [0] * self.batch_size
        self.device, self.dtype = first.device, first.dtype
        self._arange = torch.arange(self.max_len, device=first.device)
        return self

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

    def repeat_to(self, length: int, row: int = 0) -> None:
        """Grow ``row`` to ``length`` entries by repeating its written ones in order. Why: a cost measurement's
        pass attends over every entry whatever it holds, and computing them all was most of a cold start's
        measurement (``sizing/measure_context.py``)."""
        if self.k is None:
            raise TypeError("a layer view (KVCache.over_layers) cannot grow rows; grow the caches it views")
        n = self.lengths[row]
        if n == 0 or not n <= length <= self.max_len:
            raise ValueError(f"cannot repeat row {row}'s {n} entries to {length} (room for {self.max_len})")
        for start in range(n, length, n):
            m = min(n, length - start)
            self.k[:, row, :, start:start + m] = self.k[:, row, :, :m]
            self.v[:, row, :, start:start + m] = self.v[:, row, :, :m]
        self.lengths[row] = length

    def move_row(self, src: int, dst: int) -> None:
        """Copy row ``src``'s live keys/values into row ``dst`` and empty ``src`` (the decode core
        keeps its running rows a contiguous slice)."""
        if self.k is None:
            raise TypeError("a layer view (KVCache.over_layers) cannot move rows; move the caches it views")
        n = self.lengths[src]
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.lengths[dst] = n
        self.last_start[dst], self.last_count[dst] = self.last_start[src], self.last_count[src]
        self.reset(src)

    def reset(self, row: Optional[int] = None) -> None:
        if row is None:
            self.lengths = [0] * self.batch_size
            self.last_start, self.last_count = [0] * self.batch_size, [0] * self.batch_size
        else:
            self.lengths[row] = self.last_start[row] = self.last_count[row] = 0

    def prepare(self, n_new: int, rows: Optional[slice] = None, positions: Optional[torch.Tensor] = None,
                tree_mask: Optional[torch.Tensor] = None) -> AttentionMeta:
        """Plan a forward that appends ``n_new`` tokens to each row in ``rows``.

        ``tree_mask`` ([B, T, T] or [T, T] bool, ``[b, i, j]`` True iff new token j is i or an ancestor
        of i) and ``positions`` ([B, T] int64) are as in ``Model.run``; see ``AttentionMeta``."""
        rows = rows if rows is not None else slice(0, self.batch_size)
        starts = self.lengths[rows]
        end = max(starts) + n_new
        if end > self.max_len:
            raise ContextLengthError(
                f"sequence of {end} tokens exceeds the context window of {self.max_len}; "
                "use a shorter prompt or fewer new tokens"
            )
        contiguous = all(s == starts[0] for s in starts)
        meta = AttentionMeta(rows, list(starts), n_new, end, contiguous, self._arange)
        if tree_mask is not None or positions is not None:
            self._plan_tree(meta, positions, tree_mask)
        return meta

    def _plan_tree(self, meta: AttentionMeta, positions: Optional[torch.Tensor],
                   tree_mask: Optional[torch.Tensor]) -> None:
        b, t = len(meta.starts), meta.n_new
        if positions is not None:
            if positions.shape != (b, t):
                raise ValueError(f"positions must be [{b}, {t}] (rows x new tokens), got {tuple(positions.shape)}")
            meta.explicit_positions = positions.to(device=self.device, dtype=torch.int64)
        if tree_mask is None or t == 1:  # one new token: its only "ancestor" is itself, the causal case
            return
        if tree_mask.shape not in ((b, t, t), (t, t)):
            raise ValueError(f"tree_mask must be [{b}, {t}, {t}] or [{t}, {t}], got {tuple(tree_mask.shape)}")
        if tree_mask.dtype != torch.bool or tree_mask.device != self.device:
            tree_mask = tree_mask.to(device=self.device, dtype=torch.bool)
        meta.tree = tree_mask  # as given: the fused path reads it directly (see AttentionMeta.ancestors)

    def commit(self, meta: AttentionMeta) -> None:
        """Advance the lengths of the rows a forward wrote."""
        for i, r in enumerate(range(*meta.rows.indices(self.batch_size))):
            self.lengths[r] = meta.starts[i] + meta.n_new
            self.last_start[r] = meta.starts[i]
            self.last_count[r] = meta.n_new

    def keep(self, indices: Sequence[int], row: int = 0) -> int:
        """Keep only the entries at ``indices`` (strictly increasing offsets into what the row's last
        forward wrote, e.g. a tree's accepted path) packed in order from that forward's start; the
        others are dropped. Returns the new length. Only entries that move are copied (a prefix of the
        written tokens costs nothing, as ``trim``), on every layer, K and V."""
        if self.k is None:
            raise TypeError("a layer view (KVCache.over_layers) cannot keep entries; use the caches it views")
        start, count = self.last_start[row], self.last_count[row]
        if self.lengths[row] < start:
            raise ValueError(f"row {row} was trimmed below the start ({start}) of its last forward")
        prev = -1
        for i in indices:
            if not prev < i < count:
                raise ValueError(f"keep indices must be strictly increasing offsets below {count} "
                                 f"(the tokens of row {row}'s last forward), got {list(indices)}")
            prev = i
        moved = [(start + d, start + i) for d, i in enumerate(indices) if i != d]
        if moved:
            dst = torch.tensor([m[0] for m in moved], device=self.device)
            src = torch.tensor([m[1] for m in moved], device=self.device)
            for cache in (self.k, self.v):
                rows = cache[:, row]  # [layers, kv_heads, max_len, head_dim], a view
                rows.index_copy_(2, dst, rows.index_select(2, src))
        self.lengths[row] = start + len(indices)
        self.last_count[row] = len(indices)
        return self.lengths[row]

    def write_pair(self, layer: int, kv: torch.Tensor, meta: AttentionMeta) -> bool:
        """Write the real rows' new keys and values, ``kv`` = [2, B, kv_heads, n_new, D] (keys then values), in one
        ``index_copy_``; False (nothing written) where that does not apply: a layer view, rows at different
        offsets, a replayed pass, or another dtype. Why: the eager pass's operators are a GPU step's launches
        (``models/eager_pass.py``)."""
        if self._kv_layers is None or not meta.contiguous or meta.write_slots is not None or kv.dtype != self.dtype:
            return False
        pair = self._kv_layers[layer]
        if meta.rows != slice(0, self.batch_size):
            pair = pair[:, meta.rows]
        pair.index_copy_(3, meta.write_index, kv)
        return True

    def views(self, layer: int, meta: AttentionMeta, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The live keys and values to attend over, in ``dtype`` (copies widened from the storage dtype when that
        is narrower: the attention then reads exactly what a later step will read, the values as stored)."""
        kc, vc = self._k_layers[layer], self._v_layers[layer]
        if meta.rows != slice(0, self.batch_size):
            kc, vc = kc[meta.rows], vc[meta.rows]
        end = self.max_len if meta.fixed is not None else meta.kv_len  # fixed: the whole capacity (one shape)
        if end != self.max_len:
            kc, vc = kc[:, :, :end], vc[:, :, :end]
        if kc.dtype != dtype:
            return kc.to(dtype), vc.to(dtype)
        return kc, vc

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, meta: AttentionMeta
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write new keys/values ``[B, H, T, D]`` and return the live cache views to attend over (``views``)."""
        kc, vc = self._k_layers[layer], self._v_layers[layer]
        if meta.rows != slice(0, self.batch_size):
            kc, vc = kc[meta.rows], vc[meta.rows]
        if meta.write_slots is not None:  # every row, padding too (beyond the live length: masked, rewritten later)
            b_idx = torch.arange(k.shape[0], device=k.device).unsqueeze(1).expand_as(meta.write_slots)
            kc[b_idx, :, meta.write_slots] = k.transpose(1, 2).to(kc.dtype)
            vc[b_idx, :, meta.write_slots] = v.transpose(1, 2).to(vc.dtype)
        else:
            if meta.fixed is not None:  # only the real rows
                k, v = k[:, :, : meta.n_new], v[:, :, : meta.n_new]
            if meta.contiguous:
                s = meta.starts[0]
                kc[:, :, s : s + meta.n_new] = k
                vc[:, :, s : s + meta.n_new] = v
            else:
                b_idx = torch.arange(k.shape[0], device=k.device).unsqueeze(1).expand_as(meta.slots)
                kc[b_idx, :, meta.slots] = k.transpose(1, 2).to(kc.dtype)  # index_put does not convert
                vc[b_idx, :, meta.slots] = v.transpose(1, 2).to(vc.dtype)
        return self.views(layer, meta, k.dtype)
