"""A GGUF file's weights kept on disk in the kernels' layout, mapped at the next start instead of repacked.

Why: our kernels read 16-row interleaved layouts, so every start moved the whole file into fresh memory.
Most of that start was not the moving but the fresh memory itself: the kernel zeroes every new page before
handing it over (a 1.7 GB Q8_0 file: 52% of a 3 s load in ``clear_page``, under KVM). llama.cpp maps its file
and computes in place; mapping a file of our own layout does the same for us: the pages come from the page
cache, already filled, and are shared by every process that maps them (the kernels run as fast on them:
measured equal to anonymous memory).

A cache file belongs to one GGUF file as it is (path, size, date, inode and a sample of its bytes), one
weight format, and this code's packing (``PACK_FORMAT`` and a hash of the packers' sources), so a changed
file or a changed packer never maps stale bytes; it is written to a temporary name and renamed whole. Files
whose GGUF is gone or changed are removed when a new one is written. The cache lives under
``$SPECDECODE_CACHE/packed`` (``~/.cache/specdecode``); ``--no-pack-cache`` (``load_model(pack_cache=False)``)
neither reads nor writes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import shutil
import struct
from functools import lru_cache
from pathlib import Path
from typing import Optional

import torch

PACK_FORMAT = 1  # bump when the layout of this file (not of the kernels: their sources are hashed) changes
ALIGN = 4096  # each tensor starts on a page: the kernels read 64-byte lines, and pages map independently
SAMPLES = 16  # spread-out 4 KiB reads of the GGUF that go into its fingerprint (a rewrite changes them)
HEADROOM = 1 << 30  # free disk a write must leave
POPULATE_READ = 22  # MADV_POPULATE_READ, absent from older headers and Python's mmap module
_MAGIC = b"SDPACK01"
_PACKERS = ("kernels/repack.cpp", "kernels/quant.py", "kernels/quant_q4k.py", "kernels/quant_q5k.py",
            "kernels/quant_b32.py", "models/gguf.py", "models/pack_cache.py")
log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDECODE_CACHE", Path.home() / ".cache" / "specdecode")) / "packed"


@lru_cache(maxsize=1)
def _packers_hash() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for rel in _PACKERS:
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:16]


def fingerprint(gguf: Path) -> str:
    """What identifies the GGUF file as it is now: where it is, its size, date and inode, and a sample of
    its bytes (a file rewritten within one timestamp tick still differs in them)."""
    st = gguf.stat()
    h = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}".encode())
    with gguf.open("rb") as f:
        for i in range(SAMPLES):
            f.seek(st.st_size * i // SAMPLES)
            h.update(f.read(4096))
    return h.hexdigest()[:24]


def cache_path(gguf: Path, fmt: str) -> Path:
    key = hashlib.sha256(f"{fingerprint(gguf)}|{fmt}|{PACK_FORMAT}|{_packers_hash()}|{torch.__version__}".encode())
    return cache_dir() / f"{gguf.stem[:48]}-{fmt}-{key.hexdigest()[:20]}.pack"


def _read_index(path: Path) -> dict:
    """A cache file's header: its GGUF, format and tensors (name -> dtype, shape, byte offset)."""
    with path.open("rb") as f:
        head = f.read(16)
        if len(head) < 16 or head[:8] != _MAGIC:
            raise ValueError("not a pack file")
        (n,) = struct.unpack("<Q", head[8:])
        index = json.loads(f.read(n))
    if not isinstance(index, dict) or not {"source", "fmt", "tensors"} <= index.keys():
        raise ValueError("no index")
    return index


class PackedFile:
    """A cache file mapped (copy on write: a tensor written to stays private to this process)."""

    def __init__(self, path: Path) -> None:
        index = _read_index(path)
        with path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self.source: str = index["source"]
        self.fmt: str = index["fmt"]
        self._tensors: dict[str, tuple[str, list[int], int]] = index["tensors"]
        end = max((o + _nbytes(d, s) for d, s, o in self._tensors.values()), default=0)
        if end > len(self._map):
            raise ValueError(f"truncated: {len(self._map)} bytes, {end} indexed")
        try:  # map every page now, in one call (Linux 5.14+): the first pass would fault them in 64 KiB at a time
            self._map.madvise(POPULATE_READ)
        except (OSError, ValueError):
            pass

    def names(self) -> set[str]:
        return set(self._tensors)

    def get(self, name: str) -> torch.Tensor:
        dtype, shape, offset = self._tensors[name]
        count = 1
        for s in shape:
            count *= s
        if count == 0:
            return torch.empty(shape, dtype=_DTYPES[dtype])
        return torch.frombuffer(self._map, dtype=_DTYPES[dtype], count=count, offset=offset).view(shape)


# every dtype a packed weight is marked by (kernels/quant.py packed_dtype) and a dense one may have
_DTYPES = {str(t).removeprefix("torch."): t for t in (torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32,
                                                      torch.uint32, torch.int64, torch.uint64, torch.float16,
                                                      torch.float32, torch.bfloat16)}


def _nbytes(dtype: str, shape: list[int]) -> int:
    n = _DTYPES[dtype].itemsize
    for s in shape:
        n *= s
    return n


def open_cached(gguf: Path, fmt: str) -> Optional[PackedFile]:
    """The GGUF's weights as ``fmt`` from the cache, or None (none yet, or unreadable: then rebuilt)."""
    path = cache_path(gguf, fmt)
    if not path.is_file():
        return None
    try:
        return PackedFile(path)
    except (OSError, ValueError, KeyError) as e:
        log.warning("ignoring the packed-weights cache %s (%r); it is rebuilt", path, e)
        return None


def write_cache(gguf: Path, fmt: str, tensors: dict[str, torch.Tensor]) -> Optional[Path]:
    """Keep ``tensors`` (every packed one of the GGUF as ``fmt``) for the next start; None where the disk
    lacks room or cannot be written (a read-only home): the model runs as packed, only the next start repacks."""
    path = cache_path(gguf, fmt)
    total = sum(t.numel() * t.element_size() + ALIGN for t in tensors.values())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _forget_stale(path.parent)
        if shutil.disk_usage(path.parent).free < total + HEADROOM:
            log.info("not caching the packed weights: %s has under %.1f GB free", path.parent,
                     (total + HEADROOM) / 1e9)
            return None
        index: dict[str, tuple[str, list[int], int]] = {}
        offset = 0
        for name, t in tensors.items():
            index[name] = (str(t.dtype).removeprefix("torch."), list(t.shape), offset)
            offset += -(-(t.numel() * t.element_size()) // ALIGN) * ALIGN
        # the header's length bounds where the data starts; offsets shifted by it add at most 12 digits each
        bound = 16 + len(json.dumps({"source": str(gguf.resolve()), "fmt": fmt, "tensors": index})) + 12 * len(index)
        start = -(-bound // ALIGN) * ALIGN
        index = {n: (d, s, o + start) for n, (d, s, o) in index.items()}
        head = json.dumps({"source": str(gguf.resolve()), "fmt": fmt, "tensors": index}).encode().ljust(start - 16)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with tmp.open("wb") as f:
            f.write(_MAGIC + struct.pack("<Q", len(head)) + head)
            for name, t in tensors.items():
                f.seek(index[name][2])
                f.write(t.contiguous().view(torch.uint8).numpy().data)
            f.truncate(start + offset)
        os.replace(tmp, path)
        return path
    except OSError as e:
        log.info("not caching the packed weights in %s: %s", path.parent, e)
        return None


def forget(gguf: Path) -> int:
    """Remove the cache files of ``gguf`` (every format): its next load packs it again. The count removed."""
    n = 0
    for p in cache_dir().glob("*.pack"):
        try:
            if Path(_read_index(p)["source"]) == gguf.resolve():
                p.unlink(missing_ok=True)
                n += 1
        except (OSError, ValueError, KeyError):
            continue
    return n


def _forget_stale(folder: Path) -> None:
    """Remove cache files whose GGUF is gone or has changed, and temporary files of writes that died."""
    for p in folder.glob("*.pack"):
        try:
            index = _read_index(p)
            src = Path(index["source"])
            stale = not src.is_file() or cache_path(src, index["fmt"]) != p
        except (OSError, ValueError, KeyError):
            stale = True
        if stale:
            p.unlink(missing_ok=True)
    for p in folder.glob("*.tmp*"):
        try:
            int(p.suffix.removeprefix(".tmp"))
            if not Path(f"/proc/{p.suffix.removeprefix('.tmp')}").exists():
                p.unlink(missing_ok=True)
        except ValueError:
            continue
