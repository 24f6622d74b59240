"""add_subcommands wires train / distill / eval-draft into any argparse CLI."""

from __future__ import annotations

import argparse

import pytest

from specdecode.train.cli import add_subcommands, main

pytestmark = pytest.mark.slow  # full tier: make test-full


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specdecode")
    add_subcommands(p.add_subparsers(dest="command", required=True))
    return p


def test_subcommands_and_defaults() -> None:
    p = _parser()
    a = p.parse_args(["train"])
    assert a.command == "train" and a.vocab_size == 8192 and a.out == "models/code-target" and callable(a.func)
    a = p.parse_args(["distill", "--target", "t", "--loss", "tv"])
    assert a.target == "t" and a.loss == "tv" and a.out == "models/code-draft"
    a = p.parse_args(["eval-draft", "--target", "t", "--draft", "d"])
    assert a.prompts == 64 and a.new_tokens == 128


@pytest.mark.parametrize("cmd,flag", [("train", "--kv-heads"), ("distill", "--onpolicy-seqs"),
                                      ("eval-draft", "--new-tokens")])
def test_help_mentions_flags(cmd: str, flag: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        _parser().parse_args([cmd, "--help"])
    assert e.value.code == 0
    assert flag in capsys.readouterr().out


def test_eval_draft_requires_target() -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["eval-draft"])


def test_draft_vocab_command(tmp_path, quick_target, corpus_dir, capsys) -> None:
    import json
    import shutil

    from specdecode.drafters.vocab import draft_vocab_for
    from specdecode.models import load_model

    draft = tmp_path / "draft"
    shutil.copytree(quick_target, draft)
    assert main(["draft-vocab", "--draft", str(draft), "--corpus", str(corpus_dir), "--size", "64"]) == 0
    assert "64 of" in capsys.readouterr().out
    data = json.loads((draft / "draft_vocab.json").read_text())
    assert data["size"] == 64 and 0 < data["coverage"] <= 1
    v = draft_vocab_for(load_model(draft), "auto")
    assert v is not None and v.size == 64
    with pytest.raises(ValueError, match="--size"):
        main(["draft-vocab", "--draft", str(draft), "--corpus", str(corpus_dir), "--size", "0"])
