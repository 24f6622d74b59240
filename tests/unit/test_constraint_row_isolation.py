"""A grammar the engine gives up on (llguidance's 2000 Earley items per parser row) fails its own row
only: ``bind`` refuses one that fails at its first tokens; one that fails partway through decoding
ends its row with ``Failure("constraint")`` while the other rows of the batch, constrained or not,
give exactly their tokens alone; ``generate`` raises GrammarLimitError, never a RuntimeError."""

from __future__ import annotations

import pytest

pytest.importorskip("llguidance")

import specdecode as sd
from specdecode.config import ConfigError, GenerationConfig, SamplingConfig
from specdecode.constraints import (Constraint, GrammarLimitError, bind, grammar_tokenizer, json_schema_spec,
                                    token_list_tokenizer)
from specdecode.core import DecodeCore
from specdecode.rows import Failure, FinishEvent, Request, StepEvent
from specdecode.draft import Draft
from tiny import build_model

# 600 optional properties: ~2400 items in the row after "{", over the engine's limit of 2000
WIDE = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(600)}}
# the limit is hit only after a 6-character string: partway through decoding
LATE = {"type": "object", "properties": {"a": {"type": "string", "minLength": 6, "maxLength": 6}, "b": WIDE},
        "required": ["a", "b"], "additionalProperties": False}
SMALL = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"],
         "additionalProperties": False}
PROMPTS = ["def fib(n):", "class Point:\n", "x = 1\ny = 2\n"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[sd.Model, sd.Model]:
    root = tmp_path_factory.mktemp("isolation")
    return (sd.load_model(build_model(root / "t", "llama", seed=0)),
            sd.load_model(build_model(root / "d", "llama", seed=4, layers=1, hidden=32)))


def unbound(schema: dict, target: sd.Model) -> Constraint:
    """A constraint compiled without ``bind``'s up-front probe: the engine gives up mid-decode."""
    return Constraint(json_schema_spec(schema), grammar_tokenizer(target), target.vocab_size)


def test_bind_refuses_a_grammar_the_engine_gives_up_on_at_once(models: tuple[sd.Model, sd.Model]) -> None:
    target, _ = models
    for schema in (WIDE, {"enum": [[] for _ in range(2100)]}, {"type": "object", "properties": {"x": WIDE},
                                                               "required": ["x"]}):
        with pytest.raises(GrammarLimitError, match=r"too large .* limit of 2000") as e:
            bind(json_schema_spec(schema), target)
        assert "Parser Error" not in str(e.value) and "<state>" not in str(e.value)
        assert isinstance(e.value, ConfigError)
    with pytest.raises(GrammarLimitError):
        sd.generate(target, "x", max_new_tokens=8, json_schema=WIDE)
    bind(json_schema_spec(SMALL), target)  # a sound schema passes


def test_a_row_whose_grammar_gives_up_fails_alone(models: tuple[sd.Model, sd.Model]) -> None:
    target, draft = models
    gen = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    small = bind(json_schema_spec(SMALL), target)
    requests = [Request(target.encode(PROMPTS[0]), SamplingConfig(), gen, "model", 3),
                Request(target.encode(PROMPTS[1]), SamplingConfig(), GenerationConfig(max_new_tokens=24), "model", 3,
                        constraint=unbound(LATE, target)),
                Request(target.encode(PROMPTS[2]), SamplingConfig(), GenerationConfig(max_new_tokens=24), "model", 2,
                        constraint=small),
                Request(target.encode(PROMPTS[1]), SamplingConfig(), GenerationConfig(max_new_tokens=24), None,
                        constraint=unbound(WIDE, target))]
    core = DecodeCore(target, {"model": sd.DraftModelDrafter(draft, gamma=3)}, max_rows=4, context_len=128)
    rows = [core.add(r) for r in requests]
    ends: dict[int, object] = {}
    steps: dict[int, int] = {}
    while core.rows:
        for row, ev in core.step():  # never raises
            k = rows.index(row)
            if isinstance(ev, StepEvent):
                steps[k] = steps.get(k, 0) + 1
            else:
                assert k not in ends
                ends[k] = ev
    for k in (1, 3):
        f = ends[k]
        assert isinstance(f, Failure) and f.kind == "constraint", f
        assert "too large" in f.message and "limit of 2000" in f.message and "Parser Error" not in f.message
    assert steps.get(1, 0) >= 1 and "after" in ends[1].message  # type: ignore[attr-defined]  # failed partway
    assert 3 not in steps and "at the start" in ends[3].message  # type: ignore[attr-defined]
    for k, kw in ((0, {"ignore_eos": True}), (2, {"json_schema": SMALL})):
        fin = ends[k]
        assert isinstance(fin, FinishEvent)
        assert fin.token_ids == sd.generate(target, PROMPTS[k], max_new_tokens=24, **kw).token_ids
    assert core.rows == []


def test_generate_raises_grammar_limit_error_when_the_engine_gives_up_partway(
        models: tuple[sd.Model, sd.Model]) -> None:
    target, draft = models
    with pytest.raises(GrammarLimitError, match="after .* tokens"):
        list(sd.stream(target, "x", sd.DraftModelDrafter(draft, gamma=3),
                       generation=GenerationConfig(max_new_tokens=40), constraint=unbound(LATE, target)))


def test_a_state_the_engine_gave_up_on_is_inert() -> None:
    tokens = [b"<eos>", b"{", b"}", b"a", b"1", b'"', b":", b" ", b","]
    wide = {"type": "object", "properties": {f"a{i}": {"type": "integer"} for i in range(600)}}
    s = Constraint(json_schema_spec(wide), token_list_tokenizer(tokens, 0), len(tokens)).start()
    assert s.forced(4) == [1] and s.error is None
    s.commit([1])  # "{": the row after it holds ~2400 items
    assert s.error is not None and "limit of 2000" in s.error
    assert s.allowed().nonzero().flatten().tolist() == [0]  # EOS only
    assert not s.push(5) and s.forced(4) == []
    s.commit([5])  # no raise: the core fails the row
    d, masks = s.check_draft(Draft([5, 3]))
    assert d.tokens == [] and masks.shape == (1, len(tokens))
