"""Replay a model's fixed-shape decode passes as CUDA graphs.

Why: on a GPU our eager decode step launches ~1,300 kernels for SmolLM2's 30 layers, so a step costs launch
and Python time (23 tok/s on an H200, ``docs/gpu.md``), not the model's. A fixed-shape pass
(``Model.fixed_rows``) has the same tensor shapes every step, which is what a CUDA graph needs: capture the
module's forward once per (cache, rows, layers, head, captured states) and then replay it with the step's
tokens, positions, mask and cache slots copied into static input tensors.

A replayed pass computes what the eager fixed-shape pass computes, with the same ops at the same shapes,
except that it writes the padding rows' keys and values too, at the slots after the real ones: beyond the
live length, masked, rewritten before any query reads them. So both can serve one request, and a pass too
near the cache's end to hold the padding runs eagerly. ``capture=False`` runs the same body without a graph
(how the CPU tests check it).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..cache import AttentionMeta, KVCache


@dataclass
class _Pass:
    """One captured pass: its static inputs, the meta the module reads them through, and its outputs."""

    tokens: torch.Tensor  # [B, F]
    positions: torch.Tensor  # [B, F]
    mask: torch.Tensor  # [B, 1, F, capacity]
    slots: torch.Tensor  # [B, F]
    meta: AttentionMeta
    logits: Optional[torch.Tensor] = None
    graph: Any = None  # torch.cuda.CUDAGraph, None when not capturing
    held: tuple = ()  # the cache storage and head the graph reads: kept alive, so that the key stays theirs


class PassGraphs:
    """The captured passes of one model (at most ``limit``, least recently used dropped)."""

    def __init__(self, capture: bool = True, limit: int = 16) -> None:
        self.capture = capture
        self.limit = limit
        self._passes: OrderedDict[tuple, _Pass] = OrderedDict()
        self._pool: Any = None
        self._free: dict[tuple, list[torch.Tensor]] = {}  # cache storage no cache holds, by shape, dtype, device

    def lend_cache(self, make: Callable[[Optional[torch.Tensor]], KVCache], shape: tuple[int, ...],
                   dtype: torch.dtype, device: torch.device) -> KVCache:
        """A new cache (``make(storage)``) on storage an earlier cache of this shape let go of (zeroed), else on
        new storage; the storage comes back here when the cache is collected. Why: a captured pass is keyed by
        its cache's storage, so the next request's cache replays the graphs the last one captured, where a new
        allocation each ``generate`` captured every pass anew (and kept the old caches alive for the graphs)."""
        free = self._free.setdefault((shape, dtype, str(device)), [])
        storage = free.pop().zero_() if free else None  # stale keys are masked, but 0 · NaN would not be
        cache = make(storage)
        assert cache.storage is not None
        weakref.finalize(cache, free.append, cache.storage)
        return cache

    def run(self, module: nn.Module, tokens: torch.Tensor, meta: AttentionMeta, cache: KVCache,
            head: Optional[torch.Tensor], layers: Optional[tuple[int, ...]]) -> Optional[torch.Tensor]:
        """The [B, F, V] logits of the padded ``tokens`` (``meta.fixed`` = F), replayed; meta.hidden and
        meta.layer_states set as the eager pass sets them. None when the padding would not fit in the cache:
        the caller runs the pass eagerly."""
        b, f = tokens.shape
        if max(meta.starts) + f > cache.max_len:
            return None
        where = cache.storage.data_ptr() if cache.storage is not None else id(cache)  # storage outlives a cache
        key = (where, meta.rows.start, meta.rows.stop, f, layers, None if head is None else id(head), meta.capture)
        p = self._passes.get(key)
        if p is None:
            p = self._new(module, tokens, meta, cache, head, layers)
            self._passes[key] = p
            if len(self._passes) > self.limit:
                self._passes.popitem(last=False)
        else:
            self._passes.move_to_end(key)
        self._fill(p, tokens, meta)
        if p.graph is not None:
            p.graph.replay()
        else:
            self._body(module, p, cache, head, layers)
        meta.hidden = None if p.meta.hidden is None else p.meta.hidden.clone()
        meta.layer_states = {i: h.clone() for i, h in (p.meta.layer_states or {}).items()}
        assert p.logits is not None
        return p.logits.clone()  # the next replay overwrites the graph's own

    @staticmethod
    def _fill(p: _Pass, tokens: torch.Tensor, meta: AttentionMeta) -> None:
        p.tokens.copy_(tokens)
        p.positions.copy_(meta.positions)
        p.mask.copy_(meta.mask)  # type: ignore[arg-type]  # a fixed pass always has one
        starts = torch.tensor(meta.starts, device=tokens.device).unsqueeze(1)
        p.slots.copy_(starts + torch.arange(tokens.shape[1], device=tokens.device))

    @staticmethod
    def _body(module: nn.Module, p: _Pass, cache: KVCache, head: Optional[torch.Tensor],
              layers: Optional[tuple[int, ...]]) -> None:
        if layers is None:
            p.logits = module(p.tokens, p.meta, cache, head=head)
        else:
            p.logits = module(p.tokens, p.meta, cache, head=head, layers=layers)

    def _new(self, module: nn.Module, tokens: torch.Tensor, meta: AttentionMeta, cache: KVCache,
             head: Optional[torch.Tensor], layers: Optional[tuple[int, ...]]) -> _Pass:
        """Static inputs shaped as this pass's, then (on CUDA) a warm-up on a side stream and the capture."""
        mask = meta.mask
        assert mask is not None
        slots = torch.zeros_like(tokens)
        graph_meta = replace(meta, write_slots=slots, hidden=None, layer_states=None)
        p = _Pass(torch.zeros_like(tokens), torch.zeros_like(meta.positions), torch.zeros_like(mask), slots, graph_meta,
                  held=(cache if cache.storage is None else cache.storage, head))
        # the module reads positions and mask through the meta's cached properties: preset them to the inputs
        vars(graph_meta)["positions"], vars(graph_meta)["mask"] = p.positions, p.mask
        if not self.capture:
            return p
        self._fill(p, tokens, meta)  # the warm-up writes this pass's own keys and values: the replay rewrites them
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._body(module, p, cache, head, layers)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        p.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(p.graph, pool=self._pool):
            self._body(module, p, cache, head, layers)
        return p
