"""`bench replay`: a drafter replayed on recorded greedy answers makes the run's steps (same drafts
accepted, same passes), the target's choices along a tree follow the recording, and the subcommand
prints and writes τ and the predicted speedup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import specdecode as sd
from specdecode.bench.replay import Trace, answer_end, replay_prompt, report, target_choices, teacher_forced
from specdecode.cli import main
from specdecode.config import GenerationConfig, SamplingConfig
from specdecode.sizing.costs import MAX_GAMMA, Costs
from specdecode.draft import Draft
from specdecode.drafters.suffix import SuffixDrafter
from specdecode.rows import StepEvent

FIB = "def fib(n):\n    return fib(n - 1) + fib(n - 2)\n\ndef fib(n):\n"
PROMPTS = [FIB, "x = 1\ny = 2\n" * 3, "class Point:\n    def __init__(self):\n", FIB]
FIXED = Costs(c=0.0, v=tuple(1.0 + 0.05 * k for k in range(64)))  # no timings: the suffix plan is deterministic


def _is_pass(ev: object) -> bool:
    """A step's event (the text-only tail at the end of a request is not a pass)."""
    return isinstance(ev, StepEvent) and bool(ev.token_ids)


def test_target_choices_follow_the_recording_along_each_path() -> None:
    answer = [5, 6, 7, 8]
    # chain: 5 6 9 -> the target picks 5 first, 6 after node 0, 7 after node 1; node 2 is off the recording
    assert target_choices(Draft([5, 6, 9]), answer, 0) == [5, 6, 7, -1]
    # tree: root children 5 and 4; 5's children 6 and 7; from t = 0 only the path 5 -> 6 is on the recording
    tree = Draft([5, 4, 6, 7], parents=[-1, -1, 0, 0])
    assert target_choices(tree, answer, 0) == [5, 6, -1, 7, -1]
    assert target_choices(Draft([8]), answer, 3) == [8, -1]  # past the recording: nothing to match


def test_answer_end_stops_after_the_first_end_of_turn() -> None:
    assert answer_end([1, 2, 9, 3, 9], {9}, True) == 3
    assert answer_end([1, 2, 9, 3, 9], {9}, False) == 5
    assert answer_end([1, 2, 3], {9}, True) == 3


def test_report_prices_each_step_at_its_drafting_time_plus_v(capsys: pytest.CaptureFixture[str]) -> None:
    costs = Costs(c=0.0, v=(1.0, 1.2, 1.5))
    t1 = 0.01  # a one-token pass: 10 ms
    # 6 tokens in 3 steps: a 2-node draft fully accepted (1 ms drafting), a rejected node (1 ms), a plain step
    tr = Trace(tokens=6, steps=3, nodes=[2, 1, 0], accepted=[2, 0, 0], draft_s=[0.001, 0.001, 0.0])
    (row, overall) = report({"x": [tr]}, ["c"], ["c"], costs, t1)
    assert overall["category"] == "overall" and row["category"] == "c"
    assert row["predicted"] == pytest.approx(6 / ((0.1 + 1.5) + (0.1 + 1.2) + 1.0))
    # cut: the rejected node's step priced as a one-token pass (its drafting time stays)
    assert row["cut"] == pytest.approx(6 / ((0.1 + 1.5) + (0.1 + 1.0) + 1.0))
    assert row["tau"] == pytest.approx(2.0) and row["nodes"] == pytest.approx(1.0)
    assert row["c"] == pytest.approx(0.1)  # per proposal made, over the one-token pass
    assert "x" in capsys.readouterr().out


def test_replay_makes_the_runs_steps(tiny_dirs: dict[str, Path]) -> None:
    target = sd.load_model(tiny_dirs["llama"])
    live, replayed = SuffixDrafter(costs=FIXED), SuffixDrafter(costs=FIXED)
    replayed.prepare_rows(target, 1, 256)
    budget = 32
    drafted_any = 0
    for text in PROMPTS:  # one drafter across the prompts: earlier answers feed later drafts, as in a run
        ids = target.encode(text)
        gen = GenerationConfig(max_new_tokens=budget, ignore_eos=True)
        run = [ev for ev in sd.stream(target, ids, live, generation=gen) if _is_pass(ev)]
        answer = [t for ev in run for t in ev.token_ids]
        tr = replay_prompt(replayed, ids, answer, len(answer), budget, MAX_GAMMA)
        assert tr.steps == len(run)
        assert tr.nodes == [len(ev.proposed or []) for ev in run]
        assert tr.accepted == [sum(ev.from_draft) for ev in run]
        drafted_any += sum(tr.nodes)
    assert drafted_any > 0  # the prompts repeat themselves: suffix drafting must have proposed


def _same_steps(target, live, replayed, budget: int = 24,  # type: ignore[no-untyped-def]
                sampling: SamplingConfig | None = None) -> tuple[int, int]:
    """Run each prompt with ``live`` and replay it with ``replayed`` (states from one teacher-forced pass);
    the steps must agree. ``sampling`` (seeded): the run samples by the coupled rule, the replay gets its
    noise. Returns the draft nodes replayed and the draft tokens accepted."""
    replayed.prepare_rows(target, 1, 256)
    layers = sorted(getattr(replayed, "hidden_layers", ()))
    nodes = accepted = 0
    for text in PROMPTS:
        ids = target.encode(text)
        gen = GenerationConfig(max_new_tokens=budget, ignore_eos=True)
        run = [ev for ev in sd.stream(target, ids, live, generation=gen, sampling=sampling) if _is_pass(ev)]
        answer = [t for ev in run for t in ev.token_ids]
        cap = replayed.gamma if isinstance(replayed.gamma, int) else MAX_GAMMA
        tr = replay_prompt(replayed, ids, answer, len(answer), budget, cap, teacher_forced(target, ids, answer, layers),
                           sampling, target.vocab_size)
        assert tr.nodes == [len(ev.proposed or []) for ev in run]
        assert tr.accepted == [sum(ev.from_draft) for ev in run]
        nodes += sum(tr.nodes)
        accepted += sum(tr.accepted)
    return nodes, accepted


def test_replay_makes_an_eagle_runs_steps(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    from eagle_util import FLAT as EAGLE_FLAT
    from eagle_util import make_eagle

    from specdecode.drafters.eagle import EagleDrafter

    target = sd.load_model(tiny_dirs["llama"])
    eagle = make_eagle(tmp_path / "e", target)
    live, replayed = (EagleDrafter.load(eagle, costs=EAGLE_FLAT, gamma=6) for _ in range(2))
    assert _same_steps(target, live, replayed)[0] > 0


def test_replay_makes_a_medusa_runs_steps(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    from medusa_util import FLAT as MEDUSA_FLAT
    from medusa_util import make_heads

    from specdecode.drafters.medusa import MedusaDrafter

    target = sd.load_model(tiny_dirs["llama"])
    heads = make_heads(tmp_path / "m", target.config.dim, target.vocab_size)
    live, replayed = (MedusaDrafter.load(heads, costs=MEDUSA_FLAT) for _ in range(2))
    assert _same_steps(target, live, replayed)[0] > 0


@pytest.mark.parametrize("name", ["quant", "layerskip"])
def test_replay_makes_a_shared_cache_drafters_steps(tiny_dirs: dict[str, Path], name: str) -> None:
    """The int4 copy and layer skip draft on the target's own KV cache: the replay hands them the
    teacher-forced pass's cache, set to each step's verified tokens, and puts back what they write past
    them. Their drafts (and so the steps) are then the run's, greedy and sampled."""
    from specdecode.drafters.layerskip import LayerSkipDrafter
    from specdecode.drafters.quant import QuantDrafter

    def make() -> object:
        return QuantDrafter(gamma=4) if name == "quant" else LayerSkipDrafter(skip_layers=(1,), gamma=4)

    target = sd.load_model(tiny_dirs["llama"])
    for sampling in (None, SamplingConfig(temperature=0.7, top_p=0.9, seed=3)):
        nodes, accepted = _same_steps(target, make(), make(), 24, sampling)
        assert nodes > 0 and accepted > 0


SAMPLED = SamplingConfig(temperature=0.7, top_p=0.9, seed=3)


def test_sampled_replay_makes_a_seeded_suffix_runs_steps(tiny_dirs: dict[str, Path]) -> None:
    """A seeded sampled run keeps a draft token exactly when it is the target's own draw, so the
    recording verifies each suffix draft as the run did."""
    target = sd.load_model(tiny_dirs["llama"])
    nodes, accepted = _same_steps(target, SuffixDrafter(costs=FIXED), SuffixDrafter(costs=FIXED), 32, SAMPLED)
    assert nodes > 0 and accepted > 0


def test_sampled_replay_hands_a_sampling_drafter_the_runs_noise(tiny_dirs: dict[str, Path]) -> None:
    """A drafter that samples draws with the row's coupled noise: the replay must hand it the run's. The
    target drafting for itself draws the target's own tokens with it, so every draft token is kept;
    without the noise its draws, and so the accepted counts, would differ."""
    target = sd.load_model(tiny_dirs["llama"])
    live, replayed = (sd.DraftModelDrafter(sd.load_model(tiny_dirs["llama"]), gamma=4) for _ in range(2))
    nodes, accepted = _same_steps(target, live, replayed, 24, SAMPLED)
    assert nodes > 0 and accepted == nodes


def test_sampled_replay_needs_the_seed_and_vocabulary() -> None:
    with pytest.raises(ValueError, match="seed"):
        replay_prompt(SuffixDrafter(costs=FIXED), [1, 2], [3], 1, 1, 4, None, SamplingConfig(temperature=0.7))


def test_replay_cli_prints_and_writes_rows(tiny_dirs: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "category": "c", "prompt": p, "max_new_tokens": 16}) + "\n"
                                for i, p in enumerate(PROMPTS[:2])))
    out, rec = tmp_path / "r.json", tmp_path / "rec.json"
    args = ["bench", "replay", "suffix", "ngram", "--gamma", "4", "--target", str(tiny_dirs["llama"]),
            "--workload", str(workload), "--record", str(rec), "--json", str(out)]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "recorded p0" in first and rec.exists()
    report = json.loads(out.read_text())
    rows = {(r["category"], r["variant"]): r for r in report["rows"]}
    assert set(rows) == {(c, v) for c in ("c", "overall") for v in ("suffix", "ngram")}
    for r in rows.values():
        assert r["tokens"] == 32 and 1.0 <= r["tau"] <= 5.0 and r["predicted"] > 0
        assert r["tau"] == pytest.approx(r["tokens"] / r["steps"])
    assert main(args + ["--v-table", "1.1,1.2,1.3,1.4"]) == 0  # the recording is reused, not redone
    assert "recorded" not in capsys.readouterr().out
    # sampled answers are recorded beside the greedy ones, with seed 0 when none is given
    assert main(args + ["--temperature", "0.7", "--top-p", "0.9"]) == 0
    out_text = capsys.readouterr().out
    assert "recorded p0" in out_text and "seed 0 (coupled)" in out_text
    assert json.loads(out.read_text())["sampling"] == {"temperature": 0.7, "top_k": None, "top_p": 0.9,
                                                       "min_p": None, "seed": 0}
    assert len(json.loads(rec.read_text())["answers"]) == 4


def test_replay_cli_runs_a_hidden_state_drafter(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    from eagle_util import make_eagle

    target = sd.load_model(tiny_dirs["llama"])
    eagle = make_eagle(tmp_path / "e", target, seed=1)
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "p", "category": "c", "prompt": PROMPTS[0], "max_new_tokens": 12}) + "\n")
    out = tmp_path / "r.json"
    assert main(["bench", "replay", f"eagle:eagle-draft={eagle}", "--target", str(tiny_dirs["llama"]),
                 "--workload", str(workload), "--json", str(out)]) == 0
    (row, _) = [r for r in json.loads(out.read_text())["rows"]]
    assert row["tokens"] == 12 and row["steps"] <= 12


def test_replay_refuses_a_policy_sized_drafter_at_gamma_auto(tiny_dirs: dict[str, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "p", "category": "c", "prompt": PROMPTS[0], "max_new_tokens": 8}) + "\n")
    rc = main(["bench", "replay", "model", "--target", str(tiny_dirs["llama"]), "--draft", str(tiny_dirs["draft"]),
               "--workload", str(workload)])
    assert rc != 0
    assert "--gamma N" in capsys.readouterr().err
