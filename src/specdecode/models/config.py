"""ModelConfig: the few numbers our runtime needs, read from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its options is not implemented."""


class ModelNotFoundError(FileNotFoundError):
    """No checkpoint at the path or name given (this tool never downloads by itself)."""


SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",
    "Gemma3ForCausalLM": "llama",
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
    activation: str = "silu"  # of the gate: "silu", or "gelu_pytorch_tanh" (Gemma); GPT-2 has its own
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = field(default=())
    # Qwen 3 and Gemma 3 additions to the llama block; the defaults are plain llama
    qk_norm: bool = False  # an RMSNorm (weights of head_dim, shared by the heads) on each q and k head before RoPE
    norm_offset: float = 0.0  # added to every RMSNorm weight at load: Gemma's norms compute x * (1 + w)
    sandwich_norms: bool = False  # Gemma: attention and MLP outputs are normed too, before their residual adds
    embed_scale: float = 1.0  # Gemma: the embedding rows are multiplied by sqrt(dim)
    attn_scale: Optional[float] = None  # the softmax scale; None: head_dim ** -0.5
    sliding_window: Optional[int] = None  # on ``sliding_layers`` a query sees the keys < this many positions back
    sliding_layers: tuple[int, ...] = ()
    rope_local_theta: Optional[float] = None  # the RoPE base of ``sliding_layers`` (unscaled); None: rope_theta

    @property
    def plain_llama(self) -> bool:
        """Whether the block is exactly Llama's (what the fused CPU ops of ``decode_ops.cpp`` implement)."""
        return (self.activation == "silu" and not self.qk_norm and not self.sandwich_norms and not self.sliding_layers
                and self.embed_scale == 1.0 and self.attn_scale is None and self.norm_offset == 0.0)

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
               "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
               "gpt2": "GPT2LMHeadModel"}
    return by_type.get(model_type or "", f"<none; model_type={model_type}>")


def _llama_config(arch: str, cfg: dict[str, Any], eos_ids: tuple[int, ...]) -> ModelConfig:
    n_heads = cfg["num_attention_heads"]
    dim = cfg["hidden_size"]
    max_pos = cfg.get("max_position_embeddings", 2048)
    gemma = arch == "Gemma3ForCausalLM"
    if arch == "MistralForCausalLM" and cfg.get("sliding_window"):
        # Plain llama is exact as long as no sequence outgrows the window.
        max_pos = min(max_pos, int(cfg["sliding_window"]))
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and cfg.get("use_sliding_window"):
        name = arch.removesuffix("ForCausalLM")
        raise UnsupportedModelError(f"{name} with use_sliding_window=true is not supported; set it to false")
    if arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM") and cfg.get("attention_bias"):
        raise UnsupportedModelError(f"{arch} with attention_bias=true (an o_proj bias too) is not supported")
    local_theta: Optional[float] = None
    rope_cfg = cfg
    if gemma:
        rope_cfg, local_theta = _gemma3_rope(cfg)
    theta, scaling = _rope(rope_cfg)
    act = (cfg.get("hidden_activation") or "gelu_pytorch_tanh") if gemma else cfg.get("hidden_act", "silu")
    if act != ("gelu_pytorch_tanh" if gemma else "silu"):
        raise UnsupportedModelError(f"unsupported hidden activation {act!r} for {arch}; supported: "
                                    f"{'gelu_pytorch_tanh' if gemma else 'silu'}")
    base = ModelConfig(
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
        tie_embeddings=bool(cfg.get("tie_word_embeddings", gemma)),
        qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
        rope_theta=theta,
        rope_scaling=scaling,
        activation=act,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        qk_norm=arch == "Qwen3ForCausalLM",
    )
    return replace(base, **_gemma3_fields(cfg, base.n_layers, local_theta)) if gemma else base


def _rope(cfg: dict[str, Any]) -> tuple[float, Optional[dict[str, Any]]]:
    """(base, scaling) of a config's RoPE, from its rope_theta/rope_scaling or transformers 5's rope_parameters."""
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
    return float(theta if theta is not None else 10000.0), scaling


def _gemma3_rope(cfg: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """Gemma 3's two RoPEs: (the global layers' settings as a llama config states them, the sliding layers'
    base). transformers 5 writes ``rope_parameters`` per layer type; older configs rope_theta (global, maybe
    with rope_scaling) and rope_local_base_freq. transformers' defaults are 1e6 and 1e4."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and ("full_attention" in params or "sliding_attention" in params):
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if local.get("rope_type", "default") != "default":
            raise UnsupportedModelError(f"Gemma 3 with rope_type {local['rope_type']!r} on its sliding layers "
                                        "is not supported")
        return {"rope_parameters": {"rope_theta": 1e6, **full}}, float(local.get("rope_theta", 10000.0))
    theta = cfg.get("rope_theta")
    return ({"rope_theta": 1e6 if theta is None else theta, "rope_scaling": cfg.get("rope_scaling")},
            float(cfg.get("rope_local_base_freq") or 10000.0))


def _gemma3_fields(cfg: dict[str, Any], n_layers: int, local_theta: Optional[float]) -> dict[str, Any]:
    """What Gemma 3 (text) adds to the llama block, as transformers' Gemma3TextModel computes it."""
    if "text_config" in cfg:
        raise UnsupportedModelError("multimodal Gemma 3 (Gemma3ForConditionalGeneration) is not supported; "
                                    "use a text-only Gemma3ForCausalLM checkpoint")
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "use_bidirectional_attention"):
        if cfg.get(key):
            raise UnsupportedModelError(f"Gemma 3 with {key}={cfg[key]!r} is not supported")
    pattern = int(cfg.get("sliding_window_pattern") or 6)
    types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                       for i in range(n_layers)]
    window = cfg.get("sliding_window")
    return dict(
        qk_norm=True, norm_offset=1.0, sandwich_norms=True, embed_scale=cfg["hidden_size"] ** 0.5,
        attn_scale=float(cfg.get("query_pre_attn_scalar") or 256) ** -0.5,
        sliding_window=int(window) if window else None,
        sliding_layers=tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
        rope_local_theta=local_theta,
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
