"""GGUF Q5_0, Q4_1 and Q5_1 matrices load as the kernel's b32 formats (``kernels/quant_b32.py``): the file's own
weights, computed as stored. A model of each type decodes the tokens of the same model run through the kernel's
fp64 reference product (the exact dequantized weights times the int8-rounded activations), lands near the fp32
model of the dequantized weights, and drafts exactly; a fused matrix whose parts mix types is rounded as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest
import torch

from gguf_util import tiny_gguf
from specdecode import generate, load_model
from specdecode.kernels.quant import dequantize, load_quant_extension, packed_format
from specdecode.models import gguf as gguf_mod
from specdecode.models import gguf_load
from specdecode.models.gguf_file import GGUFTensor
from test_gguf_stored import _drafting_is_exact

gguf = pytest.importorskip("gguf")

FORMAT = {"Q5_0": "q5_0", "Q4_1": "q4_1", "Q5_1": "q5_1"}
PROMPTS = [[5, 9, 13, 2], [1, 2, 3, 4, 5, 6, 7], [100, 50, 20]]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    return tmp_path_factory.mktemp("gguf-b32")


def _reference_model(path: Path):  # type: ignore[no-untyped-def]
    """The model loaded as usual, its packed products computed by the kernel's fp64 reference instead."""
    ext = load_quant_extension()
    model = load_model(path)
    dense = model.kernels.linear

    def linear(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        if packed_format(w) is None:
            return dense(x, w, bias)
        y = ext.reference(x.reshape(-1, x.shape[-1]).contiguous(), w)
        if bias is not None:
            y = y + bias.double()
        return y.float().view(*x.shape[:-1], w.shape[0])

    model.kernels = replace(model.kernels, linear=linear, native=None)  # Python's layer loop calls ``linear``
    return model


def _retyped(src: Path, dst: Path, kind_of: Callable[[str], str]) -> Path:
    """``src`` (an F16 file) with each matrix quantized by the gguf package to ``kind_of(its name)``."""
    ckpt, tensors = gguf_mod.read_gguf(src)
    w = gguf.GGUFWriter(str(dst), "llama")
    for key, value in ckpt.meta.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, int(value))
    for t in tensors:
        arr = np.asarray(t.data).astype(np.float32)
        if arr.ndim == 2:
            qt = gguf.GGMLQuantizationType[kind_of(t.name)]
            w.add_tensor(t.name, gguf.quants.quantize(arr, qt), raw_dtype=qt)
        else:
            w.add_tensor(t.name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _dense_matrices(path: Path) -> dict[str, torch.Tensor]:
    ckpt, tensors = gguf_mod.read_gguf(path)
    return gguf_mod.load_tensors(ckpt, tensors, None)[0]  # the gguf package's exact dequantization


@pytest.mark.parametrize("arch,kind", [("llama", "Q5_0"), ("llama", "Q4_1"), ("llama", "Q5_1"), ("gemma3", "Q5_0")])
def test_a_file_of_each_type_runs_as_stored(tmp: Path, arch: str, kind: str) -> None:
    _, path = tiny_gguf(tmp, kind, arch)
    model = load_model(path)
    fmt = FORMAT[kind]
    layer = model.module.layers[0]
    assert [packed_format(getattr(layer, n)) for n in ("wqkv", "wo", "w13", "w2")] == [fmt] * 4
    dense = _dense_matrices(path)
    a = "model.layers.0.self_attn."
    want = torch.cat([dense[a + f"{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(dequantize(layer.wqkv, model.config.dim), want)  # bit for bit: no second rounding
    down = dense["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(dequantize(layer.w2, down.shape[1]), down)
    ref = _reference_model(path)
    fp32 = load_model(path, weight_dtype="fp32")
    for ids in PROMPTS:
        got = generate(model, ids, max_new_tokens=16, ignore_eos=True).token_ids
        assert got == generate(ref, ids, max_new_tokens=16, ignore_eos=True).token_ids, ids
    ids = torch.tensor([PROMPTS[1]])
    logits = model.forward(ids, model.new_cache(1))[0]
    exact = fp32.forward(ids, fp32.new_cache(1))[0]
    assert (logits - exact).abs().max().item() < 0.05 * exact.abs().max().item()  # int8 activations' rounding only


def test_mixed_types_keep_each_matrix_in_its_own_format(tmp: Path) -> None:
    """Gemma 3's Q4_K_M file mixes Q5_0 with other types: a Q5_0 matrix runs as q5_0, a q|k|v whose v alone differs
    (Q5_0 q and k, a Q8_0 v) keeps q|k as q5_0 and v apart as stored (int8), and drafting on the mix is exact."""
    from specdecode.bench.ladder import Shape, write_f16

    _, tok = tiny_gguf(tmp, "F16")
    f16 = tmp / "mix-F16.gguf"
    write_f16(Shape("test", 128, 2, 4, 2, 256, True), tok, f16)
    path = _retyped(f16, tmp / "mix-Q5_0.gguf",
                    lambda name: "Q5_0" if any(n in name for n in ("attn_q", "attn_k", "ffn")) else "Q8_0")
    model = load_model(path)
    layer = model.module.layers[0]
    assert packed_format(layer.w13) == "q5_0" and packed_format(layer.w2) == "q5_0"
    assert packed_format(layer.wqkv) == "q5_0" and packed_format(layer.wv) == "int8"
    assert packed_format(layer.wo) == "int8"
    dense = _dense_matrices(path)
    assert torch.equal(dequantize(layer.wv, 128), dense["model.layers.0.self_attn.v_proj.weight"])
    m = "model.layers.1.mlp."
    want = torch.cat([dense[m + "gate_proj.weight"], dense[m + "up_proj.weight"]])
    assert torch.equal(dequantize(model.module.layers[1].w13, 128), want)
    _drafting_is_exact(model)


def test_a_q4_1_file_with_a_q8_0_table_as_smollm2_has(tmp: Path) -> None:
    """SmolLM2-135M's Q4_1 file: every matrix Q4_1, the tied table Q8_0. The layers run as q4_1, the table is one
    int8 tensor for lookups and the output product, and drafting is exact."""
    from specdecode.bench.ladder import Shape, write_f16

    _, tok = tiny_gguf(tmp, "F16")
    f16 = tmp / "smol-F16.gguf"
    write_f16(Shape("test", 64, 2, 4, 2, 160, True), tok, f16)
    path = _retyped(f16, tmp / "smol-Q4_1.gguf", lambda name: "Q8_0" if "token_embd" in name else "Q4_1")
    model = load_model(path)
    assert model.weight_format == "int8"  # the default names what other types are rounded to
    assert {packed_format(getattr(layer, n)) for layer in model.module.layers for n in ("wqkv", "wo", "w13", "w2")} \
        == {"q4_1"}
    table = model.module.tables["embed"]
    assert table.kind == "int8" and table.data.data_ptr() == model.quant.head.data_ptr()
    assert torch.equal(model.embedding_matrix(), _dense_matrices(path)["model.embed_tokens.weight"])
    _drafting_is_exact(model)


def _parts(kinds: tuple[str, ...], rows: tuple[int, ...], cols: int
           ) -> tuple[list[gguf_load._Source], list[np.ndarray]]:
    rng = np.random.default_rng(1)
    parts, raws = [], []
    for kind, r in zip(kinds, rows):
        qt = gguf.GGMLQuantizationType[kind]
        raw = gguf.quants.quantize(rng.standard_normal((r, cols)).astype(np.float32), qt)
        parts.append(gguf_load._Source(GGUFTensor("x", qt, [cols, r], raw), None))
        raws.append(raw)
    return parts, raws


@pytest.mark.parametrize("kind", list(FORMAT))
def test_a_stack_packed_as_stored_chunk_by_chunk_equals_it_packed_whole(monkeypatch: pytest.MonkeyPatch,
                                                                       kind: str) -> None:
    """32-row chunks of a q|k|v stack of 40 + 24 + 24 rows of one type (chunks straddle the parts) give the bytes of
    the whole stack packed at once, whatever ``weight_dtype`` asks for."""
    from specdecode.kernels.quant import pack_b32

    parts, raws = _parts((kind,) * 3, (40, 24, 24), 96)
    monkeypatch.setattr(gguf_load, "_CHUNK_ROWS", 32)
    whole = pack_b32(torch.from_numpy(np.concatenate(raws)), FORMAT[kind])
    for fmt in ("int8", "int4"):
        assert torch.equal(gguf_load._pack(parts, fmt), whole)


def test_a_stack_of_mixed_types_is_rounded_chunk_by_chunk_as_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stack whose parts differ in type (Q4_1, Q5_0, Q4_1) is decoded and rounded once, 32-row chunks giving the
    bytes of the whole rounded at once (the packed layout is local to groups of 16 rows)."""
    from specdecode.kernels.quant import quantize

    kinds = ("Q4_1", "Q5_0", "Q4_1")
    parts, raws = _parts(kinds, (40, 24, 24), 64)
    dense = torch.cat([torch.from_numpy(gguf.quants.dequantize(r, gguf.GGMLQuantizationType[k]).astype(np.float32))
                       for k, r in zip(kinds, raws)])
    monkeypatch.setattr(gguf_load, "_CHUNK_ROWS", 32)
    for fmt in ("int8", "int4"):
        assert torch.equal(gguf_load._pack(parts, fmt), quantize(dense, fmt))
