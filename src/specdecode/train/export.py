"""Write a trained LlamaModel as a Hugging Face directory (config, safetensors, tokenizer, generation config).

The directory is the interchange format: ``specdecode.models.load_model`` and
``transformers.AutoModelForCausalLM`` both read it, so tests can check that the
two runtimes agree on every logit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import save_file

from ..models.config import ModelConfig
from ..models.llama import LlamaModel, to_hf_state_dict
from .tokenizer import TOKENIZER_FILES

SAVE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def hf_config(cfg: ModelConfig, dtype: str) -> dict:
    bos = cfg.bos_token_id
    eos = cfg.eos_token_ids[0] if cfg.eos_token_ids else None
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}[dtype],
    }


def save_hf(model: LlamaModel, out: Path, dtype: str = "bf16", tokenizer_dir: Optional[Path] = None,
            extra: Optional[dict] = None) -> Path:
    """Write ``out`` as a Hugging Face Llama directory; ``tokenizer_dir``'s tokenizer files are copied in."""
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"unknown save dtype {dtype!r}; use one of {', '.join(SAVE_DTYPES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg
    sd = {k: v.detach().to("cpu", SAVE_DTYPES[dtype]) for k, v in model.state_dict().items()}
    save_file(to_hf_state_dict(sd, cfg), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(cfg, dtype), indent=2) + "\n")
    eos = cfg.eos_token_ids[0] if cfg.eos_token_ids else None
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": eos, "pad_token_id": eos}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.is_file() and src.resolve() != (out / name).resolve():
                shutil.copyfile(src, out / name)
    if extra:
        (out / "training_info.json").write_text(json.dumps(extra, indent=2, default=str) + "\n")
    return out
