"""Held-out α: a draft identical to the target is always accepted; mismatched vocabularies are refused."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specdecode.cli import main as specdecode_cli
from specdecode.drafters import VocabularyMismatchError
from specdecode.train.cli import main as train_cli
from specdecode.train.evaluate import NGramDrafter, evaluate_draft

pytestmark = pytest.mark.slow  # full tier: make test-full

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def test_draft_equal_to_target_has_alpha_one(quick_target: Path, corpus_dir: Path) -> None:
    res = evaluate_draft(quick_target, quick_target, corpus=[str(corpus_dir)], prompts=6, prompt_len=8,
                         new_tokens=12, batch_size=4)
    row = res.row("draft")
    assert row.alpha_t0 == 1.0
    assert row.alpha_t1 == pytest.approx(1.0, abs=1e-5)
    assert res.positions_t0 == 6 * 12
    for name in ("unigram", "bigram"):
        assert 0.0 <= res.row(name).alpha_t0 <= 1.0 and 0.0 < res.row(name).alpha_t1 <= 1.0
    assert "α (T=0)" in str(res) and "bigram" in str(res)


def test_vocab_mismatch_is_refused(tmp_path: Path, quick_target: Path, corpus_dir: Path) -> None:
    import tiny

    other = tiny.build_model(tmp_path / "other", vocab_size=300)  # its own tokenizer
    with pytest.raises(VocabularyMismatchError, match="vocab mismatch between draft"):
        evaluate_draft(quick_target, other, corpus=[str(corpus_dir)], prompts=2, prompt_len=4, new_tokens=4)
    with pytest.raises(VocabularyMismatchError, match="entries differ"):
        train_cli(["eval-draft", "--target", str(quick_target), "--draft", str(other), "--corpus", str(corpus_dir),
                   "--prompts", "2", "--prompt-len", "4", "--new-tokens", "4"])


def test_eval_draft_on_a_mismatched_pair_prints_one_line(tmp_path: Path, quick_target: Path, corpus_dir: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Two checkpoints with different tokenizers: `specdecode eval-draft` exits 2 with the CLI's one-line
    error (the drafters' VocabularyMismatchError), not a traceback."""
    import tiny

    draft = tiny.build_model(tmp_path / "draft", vocab_size=300)  # a tokenizer of its own, not the target's
    capsys.readouterr()  # drop the checkpoint writer's progress bars
    rc = specdecode_cli(["eval-draft", "--target", str(quick_target), "--draft", str(draft),
                         "--corpus", str(corpus_dir), "--prompts", "2", "--prompt-len", "4", "--new-tokens", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("specdecode: error: vocab mismatch between draft"), err


def test_ngram_drafters() -> None:
    stream = np.array([1, 2, 3, 1, 2, 3, 1, 2, 4, 0], dtype=np.int32)
    uni = NGramDrafter(stream, 5, order=1)
    bi = NGramDrafter(stream, 5, order=2)
    seqs = torch.tensor([[1, 2, 3]])
    assert uni(seqs).argmax(-1).tolist() == [[1, 1, 1]] or uni(seqs).argmax(-1).tolist() == [[2, 2, 2]]
    assert bi(seqs).argmax(-1).tolist() == [[2, 3, 1]]
    assert torch.allclose(bi(seqs).exp().sum(-1), torch.ones(1, 3))


def test_eval_cli_writes_json(tmp_path: Path, quick_target: Path, corpus_dir: Path, capsys) -> None:
    out = tmp_path / "a.json"
    assert train_cli(["eval-draft", "--target", str(quick_target), "--draft", str(quick_target), "--corpus",
                      str(corpus_dir), "--prompts", "2", "--prompt-len", "4", "--new-tokens", "4",
                      "--json", str(out)]) == 0
    assert "α (T=1)" in capsys.readouterr().out
    assert '"alpha_t0": 1.0' in out.read_text()
