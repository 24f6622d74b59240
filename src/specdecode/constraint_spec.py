"""What a user asks structured output for, before it meets a tokenizer: a ``ConstraintSpec`` (JSON
schema, JSON object, regex or Lark grammar, validated by the grammar engine) from the Python API's
arguments, the CLI's files or OpenAI's ``response_format``. ``constraints.py`` binds a spec to a
model's tokenizer and keeps each row's grammar state."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Union
from urllib.parse import unquote

from .config import ConfigError

# JSON layout: json.dumps' separators and no other whitespace. Flexible whitespace lets a model pad
# the output with spaces or newlines without end (a small model does); a schema may override it
# with its own "x-guidance" options.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KINDS = ("json_schema", "json_object", "regex", "grammar")
INSTALL_HINT = "pip install 'specdecode[structured]' (it adds llguidance)"
KIND_NAMES = {"json_schema": "JSON schema", "json_object": "JSON object grammar", "regex": "regex",
              "grammar": "grammar (Lark syntax)"}


def llguidance_module() -> Any:
    """The llguidance module (a ConfigError that names the install command without it)."""
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ConfigError(f"structured output needs llguidance: {INSTALL_HINT}") from e
    return llguidance


@dataclass(frozen=True)
class ConstraintSpec:
    """A validated constraint before it meets a tokenizer: ``kind`` (json_schema, json_object,
    regex, grammar) and its ``source`` text (the schema as JSON, the regex, the Lark grammar;
    empty for json_object). ``grammar`` is llguidance's grammar text for it."""

    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        llg = llguidance_module()
        err = llg.LLMatcher.validate_grammar(self.grammar)
        if err:
            raise ConfigError(f"invalid {KIND_NAMES[self.kind]}: {short_error(err)}")

    @property
    def grammar(self) -> str:
        llg = llguidance_module()
        if self.kind == "json_object":
            return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
        if self.kind == "json_schema":
            return llg.LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_LAYOUT)
        if self.kind == "regex":
            return llg.LLMatcher.grammar_from_regex(self.source)
        return llg.LLMatcher.grammar_from_lark(self.source)


def echo(value: object, limit: int = 100) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a message that quotes what a user sent."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def short_error(err: str) -> str:
    """The first lines of the grammar engine's error text, for a user's message."""
    lines = [ln.strip() for ln in err.strip().splitlines() if ln.strip()]
    return " ".join(lines[:4])[:400] if lines else "rejected by the grammar compiler"


def json_schema_spec(schema: Union[str, Mapping[str, Any]]) -> ConstraintSpec:
    """A JSON-schema constraint from a dict or its JSON text (ConfigError if it is not a schema)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ConfigError(f"the JSON schema is not valid JSON: {e}") from e
    if not isinstance(schema, Mapping):
        raise ConfigError(f"a JSON schema must be a JSON object, got {type(schema).__name__}")
    return ConstraintSpec("json_schema", json.dumps(schema))


def spec_from_args(json_schema: Union[None, str, Mapping[str, Any]] = None, regex: Optional[str] = None,
                   grammar: Optional[str] = None, json_object: bool = False) -> Optional[ConstraintSpec]:
    """At most one of the Python API's / CLI's constraint arguments, as a spec (None: unconstrained)."""
    given = [n for n, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar),
                            ("json_object", json_object or None)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give at most one constraint, got {', '.join(given)}")
    if json_schema is not None:
        return json_schema_spec(json_schema)
    if regex is not None:
        return ConstraintSpec("regex", regex)
    if grammar is not None:
        return ConstraintSpec("grammar", grammar)
    return ConstraintSpec("json_object") if json_object else None


def spec_from_response_format(response_format: Any) -> Optional[ConstraintSpec]:
    """OpenAI's ``response_format``: {"type": "text"} (None), {"type": "json_object"}, or
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}.
    Raises ConfigError naming the field and the fix (the server answers it with a 400)."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise ConfigError("response_format must be an object such as {\"type\": \"json_object\"}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ConstraintSpec("json_object")
    if kind == "json_schema":
        js = response_format.get("json_schema")
        if not isinstance(js, Mapping) or not isinstance(js.get("schema"), Mapping):
            raise ConfigError("response_format.json_schema.schema must be a JSON schema object, e.g. "
                              "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", \"schema\": "
                              "{\"type\": \"object\"}}}")
        ref = recursive_ref(js["schema"])
        if ref is not None:  # refused before the engine sees it: see recursive_ref
            raise ConfigError(f"response_format.json_schema: recursive $ref is not supported (the schema refers "
                              f"back to itself through {echo(ref)}); write the recursion out to a fixed depth")
        try:
            return json_schema_spec(js["schema"])
        except ConfigError as e:
            raise ConfigError(f"response_format.json_schema.schema: {e}") from e
    raise ConfigError(f"response_format.type must be text, json_object or json_schema, got {echo(kind)}")


# values that are data, not schemas: a {"$ref": ...} inside them refers to nothing
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})


def recursive_ref(schema: Any) -> Optional[str]:
    """The ``$ref`` through which ``schema`` refers back to itself (a cycle of its own references), else None.

    The grammar engine takes such a schema, but walking it can hold the GIL for 100 ms and more (a
    required property that is the schema itself: every request then stalls the whole server), so the
    server refuses one up front. Local references are followed: ``#``, JSON pointers (``#/$defs/x``),
    ``$anchor`` names and the root's ``$id``; ``$recursiveRef`` and ``$dynamicRef`` always recurse."""
    if not isinstance(schema, (dict, list)):
        return None
    anchors: dict[str, Any] = {}
    todo: list[Any] = [schema]
    while todo:
        node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            if k == "$anchor" and isinstance(v, str):
                anchors[v] = node
            elif k in ("$recursiveRef", "$dynamicRef"):
                return f"{k}: {v}"
            elif k not in _DATA_KEYWORDS and isinstance(v, (dict, list)):
                todo.append(v)
    root_id = schema.get("$id") if isinstance(schema, dict) else None

    def target(ref: str) -> Any:
        base, hash_, frag = ref.partition("#")
        if base and base != root_id:
            return None  # another document: not followed here
        if not frag.startswith("/"):
            return anchors.get(unquote(frag)) if frag else schema
        node: Any = schema
        for part in frag[1:].split("/"):
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def successors(node: Any) -> Iterator[tuple[Any, Optional[str]]]:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            if k == "$ref" and isinstance(v, str) and isinstance(node, dict):
                t = target(v)
                if isinstance(t, (dict, list)):
                    yield t, v
            elif k not in _DATA_KEYWORDS and isinstance(v, (dict, list)):
                yield v, None

    # depth-first over containment and reference edges; containment alone is a tree, so a cycle
    # (an edge back to a node on the current path) always passes through a reference
    on_path: dict[int, int] = {id(schema): 0}  # node -> its depth on the path
    done: set[int] = set()
    path: list[tuple[Any, Iterator[tuple[Any, Optional[str]]], Optional[str]]] = [(schema, successors(schema), None)]
    while path:
        node, succ, _ = path[-1]
        nxt = next(succ, None)
        if nxt is None:
            path.pop()
            del on_path[id(node)]
            done.add(id(node))
            continue
        child, ref = nxt
        if id(child) in on_path:
            refs = [r for _, _, r in path[on_path[id(child)] + 1:] if r is not None]
            return ref if ref is not None else refs[-1] if refs else "$ref"
        if id(child) not in done:
            on_path[id(child)] = len(path)
            path.append((child, successors(child), ref))
    return None


def spec_from_files(json_schema_file: Optional[str], regex: Optional[str], grammar_file: Optional[str],
                    json_object: bool = False) -> Optional[ConstraintSpec]:
    """The CLI's ``--json-schema FILE``, ``--regex``, ``--grammar FILE`` and ``--json-object``."""
    def read(path: str, flag: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise ConfigError(f"cannot read {flag} {path}: {e.strerror or e}") from e

    schema = read(json_schema_file, "--json-schema") if json_schema_file is not None else None
    lark = read(grammar_file, "--grammar") if grammar_file is not None else None
    try:
        return spec_from_args(json_schema=schema, regex=regex, grammar=lark, json_object=json_object)
    except ConfigError as e:
        flag = ("--json-schema" if schema is not None else "--regex" if regex is not None
                else "--grammar" if lark is not None else "--json-object")
        raise ConfigError(f"{flag}: {e}") from e
