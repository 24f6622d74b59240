"""A GGUF read straight into its runtime form: tables kept as stored, matrices packed a chunk at a time, and a
load whose memory stays near the file's size (``models/gguf.read_packed``, ``models/tables.StoredRows``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest
import torch

from gguf_util import tiny_gguf
from specdecode import generate, load_model
from specdecode.kernels.quant import dequantize, dequantize_rows, dequantize_rows_torch, pack_blocks, quantize
from specdecode.models import gguf as gguf_mod
from specdecode.models import gguf_load
from specdecode.models.gguf_file import GGUFTensor
from specdecode.models.tables import StoredRows

gguf = pytest.importorskip("gguf")

# where each K-quant block keeps its fp16 scales (llama.cpp's block_q4_K, block_q5_K, block_q6_K)
_K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, row bytes] of one GGUF type: quantized by gguf where it can, else random bytes with sane scales."""
    qtype = gguf.GGMLQuantizationType[kind]
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if kind in ("F32", "F16"):
        return np.ascontiguousarray(w.astype(np.float32 if kind == "F32" else np.float16)).view(np.uint8)
    if kind not in _K_SCALES:
        return gguf.quants.quantize(w, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for off in _K_SCALES[kind]:
        raw[..., off:off + 2] = np.full(raw.shape[:2], 0.01, dtype=np.float16).view(np.uint8).reshape(
            *raw.shape[:2], 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_stored_rows_decode_as_the_gguf_package_does(kind: str) -> None:
    rows, cols = 37, 512
    raw = _random_blocks(kind, rows, cols, np.random.default_rng(0))
    qtype = gguf.GGMLQuantizationType[kind]
    if kind in ("F32", "F16"):
        want = torch.from_numpy(raw.view(np.float32 if kind == "F32" else np.float16).astype(np.float32))
    else:
        want = torch.from_numpy(gguf.quants.dequantize(raw, qtype).astype(np.float32))
    table = StoredRows(kind, torch.from_numpy(raw), cols)
    ids = torch.tensor([[5, 0], [36, 5]])
    assert torch.equal(table.rows(ids), want[ids])
    assert torch.equal(table.dense(), want)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("n", [16, 50, 7])
def test_rows_of_a_packed_table_are_its_dequantized_rows(fmt: str, n: int) -> None:
    w = torch.randn(n, 96)
    packed = quantize(w, fmt)
    ids = torch.tensor([0, n - 1, n // 2, 3 % n, n - 1])
    assert torch.equal(dequantize_rows(packed, ids, 96), dequantize(packed, 96)[ids])
    assert torch.equal(dequantize_rows_torch(packed, ids, 96), dequantize(packed, 96)[ids])  # no kernel to build
    with pytest.raises(RuntimeError, match="outside the matrix"):
        dequantize_rows(packed, torch.tensor([n]), 96)


def _engine(monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    """"torch": the loader's own chunked packing, as where the C++ repack cannot build; "c++": the extension."""
    if engine == "torch":
        monkeypatch.setattr(gguf_load, "repack", lambda parts, k: None)
        monkeypatch.setattr(gguf_load, "round_int8", lambda parts, k: None)


@pytest.mark.parametrize("engine", ["c++", "torch"])
def test_a_matrix_rounded_a_chunk_at_a_time_equals_it_rounded_whole(monkeypatch: pytest.MonkeyPatch,
                                                                    engine: str) -> None:
    """Chunks concatenate only because the packed layout is local to groups of 16 rows: 32-row chunks of a
    q|k|v stack of 40 + 24 + 24 rows (chunks straddle the parts) give the bytes of the whole."""
    _engine(monkeypatch, engine)
    rng = np.random.default_rng(1)
    parts, dense = [], []
    for rows in (40, 24, 24):
        raw = gguf.quants.quantize(rng.standard_normal((rows, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q4_1)
        t = GGUFTensor("x", gguf.GGMLQuantizationType.Q4_1, [64, rows], raw)
        parts.append(gguf_load._Source(t, None))
        dense.append(torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1).astype(np.float32)))
    monkeypatch.setattr(gguf_load, "_CHUNK_ROWS", 32)
    for fmt in ("int8", "int4"):
        assert torch.equal(gguf_load._pack(parts, fmt, own_kinds=frozenset()), quantize(torch.cat(dense), fmt))


@pytest.mark.parametrize("engine", ["c++", "torch"])
@pytest.mark.parametrize("kind,fmt", [("Q8_0", "int8"), ("Q4_0", "int4")])
@pytest.mark.parametrize("rows", [(40, 24, 24), (16,), (7,)])
def test_blocks_packed_as_stored_chunk_by_chunk_equal_the_reference_packing(
        monkeypatch: pytest.MonkeyPatch, kind: str, fmt: str, rows: tuple[int, ...], engine: str) -> None:
    """``pack_gguf`` (or the C++ repack) moves the file's bytes into our layout; ``pack_blocks`` of the unpacked
    integers is the reference; chunks straddle the parts of a stack."""
    _engine(monkeypatch, engine)
    rng = np.random.default_rng(2)
    qtype = gguf.GGMLQuantizationType[kind]
    raws = [gguf.quants.quantize(rng.standard_normal((r, 96)).astype(np.float32), qtype) for r in rows]
    parts = [gguf_load._Source(GGUFTensor("x", qtype, [96, r.shape[0]], r), None) for r in raws]
    blocks = gguf_mod._raw_blocks(torch.from_numpy(np.concatenate(raws)), fmt)
    monkeypatch.setattr(gguf_load, "_CHUNK_ROWS", 32)
    assert torch.equal(gguf_load._pack(parts, fmt, own_kinds=frozenset()), pack_blocks(blocks.q, blocks.d, fmt))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """One tensor's memory (a Parameter wraps the tensor it was made from)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    return tmp_path_factory.mktemp("gguf-stored")


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_the_embedding_stays_as_stored_and_no_dense_matrix_is_held(tmp: Path, qtype: str) -> None:
    """The embedding table stays in the file's bytes, exactly decoded on lookup; the output matrix (this tiny
    model's is its own) is the packed copy the model multiplies by, and one tensor serves both roles."""
    _, path = tiny_gguf(tmp, qtype)
    model = load_model(path)
    assert not model.config.tie_embeddings
    table = model.module.tables["embed"]
    assert table.kind == qtype and _same(table.data, model.module.embed)
    lm_head = model.module.tables["lm_head"].data
    assert _same(lm_head, model.quant.head) and _same(lm_head, model.module.lm_head)
    assert not [n for n, p in model.module.named_parameters() if p.dim() == 2 and p.dtype.is_floating_point]
    ckpt, tensors = gguf_mod.read_gguf(path)
    dense = gguf_mod.load_tensors(ckpt, tensors, None)[0]["model.embed_tokens.weight"]
    assert torch.equal(model.embedding_matrix(), dense)  # the exact dequantization, not a rounded copy
    assert torch.equal(model.output_rows(torch.tensor([3, 1])), model.output_matrix()[[3, 1]])
    assert torch.equal(model.output_matrix(), dequantize(model.quant.head, model.config.dim))
    ids = [5, 9, 13, 2]
    plain = generate(model, ids, max_new_tokens=12, ignore_eos=True).token_ids
    from specdecode import PromptLookupDrafter

    assert generate(model, ids, drafter=PromptLookupDrafter(), max_new_tokens=12, ignore_eos=True).token_ids == plain


_PROBE = """
import json, sys, torch
torch.set_num_threads(1)
from specdecode import generate, load_model
from specdecode.kernels.quant import load_quant_extension
load_quant_extension()
def kib(field):  # the process's resident memory now (VmRSS) or at its peak (VmHWM)
    line = next(x for x in open("/proc/self/status") if x.startswith(field))
    return int(line.split()[1])
open("/proc/self/clear_refs", "w").write("5")  # reset the peak to the current resident size
base = kib("VmRSS")
m = load_model(sys.argv[1], weight_dtype="int8")
generate(m, [5, 6, 7], max_new_tokens=4, ignore_eos=True)
peak = kib("VmHWM")
packed = sum(p.numel() * p.element_size() for p in m.module.parameters())
print(json.dumps({"grew_mib": (peak - base) / 1024, "held_mib": packed / 2**20, "n": sum(m.quant.logical.values())}))
"""


def test_a_tied_q8_0_table_is_one_tensor_for_lookup_and_output(tmp: Path) -> None:
    from specdecode.bench.ladder import Shape, write_f16

    _, tok = tiny_gguf(tmp, "F16")
    path = tmp / "tied-F16.gguf"
    write_f16(Shape("test", 64, 2, 4, 2, 128, True), tok, path)
    q8 = tmp / "tied-Q8_0.gguf"
    _requantize(path, q8, "Q8_0")
    model = load_model(q8)
    table = model.module.tables["embed"]
    assert table.kind == "int8" and _same(table.data, model.quant.head) and "lm_head" not in model.module.tables
    ckpt, tensors = gguf_mod.read_gguf(q8)
    assert torch.equal(model.embedding_matrix(), gguf_mod.load_tensors(ckpt, tensors, None)[0][
        "model.embed_tokens.weight"])


def test_q4_k_matrices_are_kept_as_stored_and_drafting_on_them_is_exact(tmp: Path) -> None:
    """Q4_K (no quantizer in the gguf package: random blocks with sane scales) loads as our q4k, whose values
    are exactly the file's; the matrices of other types beside them are rounded to the int8 default."""
    from specdecode.kernels.quant import packed_format

    path = _k_quant_file(tmp, "Q4_K", ("ffn", "attn_q"))
    model = load_model(path)
    layer = model.module.layers[0]
    assert packed_format(layer.w13) == "q4k" and packed_format(layer.w2) == "q4k"
    assert packed_format(layer.wqkv) == "int8"  # q|k|v mixes Q4_K with Q8_0: one format for the fused matrix
    ckpt, tensors = gguf_mod.read_gguf(path)
    dense = gguf_mod.load_tensors(ckpt, tensors, None)[0]
    want = torch.cat([dense["model.layers.0.mlp.gate_proj.weight"], dense["model.layers.0.mlp.up_proj.weight"]])
    assert torch.equal(dequantize(layer.w13, 256), want)
    _drafting_is_exact(model)


def test_q5_k_matrices_and_a_tied_q5_k_table_are_kept_as_stored(tmp: Path) -> None:
    """A Q5_K_M file's matrices and table (random Q5_K blocks with sane scales) load as our q5k, exactly the file's
    values, the tied table one tensor for lookups and the output product; drafting on them is exact."""
    from specdecode.kernels.quant import packed_format

    path = _k_quant_file(tmp, "Q5_K", ("ffn", "token_embd"))
    model = load_model(path)
    layer = model.module.layers[0]
    assert packed_format(layer.w13) == "q5k" and packed_format(layer.w2) == "q5k"
    table = model.module.tables["embed"]
    assert table.kind == "q5k" and _same(table.data, model.quant.head)
    ckpt, tensors = gguf_mod.read_gguf(path)
    dense = gguf_mod.load_tensors(ckpt, tensors, None)[0]
    assert torch.equal(dequantize(layer.w2, 512), dense["model.layers.0.mlp.down_proj.weight"])
    assert torch.equal(model.embedding_matrix(), dense["model.embed_tokens.weight"])
    _drafting_is_exact(model)


def _requantize(src: Path, dst: Path, kind: str,
                encode: Optional[Callable[[str, np.ndarray], Optional[np.ndarray]]] = None,
                kind_of: Callable[[str], str] = lambda name: "") -> None:
    """``src`` (F16 matrices) rewritten with ``kind`` matrices: ``encode(name, dense)``'s bytes where it gives
    them (of type ``kind_of(name)`` where that names one, else ``kind``), else the gguf package's quantization
    (Q8_0 where it has none for ``kind``)."""
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
    qt = gguf.GGMLQuantizationType[kind]
    for t in tensors:
        arr = np.asarray(t.data)
        raw = encode(t.name, arr) if encode is not None else None
        if raw is not None:
            w.add_tensor(t.name, raw, raw_dtype=gguf.GGMLQuantizationType[kind_of(t.name) or kind])
        elif arr.ndim == 2:
            fallback = qt if kind not in _K_SCALES else gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(t.name, gguf.quants.quantize(arr.astype(np.float32), fallback), raw_dtype=fallback)
        else:
            w.add_tensor(t.name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads Linux's /proc/self/status")
def test_loading_grows_memory_by_about_what_is_held(tmp: Path) -> None:
    """An F16 file of 21M weights loaded as int8 (every matrix rounded from the file): the dense fp32 copy
    the old loader made (and its fused q|k|v, gate|up copies) would grow the process by over 200 MiB."""
    from specdecode.bench.ladder import Shape, write_f16

    _, tok = tiny_gguf(tmp, "F16")
    path = tmp / "wide-F16.gguf"
    write_f16(Shape("test", 512, 8, 8, 4, 1536, True), tok, path)
    out = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["n"] > 20e6
    assert r["grew_mib"] < r["held_mib"] + 80, r


def test_q6_k_matrices_and_a_tied_q6_k_table_are_kept_as_stored(tmp: Path) -> None:
    """llama.cpp writes Q4_K_M's output matrix (a tied table) and half its down projections as Q6_K: both run as
    our q6k, exactly the file's values, and the tied table is one tensor for lookups and the output product."""
    from specdecode.kernels.quant import packed_format

    path = _k_quant_file(tmp, "Q6_K", ("ffn_down", "token_embd"))
    model = load_model(path)
    assert packed_format(model.module.layers[0].w2) == "q6k"
    table = model.module.tables["embed"]
    assert table.kind == "q6k" and _same(table.data, model.quant.head)
    ckpt, tensors = gguf_mod.read_gguf(path)
    dense = gguf_mod.load_tensors(ckpt, tensors, None)[0]
    assert torch.equal(dequantize(model.module.layers[0].w2, 512), dense["model.layers.0.mlp.down_proj.weight"])
    assert torch.equal(model.embedding_matrix(), dense["model.embed_tokens.weight"])
    _drafting_is_exact(model)


def test_a_q6_k_v_beside_q4_k_q_and_k_is_held_apart_and_computed_as_stored(tmp: Path) -> None:
    """A Q4_K_M file's layers whose v is Q6_K: q|k stay q4k and v q6k (``LlamaBlock.wv``), exactly the file's
    values, where one fused matrix would have been rounded to int8; plain and speculative decoding agree."""
    from specdecode.bench.ladder import Shape, write_f16
    from specdecode.kernels.quant import packed_format

    _, tok = tiny_gguf(tmp, "F16")
    f16 = tmp / "k-F16.gguf"
    if not f16.exists():
        write_f16(Shape("test", 256, 2, 4, 2, 512, True), tok, f16)
    path = tmp / "k-mixed-v.gguf"
    rng = np.random.default_rng(7)

    def kind_of(name: str) -> str:
        return "Q6_K" if "attn_v" in name else "Q4_K" if ("attn_q" in name or "attn_k" in name) else ""

    _requantize(f16, path, "Q4_K", lambda name, arr: (
        _random_blocks(kind_of(name), arr.shape[0], arr.shape[1], rng) if arr.ndim == 2 and kind_of(name) else None),
        kind_of)
    model = load_model(path)
    ckpt, tensors = gguf_mod.read_gguf(path)
    dense = gguf_mod.load_tensors(ckpt, tensors, None)[0]
    for i, layer in enumerate(model.module.layers):
        assert packed_format(layer.wqkv) == "q4k" and packed_format(layer.wv) == "q6k"
        a = f"model.layers.{i}.self_attn."
        assert torch.equal(dequantize(layer.wv, 256), dense[a + "v_proj.weight"])
        assert torch.equal(dequantize(layer.wqkv, 256)[-dense[a + "k_proj.weight"].shape[0]:],
                           dense[a + "k_proj.weight"])
    _drafting_is_exact(model)


def test_q_k_and_v_apart_add_the_bias_as_the_kernel_does() -> None:
    """The joined product's bias, added after the join, gives the bits of the kernel adding it (one fp32 add)."""
    from specdecode.kernels.quant import load_quant_extension
    from specdecode.models.llama import project_qkv

    ext = load_quant_extension()
    g = torch.Generator().manual_seed(0)
    w, wv = quantize(torch.randn(48, 64, generator=g), "int8"), quantize(torch.randn(16, 64, generator=g), "int8")
    h, b = torch.randn(2, 3, 64, generator=g), torch.randn(64, generator=g)

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return ext.linear(x, weight, bias, True)

    joined = project_qkv(linear, h, w, b, wv)
    assert torch.equal(joined[..., :48], linear(h, w, b[:48])) and torch.equal(joined[..., 48:], linear(h, wv, b[48:]))
    assert torch.equal(project_qkv(linear, h, w, b[:48], None), linear(h, w, b[:48]))


def _k_quant_file(tmp: Path, kind: str, names: tuple[str, ...]) -> Path:
    """A tied 256-wide GGUF whose tensors with one of ``names`` in their name are random ``kind`` blocks (the gguf
    package has no K-quant quantizer), the other matrices Q8_0."""
    from specdecode.bench.ladder import Shape, write_f16

    _, tok = tiny_gguf(tmp, "F16")
    f16 = tmp / "k-F16.gguf"
    if not f16.exists():
        write_f16(Shape("test", 256, 2, 4, 2, 512, True), tok, f16)
    path = tmp / f"k-{kind}.gguf"
    rng = np.random.default_rng(len(names))
    _requantize(f16, path, kind, lambda name, arr: (
        _random_blocks(kind, arr.shape[0], arr.shape[1], rng)
        if arr.ndim == 2 and any(n in name for n in names) else None))
    return path


def _drafting_is_exact(model) -> None:  # type: ignore[no-untyped-def]
    from specdecode import DrafterOptions, PromptLookupDrafter, build_drafter

    ids = [5, 9, 13, 2, 5, 9, 13]
    plain = generate(model, ids, max_new_tokens=24, ignore_eos=True).token_ids
    for drafter in (PromptLookupDrafter(), build_drafter("quant", DrafterOptions(gamma=3))):
        assert generate(model, ids, drafter=drafter, max_new_tokens=24, ignore_eos=True).token_ids == plain
