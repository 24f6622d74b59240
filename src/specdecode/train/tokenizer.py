"""Byte-level BPE tokenizer trained on the corpus, saved so both runtimes load it.

Byte-level means any text round-trips (no <unk>), which matters for code full of
odd symbols. One special token, ``<|endoftext|>``, is BOS, EOS, PAD and the
document separator; a post-processor prepends it on encode, so a prompt looks
exactly like the start of a training document in our runtime and in transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

EOT = "<|endoftext|>"
SPECIAL_TOKENS = [EOT]
DEFAULT_VOCAB_SIZE = 8192


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE,
                    show_progress: bool = False) -> Tokenizer:
    """Train byte-level BPE with ``<|endoftext|>`` as id 0."""
    if vocab_size < 257 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} is too small: byte-level BPE needs at least "
                         f"{257 + len(SPECIAL_TOKENS)} (256 bytes + special tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=show_progress)
    tok.train_from_iterator(texts, trainer=trainer)
    eot = tok.token_to_id(EOT)
    tok.post_processor = processors.TemplateProcessing(single=f"{EOT} $A", pair=f"{EOT} $A {EOT} $B",
                                                       special_tokens=[(EOT, eot)])
    return tok


def eot_id(tok: Tokenizer) -> int:
    i = tok.token_to_id(EOT)
    if i is None:
        raise ValueError(f"tokenizer has no {EOT} token")
    return i


def save_tokenizer(tok: Tokenizer, out: Path, model_max_length: int) -> None:
    """tokenizer.json + tokenizer_config.json (transformers' AutoTokenizer -> PreTrainedTokenizerFast)."""
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT,
        "eos_token": EOT,
        "pad_token": EOT,
        "unk_token": None,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    special = {"bos_token": EOT, "eos_token": EOT, "pad_token": EOT}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


TOKENIZER_FILES: Sequence[str] = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def load_tokenizer(path: Path) -> Tokenizer:
    f = Path(path) / "tokenizer.json" if Path(path).is_dir() else Path(path)
    if not f.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    return Tokenizer.from_file(str(f))


def encode_batch_fn(tok: Tokenizer):
    """Batch encoder without special tokens (documents get separators from data.token_stream)."""
    def enc(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    return enc


__all__ = ["DEFAULT_VOCAB_SIZE", "EOT", "TOKENIZER_FILES", "encode_batch_fn", "eot_id", "load_tokenizer",
           "save_tokenizer", "train_tokenizer"]
