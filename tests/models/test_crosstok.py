"""Cross-tokenizer drafting (SLEM, drafters/crosstok.py): greedy output is token-identical to plain
decoding on three architectures with a draft whose tokenizer differs from the target's; the text
round trip really proposes accepted tokens; the stable-prefix cut never proposes a token that more
text would change."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import build_model, build_tokenizer

import specdecode as sd
from specdecode.drafters.crosstok import CrossTokenizerDrafter, stable_prefix

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"
NEW = 24


@pytest.fixture(scope="module")
def other_tok_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama draft with its own byte-level BPE of 280 tokens (the targets' has 300)."""
    out = build_model(tmp_path_factory.mktemp("xtok") / "draft", "llama", seed=7, layers=1, hidden=32)
    build_tokenizer(out, vocab_size=280)
    return out


def test_the_draft_really_has_another_tokenizer(tiny_dirs: dict[str, Path], other_tok_draft: Path) -> None:
    target, draft = sd.load_model(tiny_dirs["llama"]), sd.load_model(other_tok_draft)
    assert draft.tokenizer.get_vocab() != target.tokenizer.get_vocab()
    with pytest.raises(sd.VocabularyMismatchError, match="--drafter crosstok"):
        sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, 4), max_new_tokens=4)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_identity_with_another_tokenizer(tiny_dirs: dict[str, Path], other_tok_draft: Path, arch: str,
                                                gamma: int) -> None:
    target = sd.load_model(tiny_dirs[arch])
    plain = sd.generate(target, PROMPT, max_new_tokens=NEW, ignore_eos=True)
    for draft in (sd.load_model(other_tok_draft), target):  # another tokenizer; the target itself, through text
        r = sd.generate(target, PROMPT, drafter=CrossTokenizerDrafter(draft, gamma), max_new_tokens=NEW,
                        ignore_eos=True)
        assert r.token_ids == plain.token_ids
        assert r.text == plain.text


BUNDLED = Path(__file__).resolve().parents[2] / "models" / "code-target"


@pytest.mark.skipif(not (BUNDLED / "config.json").is_file(), reason="bundled target not present")
def test_text_round_trip_proposes_what_the_target_writes() -> None:
    """The trained target as its own draft through text: every proposal is accepted (a broken re-sync,
    offset or stable cut would make some wrong). A random tiny model cannot show this: it writes
    non-canonical token sequences, whose re-tokenized text it would continue differently."""
    target = sd.load_model(BUNDLED)
    prompt = "import os\n\ndef main(argv):\n    \"\"\"Parse the arguments.\"\"\"\n    parser = "
    plain = sd.generate(target, prompt, max_new_tokens=40, ignore_eos=True)
    r = sd.generate(target, prompt, drafter=CrossTokenizerDrafter(target, 4), max_new_tokens=40, ignore_eos=True)
    assert r.token_ids == plain.token_ids
    assert r.stats.alpha > 0.9, r.stats.alpha
    assert r.stats.target_passes <= 12


def test_stable_prefix_is_stable(tiny_dirs: dict[str, Path]) -> None:
    tok = sd.load_model(tiny_dirs["llama"]).tokenizer
    text = "    return fib(n - 1) + fib(n - 2)\n\nprint(fib(10))  # done\n"
    full = tok.encode(text, add_special_tokens=False).ids
    proposed = 0
    for cut in range(1, len(text)):
        ids, total = stable_prefix(tok, text[:cut])
        assert full[: len(ids)] == ids, repr(text[:cut])  # extending the text never changes them
        assert total >= len(ids)
        proposed += len(ids)
    assert proposed > len(text)  # and it is not vacuous


def test_incremental_retokenization_equals_encoding_the_whole_text(tiny_dirs: dict[str, Path],
                                                                   other_tok_draft: Path) -> None:
    """The drafter re-encodes only a tail of a growing text; the ids equal a full encode."""
    target, draft = sd.load_model(tiny_dirs["llama"]), sd.load_model(other_tok_draft)
    d = CrossTokenizerDrafter(draft, 4)
    d.prepare(target)
    text = PROMPT + "    return fib(n - 1) + fib(n - 2)\n\n\nprint(fib(10))  # héllo wörld\n" * 3
    full = lambda t: draft.tokenizer.encode(t, add_special_tokens=False).ids  # noqa: E731
    for cut in range(1, len(text), 3):
        assert d._encode(0, text[:cut]) == full(text[:cut]), repr(text[:cut][-20:])
    assert d._encode(0, "x = 1") == full("x = 1")  # not an extension: encoded from scratch
