"""``specdecode datastore``: answers taken from a distill data cache or generated (greedy, resumable), written
as a datastore that suffix drafting reads."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdecode.cli import main
from specdecode.drafters.suffix_store import read_store
from specdecode.models import load_model
from specdecode.train.chat_prompts import load_chat_prompts
from specdecode.train.datastore import ANSWERS_FILE, ASSISTANT_HEADER
from specdecode.train.rollout import generate_ragged


def test_answers_from_a_rollouts_cache(quick_target: Path, tmp_path: Path) -> None:
    m = load_model(quick_target)
    header, eos = m.encode(ASSISTANT_HEADER, add_special_tokens=False), min(m.eos_token_ids)
    rows = [[5, 6, 7] + header + [20, 21, eos, 30], [8] + header + [22, 23, 24, 25, 26, 27], [9] * 9 + [10] * 3]
    width = max(len(r) for r in rows)
    rows = [r + [r[-1]] * (width - len(r)) for r in rows]
    cache = tmp_path / "eagle-data-x.pt"
    torch.save({"tokens": torch.tensor(rows, dtype=torch.int32)}, cache)
    out = tmp_path / "store"
    assert main(["datastore", "--target", str(quick_target), "--rollouts", str(cache), "--out", str(out)]) == 0
    answers, info = read_store(out)
    assert answers[0] == [20, 21, eos] and answers[1][:6] == [22, 23, 24, 25, 26, 27]
    assert len(answers) == 2  # the row without an assistant header (a corpus window) is skipped
    assert info["vocab_size"] == m.vocab_size and info["recipe"]["source"] == "rollouts"


def test_generated_answers_are_greedy_and_resume(quick_target: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"def f_{i}(x): return x + {i}"}]})
                               + "\n" for i in range(6)))
    m = load_model(quick_target)
    chat = load_chat_prompts(m, prompts, 512)
    out = tmp_path / "store"
    out.mkdir()
    (out / ANSWERS_FILE).write_text(json.dumps({"prompt": 0, "answer": [3, 4, 5]}) + "\n")  # an interrupted run's
    assert main(["datastore", "--target", str(quick_target), "--prompts", str(prompts), "--max-new-tokens", "5",
                 "--batch", "2", "--out", str(out), "--no-progress"]) == 0
    answers, info = read_store(out)
    assert answers[0] == [3, 4, 5]  # resumed, not generated again
    eos = set(m.eos_token_ids)
    for p, got in zip(chat.train[1:], answers[1:]):
        row = generate_ragged(m, [p], len(p) + 5, 0.0)[0, len(p):].tolist()
        cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        assert got == row[:cut]
    assert len(answers) == len(chat.train) and info["recipe"]["prompts_answered"] == len(chat.train)
    assert not (out / ANSWERS_FILE).exists()
