"""The KV cache's storage is zeros that cost nothing until written (a 3 GB server cache used to be written
in full before the first request)."""

from __future__ import annotations

import os

import pytest
import torch

from specdecode.cache import KVCache, lazy_zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lazy_zeros_are_aligned_writable_zeros(dtype: torch.dtype) -> None:
    z = lazy_zeros((3, 5, 7), dtype, "cpu")
    assert z.shape == (3, 5, 7) and z.dtype == dtype and z.is_contiguous() and z.data_ptr() % 64 == 0
    assert not z.any()
    z[1, 2, 3] = 1.5
    assert float(z.sum()) == 1.5 and int(z.count_nonzero()) == 1


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc (Linux)")
def test_a_server_sized_cache_takes_memory_only_where_written() -> None:
    before = _resident_bytes()
    cache = KVCache(30, 16, 3, 8192, 64, torch.float16, "cpu")  # 3 GB: SmolLM2, 16 rows of 8k tokens
    assert _resident_bytes() - before < 256 << 20  # torch.zeros wrote (and kept resident) all 3 GB
    assert not cache.k[7, 9, 1, 4000:4100].any() and not cache.v[-1, -1, -1].any()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc (Linux)")
def test_a_rows_first_prefill_touches_small_pages_not_huge_ones() -> None:
    """A 45-token prefill writes each layer's keys and values of each head: 180 short runs 1 MB apart.
    In huge pages (``numpy.zeros`` asks for them) each run zeroed a 2 MB page: 240 MB and 0.5 s of the
    first request of every row."""
    cache = KVCache(30, 16, 3, 8192, 64, torch.float16, "cpu")
    before = _resident_bytes()
    cache.k[:, 0, :, :45] = 1.0
    cache.v[:, 0, :, :45] = 1.0
    assert _resident_bytes() - before < 32 << 20  # 4 KB pages: ~1.5 MB
