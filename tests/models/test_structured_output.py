"""Structured output on tiny real checkpoints: 10 JSON schemas, every output valid (greedy and
T=1, with speculation), and constrained speculative decoding == constrained plain decoding (greedy).

A random tiny model still writes valid JSON because every position is masked. Each schema bounds
its strings, numbers and arrays, so the grammar must end within the token budget; a run that hit
the budget (finish_reason "length") would be a valid prefix, not a document, and fails the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

import specdecode as sd
from specdecode.config import ConfigError
from specdecode.constraints import (ConstraintSpec, bind, constraint_from_response_format, spec_from_response_format)
from tiny import build_model

S = {"type": "string", "maxLength": 6}
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "none": {"type": "null"}}, "required": ["ok", "none"],
     "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "n": {"const": 3}},
     "required": ["color", "n"], "additionalProperties": False},
    {"type": "object", "properties": {"p": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
     "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x", "y"],
     "additionalProperties": False}}, "required": ["p"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-f0-9]{4}$"}}, "required": ["id"],
     "additionalProperties": False},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 50}, {"type": "string", "maxLength": 4}]},
    {"type": "object", "properties": {"v": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["v"],
     "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {"type": "object",
     "properties": {"k": S, "q": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["k", "q"],
     "additionalProperties": False}}}, "required": ["items"], "additionalProperties": False},
]
PROMPT = "def add(a, b):\n    return "
BUDGET = 200


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[sd.Model, sd.Model]:
    root = tmp_path_factory.mktemp("structured")
    target = sd.load_model(build_model(root / "t", "llama", seed=1, hidden=64, layers=2))
    draft = sd.load_model(build_model(root / "d", "llama", seed=2, hidden=32, layers=1))
    return target, draft


def check(result: sd.GenerationResult, schema: dict) -> None:
    assert result.finish_reason == "stop", f"hit the token budget: {result.text!r}"
    jsonschema.validate(json.loads(result.text), schema)


@pytest.mark.parametrize("k", range(len(SCHEMAS)))
def test_json_schema_outputs_are_valid_and_greedy_identical(models: tuple[sd.Model, sd.Model], k: int) -> None:
    target, draft = models
    schema = SCHEMAS[k]
    plain = sd.generate(target, PROMPT, max_new_tokens=BUDGET, json_schema=schema)
    check(plain, schema)
    spec = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=3), max_new_tokens=BUDGET,
                       json_schema=schema)
    check(spec, schema)
    assert spec.token_ids == plain.token_ids  # speculation does not change the constrained greedy output
    lookup = sd.generate(target, PROMPT, drafter=sd.PromptLookupDrafter(max_ngram=2, num_draft_tokens=3),
                         max_new_tokens=BUDGET, json_schema=schema)
    assert lookup.token_ids == plain.token_ids  # a deterministic drafter that ignores the mask: cut, still exact
    for seed in range(3):
        for rule in ("rejection", "coupled"):
            sampled = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=3), max_new_tokens=BUDGET,
                                  temperature=1.0, seed=seed, json_schema=schema, accept_rule=rule)
            check(sampled, schema)


def test_forced_tokens_are_free_drafts(models: tuple[sd.Model, sd.Model]) -> None:
    """A long constant key is forced by the grammar: it arrives as drafts without a drafter step."""
    target, draft = models
    schema = {"type": "object", "properties": {"add_function_result": {"type": "integer", "minimum": 0,
              "maximum": 9}}, "required": ["add_function_result"], "additionalProperties": False}
    r = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=2), max_new_tokens=BUDGET,
                    json_schema=schema)
    check(r, schema)
    plain = sd.generate(target, PROMPT, max_new_tokens=BUDGET, json_schema=schema)
    assert r.token_ids == plain.token_ids
    assert r.stats.target_passes < len(r.token_ids) / 2


def test_regex_and_grammar(models: tuple[sd.Model, sd.Model]) -> None:
    import re
    target, draft = models
    for seed in range(3):
        r = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=3), max_new_tokens=60,
                        temperature=1.0, seed=seed, regex=r"(add|fib)\([0-9]{1,2}\)")
        assert r.finish_reason == "stop" and re.fullmatch(r"(add|fib)\([0-9]{1,2}\)", r.text), r.text
    lark = 'start: "x = " NUM\nNUM: /[0-9]{1,3}/'
    r = sd.generate(target, PROMPT, drafter=sd.DraftModelDrafter(draft, gamma=3), max_new_tokens=60, grammar=lark)
    assert r.finish_reason == "stop" and re.fullmatch(r"x = [0-9]{1,3}", r.text), r.text


def test_batched_rows_each_keep_their_constraint(models: tuple[sd.Model, sd.Model]) -> None:
    """Rows with and without constraints share one batch; each row's output equals its run alone."""
    target, draft = models
    core = sd.DecodeCore(target, {"m": sd.DraftModelDrafter(draft, gamma=3)}, max_rows=3)
    ids = target.encode(PROMPT)
    want = []
    for k, schema in enumerate([SCHEMAS[0], None, SCHEMAS[5]]):
        c = bind(ConstraintSpec("json_schema", json.dumps(schema)), target) if schema else None
        gen = sd.GenerationConfig(max_new_tokens=40 if schema is None else BUDGET)
        core.add(sd.Request(ids, generation=gen, drafter="m", constraint=c), owner=k)
        alone = sd.generate(target, PROMPT, max_new_tokens=gen.max_new_tokens, json_schema=schema)
        want.append(alone.token_ids)
    got: dict[int, list[int]] = {}
    while core.rows:
        for row, ev in core.step():
            if isinstance(ev, sd.FinishEvent):
                got[row.owner] = ev.token_ids
    assert [got[k] for k in range(3)] == want


def test_response_format_and_errors(models: tuple[sd.Model, sd.Model]) -> None:
    target, _ = models
    assert spec_from_response_format({"type": "text"}) is None
    assert spec_from_response_format({"type": "json_object"}) == ConstraintSpec("json_object")
    c = constraint_from_response_format(target, {"type": "json_schema", "json_schema": {"name": "p",
                                                                                        "schema": SCHEMAS[0]}})
    assert c is not None and c.spec.kind == "json_schema"
    r = sd.generate(target, PROMPT, max_new_tokens=BUDGET, json_schema=SCHEMAS[0])
    check(r, SCHEMAS[0])
    with pytest.raises(ConfigError, match="response_format.type"):
        spec_from_response_format({"type": "xml"})
    with pytest.raises(ConfigError, match="response_format.json_schema.schema"):
        spec_from_response_format({"type": "json_schema", "json_schema": {"name": "x"}})
    with pytest.raises(ConfigError, match="response_format.json_schema.schema: invalid JSON schema"):
        spec_from_response_format({"type": "json_schema", "json_schema": {"schema": {"type": "bogus"}}})
    with pytest.raises(ConfigError, match="invalid regex"):
        sd.generate(target, PROMPT, regex="[a-")
    with pytest.raises(ConfigError, match="at most one constraint"):
        sd.generate(target, PROMPT, regex="a", json_schema={"type": "object"})
    with pytest.raises(ConfigError, match="ignore_eos"):
        sd.generate(target, PROMPT, regex="a+", ignore_eos=True)


def test_cli_json_schema_flag(models: tuple[sd.Model, sd.Model], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    from specdecode.cli import main

    target, draft = models
    f = tmp_path / "s.json"
    f.write_text(json.dumps(SCHEMAS[3]))
    rc = main(["generate", "--target", target.path, "--draft", draft.path, "--prompt", PROMPT, "--json-schema", str(f),
               "--max-new-tokens", str(BUDGET), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    jsonschema.validate(json.loads(out["text"]), SCHEMAS[3])
    f.write_text("{not json")
    assert main(["generate", "--target", target.path, "--drafter", "none", "--prompt", PROMPT,
                 "--json-schema", str(f)]) != 0
    assert "--json-schema" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_medusa_trees_under_a_schema(arch: str, tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    """Tree drafts (Medusa) under a grammar: forbidden nodes are pruned, every node is verified
    under its own path's mask, and the greedy output is plain constrained decoding's."""
    from medusa_util import make_heads
    from specdecode.drafters.medusa import MedusaDrafter

    target = sd.load_model(tiny_dirs[arch])
    heads = make_heads(tmp_path / "heads", target.config.dim, target.vocab_size, seed=len(arch))
    tree = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0]]
    drafted = 0
    for schema in (SCHEMAS[0], SCHEMAS[5], SCHEMAS[7]):
        plain = sd.generate(target, PROMPT, max_new_tokens=BUDGET, json_schema=schema)
        spec = sd.generate(target, PROMPT, MedusaDrafter.load(heads, choices=tree), max_new_tokens=BUDGET,
                           json_schema=schema)
        check(spec, schema)
        assert spec.token_ids == plain.token_ids
        drafted += spec.stats.drafted
        sampled = sd.generate(target, PROMPT, MedusaDrafter.load(heads, choices=tree), max_new_tokens=BUDGET,
                              json_schema=schema, temperature=1.0, seed=1, accept_rule="rejection")
        check(sampled, schema)
    assert drafted > 0
    # a loose grammar (nothing forced): accepted draft tokens can only come from verified tree nodes
    loose = r"[\s\S]{1,40}"
    plain = sd.generate(target, PROMPT, max_new_tokens=BUDGET, regex=loose)
    spec = sd.generate(target, PROMPT, MedusaDrafter.load(heads, choices=tree), max_new_tokens=BUDGET, regex=loose)
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "stop" and sum(spec.from_draft) > 0
