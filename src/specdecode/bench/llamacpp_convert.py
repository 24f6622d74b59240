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

A draft with an FR-Spec cut (``draft_vocab.json``) was trained on its cut's logits only: over the
full vocabulary its argmax falls outside the cut at almost every position (SmolLM2's one-block
draft: 99.8%). llama.cpp has no cut, so the draft is converted from a staged copy whose output
matrix is untied and zero outside the cut. Those tokens then score exactly 0, below the cut's best
logit wherever that is positive (on SmolLM2's draft, at every one of 4,800 positions checked), so
llama.cpp's greedy draft proposes what ours does, at the price of a full-width output matrix.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from ..drafters.vocab import read_vocab_file

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


def stage_vocab_cut(model_dir: Path, dest: Path) -> Path:
    """``model_dir`` itself without a cut, else a copy at ``dest`` whose untied output matrix is zero
    outside the cut (module doc)."""
    data = read_vocab_file(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    vocab = int(config["vocab_size"])
    if data is None or int(data.get("size", vocab)) >= vocab:
        return model_dir
    shards = sorted(model_dir.glob("*.safetensors"))
    if len(shards) != 1:
        raise ValueError(f"{model_dir}: expected one .safetensors file for a cut draft, found {len(shards)}")
    weights = load_file(str(shards[0]))
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"]).clone()
    keep = head.new_zeros(vocab, 1)
    keep[data["token_ids"][:int(data["size"])]] = 1
    weights["lm_head.weight"] = head * keep
    dest.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "draft_vocab.json"):
            shutil.copy2(f, dest / f.name)
    (dest / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}, indent=1))
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    checkout, model_dir, out, outtype = argv
    root = Path(checkout).resolve()
    staged = Path(out).parent / "staged-vocab-cut"
    model_dir = str(stage_vocab_cut(Path(model_dir), staged))
    sys.path[:0] = [str(root), str(root / "gguf-py")]
    sys.argv = [str(root / "convert_hf_to_gguf.py"), model_dir, "--outfile", out, "--outtype", outtype]
    import convert_hf_to_gguf  # noqa: E402  (the checkout's converter, found on the path set above)

    try:
        from conversion.base import TextModel  # llama.cpp >= late 2025: the model classes live in conversion/
    except ImportError:
        TextModel = convert_hf_to_gguf.TextModel  # older checkouts: one file
    install_mapping(TextModel)
    try:
        convert_hf_to_gguf.main()
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
