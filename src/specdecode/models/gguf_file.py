"""The GGUF file itself: its header, metadata and tensor table, read from a memory map.

We read the header ourselves (``_Cursor``: a few lines of ``struct``) and leave the block formats' arithmetic to
``gguf.py`` (what the tensors mean) and ``gguf_load.py`` (their runtime form)."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .config import UnsupportedModelError

DENSE_TYPES = ("F32", "F16", "BF16")


class GGUFError(ValueError):
    """The file is not a GGUF we can run: the message names the architecture, tensor or key."""


def is_gguf(path: str | Path) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(4) == b"GGUF"



@dataclass
class GGUFTensor:
    """One tensor of the file: its name, GGUF type and shape, and its bytes as a view of the memory map."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: list[int]  # GGUF order: innermost dimension first
    data: np.ndarray  # [rows, row bytes] for block types, else the values in numpy order
    mapping: Optional[mmap.mmap] = None  # the file's memory map that ``data`` views
    offset: int = 0  # where ``data`` starts in it

    def release(self) -> None:
        """Drop this tensor's file pages from the process's resident memory once it has been read: they
        stay in the page cache, but a load that touched every page would otherwise count the whole file
        on top of what it built from it."""
        if self.mapping is None or not hasattr(self.mapping, "madvise"):
            return
        page = mmap.PAGESIZE
        start = self.offset // page * page
        end = min(len(self.mapping), self.offset + self.data.nbytes)
        self.mapping.madvise(mmap.MADV_DONTNEED, start, end - start)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}


class _Cursor:
    """Reads GGUF's little-endian key/value section from a memory map.

    Why not ``gguf.GGUFReader``: it builds a numpy view per array element, which takes 5-15 s for a
    49k-token vocabulary; ``struct`` on the mapped bytes takes a fraction of a second."""

    def __init__(self, buf: Any) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, kind: int) -> Any:
        fmt = _SCALARS[kind]
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return bool(v) if kind == 7 else v

    def string(self) -> str:
        (n,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8 + n
        return bytes(self.buf[self.pos - n: self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind == 8:
            return self.string()
        if kind != 9:
            return self.scalar(kind)
        item, n = self.scalar(4), self.scalar(10)
        if item == 8:
            return [self.string() for _ in range(n)]
        if item == 9:
            return [self.value(9) for _ in range(n)]
        dt = np.dtype(_SCALARS[item])
        arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
        self.pos += n * dt.itemsize
        return [bool(x) for x in arr] if item == 7 else arr.tolist()


def parse_gguf(path: Path) -> tuple[dict[str, Any], list[GGUFTensor]]:
    """The metadata (key -> value) and the tensors (memory-mapped) of a GGUF file, as stored."""
    import gguf  # lazy: the package (~20 ms) is read for GGUF files only

    with path.open("rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # an empty file cannot be mapped
            raise GGUFError(f"{path} is not a GGUF file (empty)") from e
    buf = np.frombuffer(mm, dtype=np.uint8)
    c = _Cursor(mm)
    if mm[:4] != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (no GGUF magic)")
    c.pos = 4
    version = c.scalar(4)
    if version not in (2, 3):
        raise GGUFError(f"{path.name}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = c.scalar(10), c.scalar(10)
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        meta[key] = c.value(c.scalar(4))
    infos = []
    for _ in range(n_tensors):
        name = c.string()
        dims = [c.scalar(10) for _ in range(c.scalar(4))]
        kind, offset = c.scalar(4), c.scalar(10)
        infos.append((name, dims, kind, offset))
    align = int(meta.get("general.alignment", 32))
    start = (c.pos + align - 1) // align * align
    tensors = []
    for name, dims, kind, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(kind)
        except ValueError as e:
            raise UnsupportedModelError(f"{path.name}: tensor {name} has GGUF type {kind}, unknown to the installed "
                                        "gguf package; upgrade it (pip install -U gguf)") from e
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        row_bytes = dims[0] // block * size
        raw = buf[start + offset: start + offset + rows * row_bytes]
        if qtype.name in DENSE_TYPES:
            np_dt = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[qtype.name]
            data = raw.view(np_dt).reshape(list(reversed(dims)))
        else:
            data = raw.reshape(rows, row_bytes)
        tensors.append(GGUFTensor(name, qtype, dims, data, mm, start + offset))
    return meta, tensors
