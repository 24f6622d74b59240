"""A Qwen2.5-0.5B-shaped checkpoint with random weights, for cost figures where memory bandwidth rules.

The bundled 26.7M target fits in a CPU's caches, so its timings say little about a real model,
whose decode step streams every weight byte from DRAM. This writes a ``Qwen2ForCausalLM`` body of
Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 query / 2 KV heads of 64, FFN 4864, q/k/v bias,
tied embeddings, RoPE theta 1e6) as a bf16 safetensors Hugging Face checkpoint, with the bundled
tokenizer (``models/code-target``) and its vocabulary size (8192 by default, not Qwen's 151936: the
body is the real one, the embedding/output matrix is small, ~2% of the bytes instead of ~27%).

**The weights are random.** Use it for tok/s, the verification cost ratio v(gamma) and the
bytes-per-weight comparisons of bf16 / int8 / int4. Acceptance rates, perplexity and the
text it generates mean nothing on random weights; do not report them.

    python scripts/make_qwen05b_shape.py [--out runs/qwen05b-shape] [--tokenizer models/code-target]
                                         [--vocab-size N] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 896, 24, 14, 2, 64, 4864
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def hf_config(vocab_size: int, eos: int) -> dict:
    """Qwen2.5-0.5B's config.json with our vocabulary and a runtime-sized context."""
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": vocab_size, "hidden_size": HIDDEN, "intermediate_size": FFN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "hidden_act": "silu", "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "use_sliding_window": False,
        "tie_word_embeddings": True, "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos,
        "initializer_range": 0.02, "torch_dtype": "bfloat16", "use_cache": True,
        "note": "random weights: acceptance, perplexity and generated text mean nothing; cost figures only",
    }


def random_weights(vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    """HF Qwen2 tensor names, normal(0, 0.02) matrices (output projections scaled by 1/sqrt(2L) so the
    residual stream stays bounded over 24 layers), unit norms, small biases; stored bf16."""
    g = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    out_std = 0.02 / (2 * LAYERS) ** 0.5
    sd = {"model.embed_tokens.weight": normal(vocab_size, HIDDEN),
          "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = normal(HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.k_proj.weight"] = normal(KV_HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.v_proj.weight"] = normal(KV_HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.q_proj.bias"] = normal(HEADS * HEAD_DIM)
        sd[p + "self_attn.k_proj.bias"] = normal(KV_HEADS * HEAD_DIM)
        sd[p + "self_attn.v_proj.bias"] = normal(KV_HEADS * HEAD_DIM)
        sd[p + "self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * HEAD_DIM, std=out_std)
        sd[p + "mlp.gate_proj.weight"] = normal(FFN, HIDDEN)
        sd[p + "mlp.up_proj.weight"] = normal(FFN, HIDDEN)
        sd[p + "mlp.down_proj.weight"] = normal(HIDDEN, FFN, std=out_std)
        sd[p + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    return sd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/qwen05b-shape")
    ap.add_argument("--tokenizer", default="models/code-target", help="checkpoint whose tokenizer files are copied")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="embedding rows (default: the tokenizer's vocabulary size; 151936 gives Qwen's real "
                         "output-layer cost, ids past the tokenizer's are never produced by it)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    src, out = Path(args.tokenizer), Path(args.out)
    from tokenizers import Tokenizer

    tok_vocab = Tokenizer.from_file(str(src / "tokenizer.json")).get_vocab_size()
    vocab = args.vocab_size or tok_vocab
    if vocab < tok_vocab:
        raise SystemExit(f"--vocab-size {vocab} is smaller than the tokenizer's {tok_vocab}")
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    gen = out / "generation_config.json"
    eos = int(json.loads(gen.read_text()).get("eos_token_id", 0)) if gen.is_file() else 0
    (out / "config.json").write_text(json.dumps(hf_config(vocab, eos), indent=2) + "\n")
    sd = random_weights(vocab, args.seed)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    n = sum(v.numel() for v in sd.values())
    print(f"wrote {out}: {n / 1e6:.1f}M random parameters ({n * 2 / 2**20:.0f} MiB bf16), vocab {vocab}; "
          "random weights: cost figures only, acceptance means nothing")


if __name__ == "__main__":
    main()
