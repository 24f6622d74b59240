"""A GGUF file's weights kept on disk in the kernels' layout, mapped at the next start instead of repacked.

Why: our kernels read 16-row interleaved layouts, so every start moved the whole file into fresh memory.
Most of that start was not the moving but the fresh memory itself: the kernel zeroes every new page before
handing it over (a 1.7 GB Q8_0 file: 52% of a 3 s load in ``clear_page``, under KVM). llama.cpp maps its file
and computes in place; mapping a file of our own layout does the same for us: the pages come from the page
cache, already filled, and are shared by every process that maps them (the kernels run as fast on them:
measured equal to anonymous memory).

A cache file belongs to one GGUF file as it is (path, size, date, inode and a sample of its bytes), one
weight format, and this code's packing (``PACK_FORMAT`` and a hash of the packers' sources), so a changed
file or a changed packer never maps stale bytes. The first start writes it as it packs (``CacheWriter``):
each matrix, once packed, goes to the file and the model holds the file's pages instead, so the packed
model never sits in fresh memory and in the page cache at once; the file is synced and renamed into place once
whole.
Layout: the tensors, each on a page, then the index (JSON) and a 16-byte trailer (magic, index length).
Files whose GGUF is gone or changed are removed when a new one is written. The cache lives under
``$SPECDECODE_CACHE/packed`` (``~/.cache/specdecode``); ``--no-pack-cache`` (``load_model(pack_cache=False)``)
neither reads nor writes it.
"""

from __future__ import annotations

import hashlib
import io
import itertools
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

PACK_FORMAT = 2  # bump when the layout of this file (not of the kernels: their sources are hashed) changes
ALIGN = 4096  # each tensor starts on a page: the kernels read 64-byte lines, and pages map independently
SAMPLES = 16  # spread-out 4 KiB reads of the GGUF that go into its fingerprint (a rewrite changes them)
HEADROOM = 1 << 30  # free disk a write must leave
POPULATE_READ = 22  # MADV_POPULATE_READ, absent from older headers and Python's mmap module
_MAGIC = b"SDPACK02"
_PACKERS = ("kernels/repack.cpp", "kernels/quant.py", "kernels/quant_q4k.py", "kernels/quant_q5k.py",
            "kernels/quant_b32.py", "models/gguf_file.py", "models/gguf.py", "models/gguf_load.py",
            "models/pack_cache.py")
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
    """A cache file's index (from its trailer): its GGUF, format and tensors (name -> dtype, shape, offset)."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < 16:
            raise ValueError("not a pack file")
        f.seek(size - 16)
        tail = f.read(16)
        (n,) = struct.unpack("<Q", tail[8:])
        if tail[:8] != _MAGIC or n > size - 16:
            raise ValueError("not a pack file")
        f.seek(size - 16 - n)
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


def _as_bytes(t: torch.Tensor) -> memoryview:
    return t.contiguous().view(torch.uint8).numpy().data


def _mapped(f: "io.BufferedRandom", offset: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """The tensor at ``offset`` of the open file ``f`` as a private mapping of its pages."""
    count = 1
    for n in shape:
        count *= n
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    length = count * dtype.itemsize
    m = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_COPY, offset=offset)
    return torch.frombuffer(m, dtype=dtype, count=count).view(shape)


class CacheWriter:
    """Writes the cache file of one GGUF as its matrices are packed (see the module docstring). ``keep`` returns
    the tensor to hold: the file's mapped copy, or the packed tensor itself once writing has failed (a full or
    read-only disk: the model runs as packed, only the next start repacks)."""

    def __init__(self, gguf: Path, fmt: str) -> None:
        self.gguf, self.fmt, self.path = gguf, fmt, cache_path(gguf, fmt)
        self.index: dict[str, tuple[str, list[int], int]] = {}
        self.offset = 0
        self._file: Optional[io.BufferedRandom] = None
        self._tmp = self.path.with_suffix(f".tmp{os.getpid()}-{next(_WRITES)}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _forget_stale(self.path.parent)
            need = 2 * gguf.stat().st_size + HEADROOM  # K-quant layers rounded to int8 grow up to ~1.7x
            if shutil.disk_usage(self.path.parent).free < need:
                log.info("not caching the packed weights: %s has under %.1f GB free", self.path.parent, need / 1e9)
                return
            self._file = self._tmp.open("w+b")
        except OSError as e:
            log.info("not caching the packed weights in %s: %s", self.path.parent, e)

    def keep(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if self._file is None:
            return t
        try:
            self._file.seek(self.offset)
            self._file.write(_as_bytes(t))
            self._file.flush()
            out = _mapped(self._file, self.offset, t.dtype, list(t.shape))
        except OSError as e:
            log.info("stopped caching the packed weights in %s: %s", self.path.parent, e)
            self._abandon()
            return t
        self.index[name] = (str(t.dtype).removeprefix("torch."), list(t.shape), self.offset)
        self.offset += -(-(t.numel() * t.element_size()) // ALIGN) * ALIGN
        return out

    def finish(self) -> Optional[Path]:
        """Write the index and put the file in place (None if writing failed on the way)."""
        if self._file is None:
            return None
        try:
            head = json.dumps({"source": str(self.gguf.resolve()), "fmt": self.fmt, "tensors": self.index}).encode()
            self._file.seek(self.offset)
            self._file.write(head + _MAGIC + struct.pack("<Q", len(head)))
            self._file.truncate(self.offset + len(head) + 16)
            self._file.flush()
            # on the disk before it takes its name: after a power cut a renamed file whose pages were never
            # written back would map as zeros, silently wrong weights (the first start only: ~0.5 s a GB here)
            os.fdatasync(self._file.fileno())
            self._file.close()
            os.replace(self._tmp, self.path)
            return self.path
        except OSError as e:
            log.info("not caching the packed weights in %s: %s", self.path.parent, e)
            self._abandon()
            return None

    def _abandon(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._tmp.unlink(missing_ok=True)


_WRITES = itertools.count()


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
        pid = p.suffix.removeprefix(".tmp").split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            p.unlink(missing_ok=True)
