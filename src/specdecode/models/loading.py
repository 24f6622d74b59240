"""Load a checkpoint (a Hugging Face directory, a cached hub id, a catalogued name or a GGUF file) into our
runtime: config, weights, tokenizer, EOS, chat template; the per-model pass settings; and ``quantized_copy``."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Optional, cast

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from ..chat import read_chat_template
from ..config import (DEFAULT_DEVICE, DEFAULT_DTYPE, DEFAULT_FAST, DEFAULT_FIXED_ROWS, DEFAULT_KV_DTYPE,
                      DEFAULT_MATMUL, DEFAULT_PACK_CACHE, DEFAULT_WEIGHT_DTYPE, ConfigError, check_fixed_rows,
                      check_kv_dtype, check_matmul, check_weight_dtype)
from ..kernels import Kernels, install_kernels
from ..kernels.quant import QUANT_FORMATS
from ..threads import governor
from .assemble import assemble_model, checked_quant_kernels, quantize_module, resolve_dtype
from .catalog import resolve_named_model
from .config import ModelConfig, ModelNotFoundError
from .gguf import load_tensors, read_gguf
from .gguf_load import load_gguf_model, pack_layers
from .gpt2 import GPT2Model
from .graphs import PassGraphs
from .llama import LlamaModel
from .model import Model


def quantized_copy(model: "Model", fmt: str, n_layers: Optional[int] = None) -> "Model":
    """A second ``Model`` running ``model``'s checkpoint with ``fmt`` weights (the quantized drafter).

    It shares the embedding table, norms, biases, RoPE tables and tokenizer with ``model`` (no copy)
    and quantizes the layer matrices from the checkpoint's own dense weights (re-read from disk
    when ``model`` itself is quantized), so memory grows by one packed copy. ``n_layers``: copy only
    the first that many layers (an exit draft's; its layer i still uses cache layer i)."""
    if fmt not in QUANT_FORMATS:
        raise ConfigError(f"quantized format must be one of {', '.join(QUANT_FORMATS)}, got {fmt!r}")
    cls = GPT2Model if model.config.family == "gpt2" else LlamaModel
    kernels = checked_quant_kernels(model.kernels if model.quant is None else _dense_kernels(model), fmt, model.device,
                             model.dtype)
    cfg = model.config if n_layers is None else replace(model.config, n_layers=n_layers)

    def kept(name: str) -> bool:
        return not name.startswith("layers.") or int(name.split(".")[1]) < cfg.n_layers

    sources: Optional[dict[str, torch.Tensor]] = None
    packed: Optional[dict[str, torch.Tensor]] = None
    if model.quant is not None and Path(model.path).suffix == ".gguf":  # from the file, a matrix at a time
        packed = pack_layers(Path(model.path), cfg, fmt)
    elif model.quant is not None:
        raw = cls.convert_hf_state_dict(_load_weights(Path(model.path)), model.config)
        sources = {k: v for k, v in raw.items() if k.startswith("layers.") and v.dim() == 2 and kept(k)}
    with torch.device("meta"):
        module = cls(cfg, model.max_seq_len)
    src = cast(LlamaModel | GPT2Model, model.module)
    for name, p in src.named_parameters():  # share everything; packed ones are replaced below
        if not kept(name) or name.endswith(".wv"):  # the copy holds q|k|v as one matrix of its own format
            continue
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        setattr(owner, name.rsplit(".", 1)[-1], p)
    for name, b in src.named_buffers():
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        setattr(owner, name.rsplit(".", 1)[-1], b)
    module.tables = dict(src.tables)
    if packed is not None:
        quant = quantize_module(module, fmt, packed=packed)
        assert model.quant is not None
        logical = model.quant.logical  # weight counts, not bytes; the target's q|k and v apart are one matrix here
        quant.logical = {n: logical[n] + logical.get(n.removesuffix("wqkv") + "wv", 0) if n.endswith(".wqkv")
                         else logical[n] for n in quant.logical}
    else:
        if sources is None:
            sources = {n: p for n, p in src.named_parameters()
                       if n.startswith("layers.") and p.dim() == 2 and kept(n)}
        quant = quantize_module(module, fmt, sources)
    module.eval().requires_grad_(False)
    install_kernels(module, kernels)
    copy = Model(module, cfg, model.tokenizer, sorted(model.eos_token_ids), model.path, model.max_seq_len,
                 model.dtype, quant, kv_dtype=model.kv_dtype)
    copy.chat_template, copy.bos_token, copy.eos_token = model.chat_template, model.bos_token, model.eos_token
    return copy


def _dense_kernels(model: "Model") -> Kernels:
    """The dense kernels a quantized model was built on (its mode after the format label)."""
    k = model.kernels
    return replace(k, mode=k.mode.split("+", 1)[1] if "+" in k.mode else k.mode)


def resolve_model_path(path_or_id: str) -> Path:
    """A local directory, or a hub id found in the local Hugging Face cache (no network here)."""
    p = Path(path_or_id).expanduser()
    if p.is_dir() or (p.is_file() and p.suffix == ".gguf"):
        return p
    named = resolve_named_model(path_or_id)
    if named is not None:
        return named
    home = Path(os.environ.get("HF_HOME", "~/.cache/huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE") or home / "hub").expanduser()
    if "/" in path_or_id and not p.exists():
        repo = hub / ("models--" + path_or_id.replace("/", "--"))
        snapshots = repo / "snapshots"
        if snapshots.is_dir():
            ref = repo / "refs" / "main"
            if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
                return snapshots / ref.read_text().strip()
            candidates = sorted(snapshots.iterdir())
            if candidates:
                return candidates[-1]
    raise ModelNotFoundError(
        f"model {path_or_id!r} not found: it is not a local directory and not in the Hugging Face cache ({hub}). "
        "Pass the path of a directory holding config.json and *.safetensors, or of a .gguf file (this tool never "
        "downloads by itself; `specdecode pull NAME` fetches a catalogued model)."
    )


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".gguf":
        ckpt, tensors = read_gguf(path)
        return load_tensors(ckpt, tensors, None)[0]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        sd: dict[str, torch.Tensor] = {}
        for shard in shards:
            sd.update(load_file(str(path / shard)))
        return sd
    single = path / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    if any(path.glob("*.bin")):
        raise ModelNotFoundError(f"{path} holds PyTorch .bin weights only; convert them to safetensors "
                                 "(transformers: model.save_pretrained(dir, safe_serialization=True))")
    raise ModelNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")


def _eos_ids(path: Path, cfg: ModelConfig) -> list[int]:
    gen = path / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if isinstance(eos, int):
            return [eos]
        if isinstance(eos, list):
            return [int(e) for e in eos]
    return list(cfg.eos_token_ids)


def load_model(path: str | os.PathLike[str], device: str = DEFAULT_DEVICE, dtype: str | torch.dtype = DEFAULT_DTYPE,
               weight_dtype: str | torch.dtype | None = DEFAULT_WEIGHT_DTYPE, *, fast: bool = DEFAULT_FAST,
               matmul: str = DEFAULT_MATMUL, kv_dtype: str | torch.dtype = DEFAULT_KV_DTYPE,
               fixed_rows: str | int | None = DEFAULT_FIXED_ROWS, cuda_graphs: bool = False,
               pack_cache: bool = DEFAULT_PACK_CACHE) -> Model:
    """Load a Hugging Face checkpoint (directory or cached hub id) for our runtime.

    ``dtype`` is the compute dtype (activations); ``weight_dtype`` the
    storage dtype of the weight matrices ("auto": see ``resolve_weight_dtype``).
    On the CPU, ``fast`` (the default, as the CLI's) runs this model's projections on the
    small-M C++ kernel and its Llama layers on the fused decode ops; ``fast=False`` or
    ``SPECDECODE_FAST_LINEAR=0`` runs eager PyTorch, and so does a machine where the
    kernel cannot build (one log line). ``matmul`` is how the kernel multiplies by
    bf16-stored weights: "bf16" (activations rounded to bf16, exact products summed in
    fp32) or "fp32" (exact fp32 products). The choice belongs to this model alone.

    ``weight_dtype`` "int8" or "int4" quantizes the decoder layers' matrices and a copy of the
    output matrix at load (blocks of 32 with fp16 scales, ``kernels/quant.py``), for the CPU with
    fp32 activations and the fast kernel; the embedding table stays as stored.

    ``kv_dtype`` is the storage dtype of this model's KV caches (``new_cache``): "auto" (see
    ``resolve_kv_dtype``), "fp32", "fp16" or "bf16". Plain and speculative decoding share the
    cache, so greedy speculative output equals plain output whatever it is.

    ``fixed_rows`` makes decode passes batch-invariant where the kernels are not (``resolve_fixed_rows``);
    ``cuda_graphs`` replays those passes as CUDA graphs (``models/graphs.py``; experimental).
    ``pack_cache``: a GGUF file's packed weights are mapped from the packed-weights cache, and kept there on
    the first load (``models/pack_cache.py``).
    """
    governor().tick()  # the thread count this load and what follows start with (threads.py)
    check_matmul(matmul)
    check_fixed_rows(fixed_rows)
    if not isinstance(kv_dtype, torch.dtype):
        check_kv_dtype(kv_dtype)
    if weight_dtype is not None and not isinstance(weight_dtype, torch.dtype):
        check_weight_dtype(weight_dtype)
    root = resolve_model_path(str(path))
    if root.is_file():
        model = load_gguf_model(root, device, dtype, weight_dtype, fast=fast, matmul=matmul, pack_cache=pack_cache)
        model.kv_dtype = resolve_kv_dtype(kv_dtype, model)
        return with_pass_settings(model, fixed_rows, cuda_graphs)
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise ModelNotFoundError(f"{root} has no config.json; is it a Hugging Face model directory?")
    cfg = ModelConfig.from_hf(json.loads(cfg_file.read_text()))
    tok_file = root / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(tok_file)) if tok_file.is_file() else None
    model = assemble_model(cfg, _load_weights(root), str(root), tokenizer, _eos_ids(root, cfg), device, dtype,
                           weight_dtype, fast=fast, matmul=matmul)
    model.chat_template, model.bos_token, model.eos_token = read_chat_template(root)
    model.kv_dtype = resolve_kv_dtype(kv_dtype, model)
    return with_pass_settings(model, fixed_rows, cuda_graphs)


def with_pass_settings(model: Model, fixed_rows: str | int | None, cuda_graphs: bool) -> Model:
    """``model`` with its decode passes' shape (``resolve_fixed_rows``) and, on request, their CUDA graphs.

    Trees are exact only on the CPU's fp32 kernels (``Model.exact_trees``). A tree node's ancestors sit in the
    cache at their node indices, not at their depths as in plain decoding. Our fp32 kernels sum a row's keys
    one by one, so that moves masked zeros and changes no sum. CUDA's attention, and torch's bf16 attention
    on the CPU, sum keys in blocks, so the same keys at other slots round differently: greedy Medusa trees
    diverged from plain decoding there (an H200, and this project's CPU in bf16) where every chain drafter was
    identical (docs/gpu.md)."""
    model.fixed_rows = resolve_fixed_rows(fixed_rows, model)
    model.exact_trees = row_by_row_kernels(model)
    if cuda_graphs:
        if model.device.type != "cuda":
            raise ConfigError(f"cuda_graphs needs a CUDA device (the model is on {model.device}); drop --cuda-graphs")
        if model.fixed_rows is None:
            raise ConfigError("cuda_graphs replays fixed-shape passes: use --fixed-rows auto or a number of rows")
        model.graphs = PassGraphs()
    return model


FIXED_ROWS_AUTO = 64  # the widest verification pass a drafter sends (the fused CPU path's tree limit too)


def resolve_fixed_rows(fixed_rows: str | int | None, model: Model) -> Optional[int]:
    """How many rows every decode pass of ``model`` is padded to (None: passes run as they come).

    Why: a kernel may round a row differently depending on how many rows its pass has (cuBLAS and the
    CPU's BLAS pick a different tiling, split or reduction for 1 row than for 5), and then a pass that
    verifies k tokens can flip a near-tie that k one-token passes would not: greedy speculative output
    differs from plain decoding's. Run at one shape (padded rows, and attention over the cache's whole
    capacity with a mask), every row gets the same arithmetic whatever else the pass holds. "auto" turns it
    on where the kernels are not batch-invariant themselves: off the CPU (CUDA), and for bf16/fp16
    activations on the CPU; the CPU's fp32 path (our own kernels, row by row) needs it not. Passes wider
    than the row count (a prompt's prefill) run as they come: plain and speculative decoding share them."""
    check_fixed_rows(fixed_rows)
    if fixed_rows in ("off", None):
        return None
    if fixed_rows == "auto":
        return None if row_by_row_kernels(model) else FIXED_ROWS_AUTO
    return int(fixed_rows)


def row_by_row_kernels(model: Model) -> bool:
    """Whether ``model`` runs on the CPU's fp32 kernels, which compute each row alone and sum its keys in
    order: batch-invariant, and blind to where a tree puts its nodes (``resolve_fixed_rows``, exact trees)."""
    return model.device.type == "cpu" and model.dtype not in (torch.bfloat16, torch.float16)


def resolve_kv_dtype(kv_dtype: str | torch.dtype, model: Model) -> torch.dtype:
    """Storage dtype of ``model``'s KV cache.

    "auto" is fp16 for a Llama-family model with fp32 activations on the fused CPU ops: at long
    context a decode step is mostly streaming the cache, the kernel reads fp16 at half the bytes
    and widens it exactly (llama.cpp's default cache type too), and its 11-bit significand keeps
    the logits within ~1e-3 of an fp32 cache's. Elsewhere (CUDA, eager ops, GPT-2) it is the
    compute dtype: the eager layer would widen the whole cache every step."""
    if isinstance(kv_dtype, torch.dtype):
        return kv_dtype
    if kv_dtype == "auto":
        fused = (model.device.type == "cpu" and model.dtype == torch.float32 and model.kernels.fused is not None
                 and isinstance(model.module, LlamaModel))
        return torch.float16 if fused else model.dtype
    return resolve_dtype(kv_dtype, model.device)
