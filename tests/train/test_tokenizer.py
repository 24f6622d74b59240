"""The trained tokenizer loads in transformers and agrees with the tokenizers library."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode.train.tokenizer import EOT, eot_id, load_tokenizer, save_tokenizer, train_tokenizer

SAMPLES = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n", "print('héllo ✓')\n"]


def test_train_save_and_load_in_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tok = train_tokenizer(SAMPLES * 20, vocab_size=300)
    assert eot_id(tok) == 0 and tok.get_vocab_size() <= 300
    save_tokenizer(tok, tmp_path, model_max_length=128)
    ours = load_tokenizer(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in SAMPLES + ["unseen ünïcode → text"]:
        ids = ours.encode(text).ids
        assert ids[0] == 0, "BOS (<|endoftext|>) is prepended"
        assert hf(text).input_ids == ids
        assert ours.decode(ids, skip_special_tokens=True) == text  # byte-level: lossless
    assert hf.eos_token == EOT and hf.bos_token == EOT and hf.eos_token_id == 0


def test_vocab_too_small() -> None:
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer(SAMPLES, vocab_size=100)
