"""``distill --prompts FILE.jsonl`` (chat-templated prompts for self-distillation), ragged rollouts, the
target's weight format for the trainers, and the prompt-set builder with its held-out check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdecode.config import ConfigError
from specdecode.drafters.eagle_model import EXTRA_FILE
from specdecode.models import load_model
from specdecode.train.chat_prompts import is_held_out, load_chat_prompts
from specdecode.train.cli import main as train_cli
from specdecode.train.prompt_set import held_out_filter
from specdecode.train.rollout import generate, generate_ragged
from specdecode.train.selfdistill import chat_prompt_order


def _prompts(path: Path, n: int = 60) -> Path:
    recs = []
    for i in range(n):
        if i % 3 == 0:
            recs.append({"messages": [{"role": "user", "content": f"def alpha_{i}(beta): return beta + {i}"}]})
        elif i % 3 == 1:
            recs.append({"prompt": f"count = total + {i}"})
        else:
            recs.append({"text": f"def gamma_{i}(delta):\n    return delta"})
    recs.append({"prompt": "x " * 200})  # over --prompt-len: skipped
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_generate_ragged_equals_generate_per_row(quick_target: Path) -> None:
    m = load_model(quick_target)
    prompts = [[1, 5, 9, 20, 33], [1, 7], [1, 4, 4, 4, 9, 10, 11, 12]]
    out = generate_ragged(m, prompts, 16, 0.0)
    assert out.shape == (3, 16)
    for i, p in enumerate(prompts):
        assert torch.equal(out[i], generate(m, torch.tensor([p]), 16 - len(p), 0.0)[0])
    with pytest.raises(ValueError, match="1..15"):
        generate_ragged(m, [[1] * 16], 16, 0.0)


def test_load_chat_prompts_split_and_errors(tmp_path: Path, quick_target: Path) -> None:
    m = load_model(quick_target)
    cp = load_chat_prompts(m, _prompts(tmp_path / "p.jsonl", 200), max_len=40)
    assert cp.too_long == 1 and len(cp.train) + len(cp.held_out) == 200 and 0 < len(cp.held_out) < 30
    assert all(0 < len(t) <= 40 for t in cp.train + cp.held_out)
    assert is_held_out("x") in (True, False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match="'messages', 'prompt' or 'text'"):
        load_chat_prompts(m, bad, 40)
    assert sorted(chat_prompt_order(5, 5, 5, 0)) == [0, 1, 2, 3, 4]  # greedy rollouts: distinct prompts
    assert len(chat_prompt_order(5, 12, 5, 0)) == 12


def test_eagle_with_prompts_file(tmp_path: Path, quick_target: Path, corpus_dir: Path, capsys) -> None:
    prompts = _prompts(tmp_path / "p.jsonl")
    out, run = tmp_path / "e", tmp_path / "r"
    assert train_cli(["distill", "--method", "eagle", "--quick", "--target", str(quick_target), "--corpus",
                      str(corpus_dir), "--out", str(out), "--run-dir", str(run), "--threads", "1", "--steps", "2",
                      "--prompts", str(prompts), "--prompt-len", "24", "--gen-len", "12", "--sample-temperature",
                      "0.7", "--target-weight-dtype", "fp32", "--corpus-seqs", "0"]) == 0
    err = capsys.readouterr().err
    assert "training prompts from" in err and "1 over --prompt-len 24 skipped" in err and "T=0.7" in err
    (data,) = run.glob("eagle-data-*.pt")
    ds = torch.load(data, weights_only=True)
    assert ds["tokens"].shape == (8, 36)  # --quick's 8 rollouts, each prompt + answer to 24 + 12 tokens
    extra = json.loads((out / EXTRA_FILE).read_text())
    assert (out / "draft_vocab.json").is_file() and extra["recipe"]["prompts"] == str(prompts)
    assert extra["recipe"]["target_weight_dtype"] == "fp32" and len(extra["depth_acceptance"]) == 6


def test_prompt_flags_need_a_frozen_method(tmp_path: Path, quick_target: Path) -> None:
    with pytest.raises(ConfigError, match="--prompts"):
        train_cli(["distill", "--quick", "--target", str(quick_target), "--out", str(tmp_path / "d"),
                   "--prompts", str(_prompts(tmp_path / "p.jsonl"))])


def test_held_out_filter_drops_a_workload_prompt() -> None:
    from specdecode.bench.heldout import prompt_text
    from specdecode.bench.workloads import load_workloads, resolve_workload

    w = load_workloads(resolve_workload("real"))[0]
    recs = [{"messages": [{"role": "user", "content": "Explain " + prompt_text(w)}]},
            {"messages": [{"role": "user", "content": "What is the water cycle?"}]}]
    kept, report = held_out_filter(recs)
    assert kept == recs[1:] and "1 of 2 generated prompts dropped" in report and "none of the" in report


def test_medusa_reuses_eagle_rollouts(tmp_path: Path, quick_target: Path, corpus_dir: Path, capsys) -> None:
    """--rollouts: Medusa heads train on the token rows an EAGLE run generated; only their features are computed."""
    prompts = _prompts(tmp_path / "p.jsonl")
    common = ["--quick", "--target", str(quick_target), "--corpus", str(corpus_dir), "--threads", "1",
              "--prompts", str(prompts), "--prompt-len", "24", "--gen-len", "12"]
    assert train_cli(["distill", "--method", "eagle", *common, "--out", str(tmp_path / "e"), "--run-dir",
                      str(tmp_path / "re"), "--steps", "1", "--corpus-seqs", "0"]) == 0
    (data,) = (tmp_path / "re").glob("eagle-data-*.pt")
    assert train_cli(["distill", "--method", "medusa", *common, "--out", str(tmp_path / "m"), "--run-dir",
                      str(tmp_path / "rm"), "--rollouts", str(data)]) == 0
    assert "rollouts x 36 tokens from" in capsys.readouterr().err
    (mdata,) = (tmp_path / "rm").glob("medusa-data-*.pt")
    assert torch.equal(torch.load(mdata)["tokens"], torch.load(data)["tokens"])
    assert (tmp_path / "m" / "draft_vocab.json").is_file()
