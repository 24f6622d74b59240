"""Token tables kept as stored: an embedding (or output) matrix whose rows are decoded when looked up.

Why: at real sizes the embedding table is large (Llama-3.1-8B: 525M weights; Gemma 3 270M: two
thirds of the model) and a decode step reads one row of it per token. Held dense in fp32 it would
cost 4 bytes a weight where the file holds about one; held in its stored format it costs what the
file costs, and a lookup decodes a handful of rows. The decoding is exact: GGUF block types go
through the ``gguf`` package's dequantization (what transformers computes with), our packed
int8/int4 layout through ``kernels.quant.dequantize_rows``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..kernels.quant import dequantize_rows

PACKED_KINDS = ("int8", "int4", "q4k", "q5k", "q6k")  # our kernel formats (``kernels/quant.py``)

# rows decoded per chunk by ``dense``: bounds the transient fp32 copy when a drafter asks for the whole table
_CHUNK = 4096


@dataclass(frozen=True)
class StoredRows:
    """A [rows, dim] table as stored in ``data`` ([rows, row bytes] uint8/int8).

    ``kind``: "int8", "int4", "q4k", "q5k" or "q6k" (our packed layouts, ``kernels/quant.py``) or a GGUF type name
    ("Q8_0", "Q4_K", "F16", ...: the file's own bytes, one row per table row)."""

    kind: str
    data: torch.Tensor
    dim: int

    @property
    def num_rows(self) -> int:
        return int(self.data.shape[0])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 rows for ``ids`` (any shape): [*ids.shape, dim]."""
        flat = ids.reshape(-1).to(torch.long).cpu()
        if self.kind in PACKED_KINDS:
            out = dequantize_rows(self.data, flat, self.dim)
        else:
            out = decode_rows(self.data.index_select(0, flat), self.kind, self.dim)
        return out.reshape(*ids.shape, self.dim)

    def dense(self) -> torch.Tensor:
        """The whole table in fp32 (a new tensor: for drafters that take rows or cuts of it)."""
        out = torch.empty(self.num_rows, self.dim, dtype=torch.float32)
        for i in range(0, self.num_rows, _CHUNK):
            out[i:i + _CHUNK] = self.rows(torch.arange(i, min(i + _CHUNK, self.num_rows)))
        return out


def decode_rows(raw: torch.Tensor, kind: str, dim: int) -> torch.Tensor:
    """Rows of a GGUF tensor ([n, row bytes]) decoded to fp32 [n, dim]."""
    if kind == "F32":
        return raw.contiguous().view(torch.float32).clone()
    if kind == "F16":
        return raw.contiguous().view(torch.float16).float()
    if kind == "BF16":
        return raw.contiguous().view(torch.bfloat16).float()
    import gguf  # lazy: the package (~20 ms) is read for GGUF tables only

    qtype = gguf.GGMLQuantizationType[kind]
    arr = gguf.quants.dequantize(np.ascontiguousarray(raw.numpy()), qtype)
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).reshape(-1, dim)


__all__ = ["StoredRows", "decode_rows"]
