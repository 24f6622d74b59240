"""Run a llama.cpp checkout's ``convert_hf_to_gguf.py`` on one of our checkpoints.

Usage (the bench runs this in a child process, so the converter's imports, logging
and ``sys.exit`` stay out of ours)::

    python -m specdecode.bench.llamacpp_convert CHECKOUT MODEL_DIR OUT.gguf OUTTYPE

Why a wrapper: the converter names a BPE tokenizer's pre-tokenizer by hashing how
it splits a probe string, and knows only published tokenizers' hashes. Ours is
byte-level BPE with GPT-2's split regex (HF ``ByteLevel(use_regex=True)``), which
llama.cpp implements as ``gpt-2``; its hash differs from GPT-2's only because the
vocabulary does. So when the converter gives up, and only then, we check that the
tokenizer really is GPT-2-style and answer ``gpt-2``. The vendored file is never
edited: the mapping is applied at runtime in this process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GPT2_PRE = "gpt-2"
# HF's ByteLevel regex, which tokenizers spells out when a Split step carries it explicitly.
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


def is_gpt2_pretokenizer(pre: Any) -> bool:
    """True iff a tokenizer.json ``pre_tokenizer`` splits text exactly as GPT-2 does: ByteLevel with its
    built-in regex, or the same regex as an explicit Split followed by a regex-free ByteLevel."""
    if not isinstance(pre, dict):
        return False
    if pre.get("type") == "ByteLevel":
        return bool(pre.get("use_regex", True)) and not pre.get("add_prefix_space", False)
    if pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers") or []
        if len(steps) == 1:
            return is_gpt2_pretokenizer(steps[0])
        if len(steps) == 2 and steps[0].get("type") == "Split" and steps[1].get("type") == "ByteLevel":
            pattern = (steps[0].get("pattern") or {}).get("Regex")
            return (pattern == GPT2_REGEX and steps[0].get("behavior") == "Isolated"
                    and not steps[1].get("use_regex", True) and not steps[1].get("add_prefix_space", False))
    return False


def pretokenizer_name(model_dir: Path) -> str:
    """``gpt-2`` for a GPT-2-style byte-level BPE tokenizer.json, else ValueError naming what it has."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no tokenizer.json")
    pre = json.loads(path.read_text(encoding="utf-8")).get("pre_tokenizer")
    if is_gpt2_pretokenizer(pre):
        return GPT2_PRE
    raise ValueError(f"{path}: pre-tokenizer {json.dumps(pre)[:200]} is neither known to llama.cpp's converter "
                     f"nor GPT-2's; no mapping for it")


def install_mapping(text_model_cls: type) -> None:
    """Wrap ``TextModel.get_vocab_base_pre``: the converter's own answer when it has one, else ``gpt-2``
    for a GPT-2-style tokenizer (checked from the checkpoint's tokenizer.json)."""
    original = text_model_cls.get_vocab_base_pre  # type: ignore[attr-defined]

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            name = pretokenizer_name(Path(self.dir_model))
            print(f"specdecode: pre-tokenizer hash not in the converter's table; tokenizer.json is GPT-2-style "
                  f"byte-level BPE -> tokenizer.ggml.pre = {name!r}", file=sys.stderr)
            return name

    text_model_cls.get_vocab_base_pre = get_vocab_base_pre  # type: ignore[attr-defined]

    # Some architectures (Qwen2) try a SentencePiece vocabulary first and fall back to tokenizer.json
    # only on FileNotFoundError; without the sentencepiece package that first try is an ImportError.
    # Our checkpoints have no tokenizer.model, so say so before the import is attempted.
    original_sp = text_model_cls._set_vocab_sentencepiece  # type: ignore[attr-defined]

    def _set_vocab_sentencepiece(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not (Path(self.dir_model) / "tokenizer.model").is_file():
            raise FileNotFoundError(f"{self.dir_model} has no tokenizer.model: its vocabulary is tokenizer.json's")
        return original_sp(self, *args, **kwargs)

    text_model_cls._set_vocab_sentencepiece = _set_vocab_sentencepiece  # type: ignore[attr-defined]


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    checkout, model_dir, out, outtype = argv
    root = Path(checkout).resolve()
    sys.path[:0] = [str(root), str(root / "gguf-py")]
    sys.argv = [str(root / "convert_hf_to_gguf.py"), model_dir, "--outfile", out, "--outtype", outtype]
    import convert_hf_to_gguf  # noqa: E402  (the checkout's converter, found on the path set above)

    try:
        from conversion.base import TextModel  # llama.cpp >= late 2025: the model classes live in conversion/
    except ImportError:
        TextModel = convert_hf_to_gguf.TextModel  # older checkouts: one file
    install_mapping(TextModel)
    convert_hf_to_gguf.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
