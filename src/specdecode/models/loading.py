"""Load a Hugging Face checkpoint directory into our runtime: config, weights, tokenizer, EOS; and
quantized weights (``QuantState``, ``quantized_copy``). ``Model`` itself is in ``model.py`` (re-exported)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence, cast

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import nn

from ..config import (DEFAULT_DEVICE, DEFAULT_DTYPE, DEFAULT_FAST, DEFAULT_FIXED_ROWS, DEFAULT_KV_DTYPE,
                      DEFAULT_MATMUL, DEFAULT_WEIGHT_DTYPE, ConfigError, check_fixed_rows, check_kv_dtype, check_matmul,
                      check_weight_dtype)
from ..kernels import Kernels, install_kernels, select_kernels
from ..kernels.quant import QUANT_FORMATS, QuantUnavailableError, quantize, quantized_kernels
from ..threads import governor
from .config import ModelConfig
from .gpt2 import GPT2Model
from .llama import LlamaModel
from .model import ForwardOutput, Model
from .tables import StoredRows

# RoPE/position tables and caches are sized to this many tokens at most, so a
# 128k-context config does not allocate 128k-row tables on a laptop.
MAX_RUNTIME_CONTEXT = 16384

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


class ModelNotFoundError(FileNotFoundError):
    pass


@dataclass
class QuantState:
    """A model whose layer matrices are packed ``fmt`` blocks (``kernels/quant.py``).

    ``head``: the output matrix, packed, which forward multiplies by when no ``head`` is passed
    (the dense table stays for the embedding lookup and for drafters that take rows of it).
    ``logical``: each packed parameter's weight count, for ``num_parameters``."""

    fmt: str
    head: torch.Tensor
    logical: dict[str, int] = field(default_factory=dict)


def quantize_module(module: LlamaModel | GPT2Model, fmt: str, sources: Optional[dict[str, torch.Tensor]] = None,
                    packed: Optional[dict[str, torch.Tensor]] = None) -> QuantState:
    """Pack every matrix of the decoder layers (``layers.*``) and a copy of the output matrix as ``fmt``.

    ``sources`` (parameter name -> dense matrix) quantizes from those instead of the module's own
    weights (a quantized copy of a model whose matrices are already packed). ``packed`` (parameter
    name, or "head" for the output matrix -> packed ``fmt`` tensor) is used as it is: a GGUF's
    Q8_0/Q4_0 blocks, which must not be rounded twice. Embeddings, norms and biases stay as they are."""
    packed = packed or {}
    logical: dict[str, int] = {}
    for name, p in list(module.named_parameters()):
        if not name.startswith("layers.") or p.dim() != 2:
            continue
        dense = sources[name] if sources is not None else p
        owner = module.get_submodule(name.rsplit(".", 1)[0])
        w = packed[name] if name in packed else quantize(dense, fmt)
        setattr(owner, name.rsplit(".", 1)[1], nn.Parameter(w, requires_grad=False))
        logical[name] = dense.numel()
    head = packed["head"] if "head" in packed else quantize(module.output_matrix(), fmt)
    return QuantState(fmt, head, logical)


@dataclass
class PackedWeights:
    """A checkpoint read straight into its runtime form, tensor by tensor (a GGUF's load): no dense copy
    of any matrix is ever held, so loading peaks near the file's size.

    ``params``: our parameter names -> final tensors (packed ``fmt`` matrices, dense norms and biases);
    ``tables``: "embed" (and "lm_head") kept as stored, whose parameters hold the stored bytes;
    ``head``: the packed output matrix the model multiplies by; ``logical``: weight counts of packed
    and stored parameters."""

    fmt: str
    params: dict[str, torch.Tensor]
    tables: dict[str, StoredRows]
    head: torch.Tensor
    logical: dict[str, int]


def _quant_kernels(kernels: Kernels, fmt: str, device: torch.device, dtype: torch.dtype) -> Kernels:
    """The kernels for ``fmt`` weights, or a ConfigError naming what to change."""
    if device.type != "cpu":
        raise ConfigError(f"weight_dtype {fmt} runs on the CPU only (device {device}); use --device cpu or "
                          "--weight-dtype bf16")
    if dtype != torch.float32:
        raise ConfigError(f"weight_dtype {fmt} needs fp32 activations (dtype {str(dtype).replace('torch.', '')}); "
                          "use --dtype fp32 (or auto)")
    try:
        return quantized_kernels(kernels, fmt)
    except QuantUnavailableError as exc:
        raise ConfigError(f"weight_dtype {fmt}: {exc}; use --weight-dtype bf16") from exc


def quantized_copy(model: "Model", fmt: str, n_layers: Optional[int] = None) -> "Model":
    """A second ``Model`` running ``model``'s checkpoint with ``fmt`` weights (the quantized drafter).

    It shares the embedding table, norms, biases, RoPE tables and tokenizer with ``model`` (no copy)
    and quantizes the layer matrices from the checkpoint's own dense weights (re-read from disk
    when ``model`` itself is quantized), so memory grows by one packed copy. ``n_layers``: copy only
    the first that many layers (an exit draft's; its layer i still uses cache layer i)."""
    if fmt not in QUANT_FORMATS:
        raise ConfigError(f"quantized format must be one of {', '.join(QUANT_FORMATS)}, got {fmt!r}")
    cls = GPT2Model if model.config.family == "gpt2" else LlamaModel
    kernels = _quant_kernels(model.kernels if model.quant is None else _dense_kernels(model), fmt, model.device,
                             model.dtype)
    cfg = model.config if n_layers is None else replace(model.config, n_layers=n_layers)

    def kept(name: str) -> bool:
        return not name.startswith("layers.") or int(name.split(".")[1]) < cfg.n_layers

    sources: Optional[dict[str, torch.Tensor]] = None
    packed: Optional[dict[str, torch.Tensor]] = None
    if model.quant is not None and Path(model.path).suffix == ".gguf":  # from the file, a matrix at a time
        from .gguf import pack_layers

        packed = pack_layers(Path(model.path), cfg, fmt)
    elif model.quant is not None:
        raw = cls.convert_hf_state_dict(_load_weights(Path(model.path)), model.config)
        sources = {k: v for k, v in raw.items() if k.startswith("layers.") and v.dim() == 2 and kept(k)}
    with torch.device("meta"):
        module = cls(cfg, model.max_seq_len)
    src = cast(LlamaModel | GPT2Model, model.module)
    for name, p in src.named_parameters():  # share everything; packed ones are replaced below
        if not kept(name):
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
        quant.logical = {n: model.quant.logical[n] for n in quant.logical}  # weight counts, not bytes
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
    from .catalog import resolve_named_model

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
        from .gguf import load_tensors, read_gguf

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


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of auto, fp32, bf16, fp16")
    return _DTYPES[dtype]


def resolve_weight_dtype(weight_dtype: str | torch.dtype | None, dtype: torch.dtype, stored: torch.dtype,
                         device: torch.device, fast: bool) -> torch.dtype:
    """Storage dtype of the weight matrices.

    "auto" keeps a bf16 checkpoint's matrices in bf16 under fp32 compute when the
    model runs the small-M CPU kernel (``fast``): it reads bf16 weights directly (half the memory
    traffic of fp32, which is what a decode step costs) and loses nothing, since
    those weights were bf16 to begin with. Otherwise weights follow ``dtype``.
    """
    if weight_dtype is None or weight_dtype == "same":
        return dtype
    if weight_dtype == "auto":
        if device.type == "cpu" and dtype == torch.float32 and stored == torch.bfloat16 and fast:
            return torch.bfloat16
        return dtype
    return resolve_dtype(weight_dtype, device)


def load_model(path: str | os.PathLike[str], device: str = DEFAULT_DEVICE, dtype: str | torch.dtype = DEFAULT_DTYPE,
               weight_dtype: str | torch.dtype | None = DEFAULT_WEIGHT_DTYPE, *, fast: bool = DEFAULT_FAST,
               matmul: str = DEFAULT_MATMUL, kv_dtype: str | torch.dtype = DEFAULT_KV_DTYPE,
               fixed_rows: str | int | None = DEFAULT_FIXED_ROWS, cuda_graphs: bool = False) -> Model:
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
        from .gguf import load_gguf_model

        model = load_gguf_model(root, device, dtype, weight_dtype, fast=fast, matmul=matmul)
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
    from ..chat import read_chat_template

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
        from .graphs import PassGraphs

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


def assemble_model(cfg: ModelConfig, raw: dict[str, torch.Tensor], path: str, tokenizer: Optional[Tokenizer],
                   eos_ids: Sequence[int], device: str, dtype: str | torch.dtype,
                   weight_dtype: str | torch.dtype | None, *, fast: bool, matmul: str,
                   packed: Optional[dict[str, torch.Tensor]] = None) -> Model:
    """A ``Model`` from transformers-named weights ``raw`` (any source: safetensors, GGUF).

    ``packed``: matrices already packed as ``weight_dtype``'s blocks (see ``quantize_module``)."""
    fmt = weight_dtype if isinstance(weight_dtype, str) and weight_dtype in QUANT_FORMATS else None
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but no CUDA GPU is available; use --device cpu")
    dt = resolve_dtype(dtype, dev)
    kernels = select_kernels(fast, matmul, dev)
    if fmt is not None:
        kernels = _quant_kernels(kernels, fmt, dev, dt)
    max_len = min(cfg.max_position_embeddings, MAX_RUNTIME_CONTEXT)
    cls = GPT2Model if cfg.family == "gpt2" else LlamaModel
    with torch.device("meta"):
        module = cls(cfg, max_len)
    stored = next(v for v in raw.values() if v.dim() == 2).dtype
    wdt = resolve_weight_dtype("auto" if fmt else weight_dtype, dt, stored, dev, kernels.fast)
    sd = cls.convert_hf_state_dict(raw, cfg)
    sd = {k: v.to(device=dev, dtype=wdt if v.dim() == 2 else dt) for k, v in sd.items()}
    module.load_state_dict(sd, strict=False, assign=True)
    missing = [n for n, p in module.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights for {missing[:5]}")
    if cfg.family == "llama":  # the RoPE tables were built on the CPU (``rope_inv_freq``)
        module.rope_cos, module.rope_sin = module.rope_cos.to(dev), module.rope_sin.to(dev)
    module.eval().requires_grad_(False)
    quant = quantize_module(module, fmt, packed=packed) if fmt is not None else None
    install_kernels(module, kernels)
    return Model(module, cfg, tokenizer, eos_ids, path, max_len, dt, quant)


def assemble_packed(cfg: ModelConfig, weights: PackedWeights, path: str, tokenizer: Optional[Tokenizer],
                    eos_ids: Sequence[int], dtype: str | torch.dtype, *, fast: bool, matmul: str) -> Model:
    """A CPU ``Model`` from ``weights`` as they are (see ``PackedWeights``); same kernels as ``assemble_model``."""
    dev = torch.device("cpu")
    dt = resolve_dtype(dtype, dev)
    kernels = _quant_kernels(select_kernels(fast, matmul, dev), weights.fmt, dev, dt)
    max_len = min(cfg.max_position_embeddings, MAX_RUNTIME_CONTEXT)
    if cfg.family != "llama":
        raise ValueError(f"stored weights are read for Llama-family models only, not {cfg.family}")
    with torch.device("meta"):
        module = LlamaModel(cfg, max_len)
    for name, t in weights.params.items():
        owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
        value = t if t.dim() == 2 and not t.dtype.is_floating_point else t.to(dt)
        setattr(owner, name.rsplit(".", 1)[-1], nn.Parameter(value, requires_grad=False))
    missing = [n for n, p in module.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights for {missing[:5]}")
    module.tables = dict(weights.tables)
    module.eval().requires_grad_(False)
    install_kernels(module, kernels)
    return Model(module, cfg, tokenizer, eos_ids, path, max_len, dt, QuantState(weights.fmt, weights.head,
                                                                               dict(weights.logical)))


__all__ = ["MAX_RUNTIME_CONTEXT", "ForwardOutput", "Model", "ModelNotFoundError", "PackedWeights", "QuantState",
           "assemble_model", "assemble_packed",
           "load_model", "quantize_module", "quantized_copy", "resolve_dtype", "resolve_kv_dtype", "resolve_model_path",
           "resolve_weight_dtype"]
