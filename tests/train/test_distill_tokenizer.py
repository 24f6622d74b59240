"""`distill --tokenizer-vocab N --quick`: a draft with its own BPE, distilled on the target's rollouts as text,
that the crosstok drafter then runs exactly (greedy identity with plain decoding)."""

from __future__ import annotations

from pathlib import Path

import pytest

import specdecode as sd
from specdecode.drafters.crosstok import CrossTokenizerDrafter, shares_vocabulary
from specdecode.train.cli import main as train_cli

pytestmark = pytest.mark.slow  # full tier: make test-full


def test_distill_with_its_own_tokenizer(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    out, run = tmp_path / "draft", tmp_path / "run"
    assert train_cli(["distill", "--quick", "--target", str(quick_target), "--corpus", str(corpus_dir), "--out",
                      str(out), "--run-dir", str(run), "--tokenizer-vocab", "300"]) == 0
    draft, target = sd.load_model(out), sd.load_model(quick_target)
    assert draft.vocab_size == draft.tokenizer.get_vocab_size() == 300 != target.vocab_size
    assert not shares_vocabulary(draft, target)
    assert list(run.glob("rollout-texts-*.json")) and (run / "tokenizer-bpe300" / "tokenizer.json").is_file()
    prompt = "def f(x):\n    return"
    plain = sd.generate(target, prompt, max_new_tokens=16, ignore_eos=True)
    r = sd.generate(target, prompt, drafter=CrossTokenizerDrafter(draft, 4), max_new_tokens=16, ignore_eos=True)
    assert r.token_ids == plain.token_ids and r.stats.drafted > 0
    # a rerun reuses the tokenizer and the rollouts
    assert train_cli(["distill", "--quick", "--target", str(quick_target), "--corpus", str(corpus_dir), "--out",
                      str(tmp_path / "d2"), "--run-dir", str(run), "--tokenizer-vocab", "300", "--steps", "2"]) == 0
