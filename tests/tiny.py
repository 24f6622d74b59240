"""Build tiny real Hugging Face checkpoints with transformers (no downloads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

TEXT = (
    "def add(a, b):\n    return a + b\n\n"
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n"
) * 4


def build_tokenizer(out: Path, vocab_size: int = 300) -> int:
    """A byte-level BPE tokenizer.json with an <eos> token; returns the eos id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT], trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    return tok.token_to_id("<eos>")


def build_model(out: Path, arch: str = "llama", vocab_size: Optional[int] = None, seed: int = 0,
                hidden: int = 64, layers: int = 2, tokenizer: bool = True, **overrides: object) -> Path:
    """Save a random tiny checkpoint of ``arch`` (llama, qwen2, qwen3, gemma3, mistral, gpt2) to ``out``.

    qwen3 and gemma3 get random norm weights too (their q/k norms and Gemma's 1 + w must be exercised)."""
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    eos = build_tokenizer(out) if tokenizer else 0
    if vocab_size is None:
        vocab_size = 300 if tokenizer else 16
    torch.manual_seed(seed)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=4,
                                      n_positions=256, eos_token_id=eos, bos_token_id=eos, **overrides)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cls_cfg = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                   "qwen3": transformers.Qwen3Config, "gemma3": transformers.Gemma3TextConfig,
                   "mistral": transformers.MistralConfig}[arch]
        kw = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden + 16,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, eos_token_id=eos, bos_token_id=eos, tie_word_embeddings=False)
        if arch in ("qwen3", "gemma3"):
            kw["head_dim"] = hidden // 4
        if arch == "gemma3":
            kw.update(tie_word_embeddings=True, pad_token_id=eos, query_pre_attn_scalar=hidden // 4 + 8)
        kw.update(overrides)
        cfg = cls_cfg(**kw)
        model = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                 "qwen3": transformers.Qwen3ForCausalLM, "gemma3": transformers.Gemma3ForCausalLM,
                 "mistral": transformers.MistralForCausalLM}[arch](cfg)
    with torch.no_grad():  # random init is tiny; widen it so logits differ and sampling is non-trivial
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3)
            elif arch in ("qwen3", "gemma3"):
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return out
