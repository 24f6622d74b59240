"""A ``tokenizers.Tokenizer`` rebuilt from a GGUF file's vocabulary, merges and pre-tokenizer name.

GGUF stores what llama.cpp needs to tokenize: the token strings, their types, the BPE merges (for
``tokenizer.ggml.model == "gpt2"``) or the SentencePiece scores (``"llama"``), and the name of the
pre-tokenizer (``tokenizer.ggml.pre``), whose split rules live in llama.cpp's code rather than the
file. So the rules are restated here per name, as the Hugging Face tokenizers of those models
define them; a name not in the table is refused by name rather than guessed, since a wrong split
silently changes every prompt's token ids.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from .config import UnsupportedModelError

# GGUF token types (llama.cpp's llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _digits_then_bytes() -> pre_tokenizers.PreTokenizer:
    # StarCoder-family vocabularies (SmolLM's included): every digit apart, then GPT-2's split
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()])


PRE_TOKENIZERS = {
    "default": _byte_level, "gpt2": _byte_level, "gpt-2": _byte_level,
    "smollm": _digits_then_bytes, "starcoder": _digits_then_bytes, "refact": _digits_then_bytes,
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT), "llama3": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
}


def tokenizer_from_gguf(meta: Mapping[str, Any]) -> Optional[Tokenizer]:
    """The file's tokenizer, or None when it carries no vocabulary; ``UnsupportedModelError`` names
    an unsupported tokenizer model or pre-tokenizer."""
    tokens: Optional[Sequence[str]] = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        return None
    kind = meta.get("tokenizer.ggml.model", "gpt2")
    types = list(meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens))
    if kind == "gpt2":
        tok = _bpe(meta, tokens)
    elif kind == "llama":
        tok = _sentencepiece(meta, tokens, types)
    else:
        raise UnsupportedModelError(f"GGUF tokenizer model {kind!r} is not supported; supported: gpt2 (byte-level "
                                    "BPE) and llama (SentencePiece BPE)")
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t == _CONTROL or (t == _UNKNOWN and kind == "gpt2")]
    user = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == _USER_DEFINED]
    tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    bos = meta.get("tokenizer.ggml.bos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama"))
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                           special_tokens=[(tokens[bos], int(bos))])
    return tok


def _bpe(meta: Mapping[str, Any], tokens: Sequence[str]) -> Tokenizer:
    pre = str(meta.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(f"GGUF pre-tokenizer {pre!r} is not supported; supported: "
                                    f"{', '.join(sorted(PRE_TOKENIZERS))}")
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(meta: Mapping[str, Any], tokens: Sequence[str], types: Sequence[int]) -> Tokenizer:
    """SentencePiece BPE as a byte-fallback BPE: merges ranked by the merged piece's score.

    SentencePiece merges the adjacent pair whose union has the highest score; a BPE whose merge
    list is ordered by that score makes the same choices."""
    scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, str, str]] = []
    for piece, pid in vocab.items():
        if types[pid] != _NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[pid], pid, left, right))
    ranked.sort()
    merges = [(a, b) for _, _, a, b in ranked]
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=tokens[unk] if unk is not None else None,
                               fuse_unk=True, byte_fallback=True))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend("\u2581")] if prefix else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "\u2581")])
    tail = [decoders.Strip(" ", 1, 0)] if prefix else []
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *tail])
    return tok
