"""ModelConfig: the few numbers our runtime needs, read from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its options is not implemented."""


SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "GPT2LMHeadModel": "gpt2",
}


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    family: str  # "llama" or "gpt2": which module implements it
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    tie_embeddings: bool
    qkv_bias: bool = False
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict[str, Any]] = None
    activation: str = "silu"
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = field(default=())

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else _arch_from_model_type(cfg.get("model_type"))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {arch!r} (model_type={cfg.get('model_type')!r}); "
                f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
        if family == "gpt2":
            return _gpt2_config(arch, cfg, eos_ids)
        return _llama_config(arch, cfg, eos_ids)


def _arch_from_model_type(model_type: Optional[str]) -> str:
    by_type = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "gpt2": "GPT2LMHeadModel"}
    return by_type.get(model_type or "", f"<none; model_type={model_type}>")


def _llama_config(arch: str, cfg: dict[str, Any], eos_ids: tuple[int, ...]) -> ModelConfig:
    n_heads = cfg["num_attention_heads"]
    dim = cfg["hidden_size"]
    max_pos = cfg.get("max_position_embeddings", 2048)
    if arch == "MistralForCausalLM" and cfg.get("sliding_window"):
        # Plain llama is exact as long as no sequence outgrows the window.
        max_pos = min(max_pos, int(cfg["sliding_window"]))
    if arch == "Qwen2ForCausalLM" and cfg.get("use_sliding_window"):
        raise UnsupportedModelError("Qwen2 with use_sliding_window=true is not supported; set it to false")
    scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    rope_params = cfg.get("rope_parameters")  # transformers >= 5 writes RoPE settings here
    if isinstance(rope_params, dict):
        theta = rope_params.get("rope_theta", theta)
        if rope_params.get("rope_type", "default") != "default":
            scaling = rope_params
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in ("llama3", "linear", "default"):
            raise UnsupportedModelError(f"unsupported rope_scaling type {kind!r}; supported: llama3, linear")
        if kind == "default":
            scaling = None
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"unsupported hidden_act {act!r} for {arch}; supported: silu")
    return ModelConfig(
        architecture=arch,
        family="llama",
        vocab_size=cfg["vocab_size"],
        dim=dim,
        n_layers=cfg["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=cfg.get("head_dim") or dim // n_heads,
        intermediate_size=cfg["intermediate_size"],
        max_position_embeddings=max_pos,
        norm_eps=cfg.get("rms_norm_eps", 1e-6),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
        rope_theta=float(theta if theta is not None else 10000.0),
        rope_scaling=scaling,
        activation=act,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


def _gpt2_config(arch: str, cfg: dict[str, Any], eos_ids: tuple[int, ...]) -> ModelConfig:
    if cfg.get("scale_attn_by_inverse_layer_idx") or cfg.get("reorder_and_upcast_attn"):
        raise UnsupportedModelError(
            "GPT-2 with scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn is not supported")
    act = cfg.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu", "gelu_pytorch_tanh", "relu"):
        raise UnsupportedModelError(f"unsupported GPT-2 activation_function {act!r}")
    dim = cfg["n_embd"]
    n_heads = cfg["n_head"]
    return ModelConfig(
        architecture=arch,
        family="gpt2",
        vocab_size=cfg["vocab_size"],
        dim=dim,
        n_layers=cfg["n_layer"],
        n_heads=n_heads,
        n_kv_heads=n_heads,
        head_dim=dim // n_heads,
        intermediate_size=cfg.get("n_inner") or 4 * dim,
        max_position_embeddings=cfg.get("n_positions", 1024),
        norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
        tie_embeddings=True,
        activation=act,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )
