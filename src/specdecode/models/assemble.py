"""Build a ``Model`` from weights already in memory (whatever file they came from: ``loading.py`` reads
safetensors, ``gguf_load.py`` GGUF), with the dtype rules and the quantized packing both share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from tokenizers import Tokenizer
from torch import nn

from ..config import ConfigError
from ..kernels import Kernels, for_weights, install_kernels, select_kernels
from ..kernels.quant import QUANT_FORMATS, QuantUnavailableError, quantize, quantized_kernels
from .config import ModelConfig
from .gpt2 import GPT2Model
from .llama import LlamaModel
from .model import Model, QuantState
from .tables import StoredRows

# RoPE/position tables and caches are sized to this many tokens at most, so a
# 128k-context config does not allocate 128k-row tables on a laptop.
MAX_RUNTIME_CONTEXT = 16384

_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


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


def checked_quant_kernels(kernels: Kernels, fmt: str, device: torch.device, dtype: torch.dtype) -> Kernels:
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
        kernels = checked_quant_kernels(kernels, fmt, dev, dt)
    max_len = min(cfg.max_position_embeddings, MAX_RUNTIME_CONTEXT)
    cls = GPT2Model if cfg.family == "gpt2" else LlamaModel
    with torch.device("meta"):
        module = cls(cfg, max_len)
    stored = next(v for v in raw.values() if v.dim() == 2).dtype
    wdt = resolve_weight_dtype("auto" if fmt else weight_dtype, dt, stored, dev, kernels.fast)
    sd = cls.convert_hf_state_dict(raw, cfg)
    sd = {k: v.to(device=dev, dtype=wdt if v.dim() == 2 else dt) for k, v in sd.items()}
    if fmt is None:  # dense weights: where a decode step reads them from, the kernel's stream layout
        kernels = for_weights(kernels, sum(v.numel() * v.element_size() for v in sd.values() if v.dim() == 2))
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
    kernels = checked_quant_kernels(select_kernels(fast, matmul, dev), weights.fmt, dev, dt)
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
