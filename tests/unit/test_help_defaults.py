"""Every ``--help`` that names a default tells the truth (issue 49).

For each subcommand's options, the help text's "default: X" (or "(default ... : X)") is compared with what
the code does when the flag is absent: the parser's default where it has one, else the value the command's
own code resolves an absent flag to (``RESOLVERS``: the bundled target, a drafter option's declared default,
a training recipe's field, the bench's FULL settings...). A default described in words ("the model's context
window") and no resolver is not checked; a bare value with no parser default and no resolver fails, so a new
literal default cannot go unchecked.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Optional

import pytest

import specdecode.cli as cli
from specdecode.bundled import DEFAULT_TARGET, default_model_dir
from specdecode.cli import build_parser

_CLAIM = re.compile(r"\bdefault\b[^:;()]*?:\s*([^;)]*)")  # "default: X", "(default with ...: X)"; X ends at ; or )
_PLACEHOLDER = re.compile(r"[A-Z]{3,}|<")  # TARGET/drafters/..., runs/bench-<timestamp>: a pattern, not a value


class Claim(NamedTuple):
    command: str
    option: str
    dest: str
    text: str  # the claimed default, as the help prints it
    help: str  # the option's whole help text
    parser_default: Any  # set_defaults included (``get_default``)


def _subparsers(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    if path:
        yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, f"{path} {name}".strip())


def _claims() -> list[Claim]:
    parser = build_parser()
    out: list[Claim] = []
    for command, sub in _subparsers(parser):
        formatter = sub._get_formatter()
        for action in sub._actions:
            if not action.help or not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            text = formatter._expand_help(action)  # "%(default)s" as the user sees it
            for value in _CLAIM.findall(text):
                out.append(Claim(command, action.option_strings[-1], action.dest, " ".join(value.split()), text,
                                 sub.get_default(action.dest)))
    return out


def _first(text: str) -> str:
    """The value a claim starts with: "3, free as on a GPU" -> "3"; "bundled models/code-target" -> the path."""
    words = re.split(r"[\s,]+", text.strip())
    while len(words) > 1 and words[0] in ("bundled", "the"):
        words = words[1:]
    return words[0]


def _literal(text: str) -> bool:
    """Whether a claim is a bare value (a number, a name) rather than a description."""
    value = _first(text)
    return (bool(re.fullmatch(r"[\w.+\-/]+", value)) and not value.startswith("--")
            and not _PLACEHOLDER.search(value) and len(text.split(",")[0].split()) == 1)


def _same(claimed: str, actual: Any) -> bool:
    """A claim equals a value: as text, as a number, as a path's tail, or as a list's items."""
    if isinstance(actual, (list, tuple)):
        return claimed in (" ".join(map(str, actual)), ",".join(map(str, actual)))
    candidates = {claimed.strip(), _first(claimed)}
    for c in candidates:
        if c == str(actual):
            return True
        if isinstance(actual, (int, float)) and not isinstance(actual, bool):
            try:
                if float(c) == float(actual):
                    return True
            except ValueError:
                pass
        if "/" in c and isinstance(actual, (str, Path)) and Path(actual).parts[-len(Path(c).parts):] == Path(c).parts:
            return True
    return False


# -- what the code does with an absent flag ---------------------------------------------------------------
def _parse(command: str, *extra: str) -> argparse.Namespace:
    return build_parser().parse_args([*command.split(), *extra])


class _Loaded(Exception):
    pass


def _loaded_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str], n: int) -> list[str]:
    """The first ``n`` model paths the command loads, from its own code (the loader stops it there)."""
    from specdecode.models import catalog

    monkeypatch.setenv("SPECDECODE_MODELS", str(tmp_path))
    for name in catalog.CATALOG:  # "already pulled": nothing is fetched
        f = catalog.model_file(name)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.touch()
    paths: list[str] = []

    def loader(cfg: object) -> Callable[[str], object]:
        def load(path: str) -> object:
            paths.append(str(path))
            if len(paths) >= n:
                raise _Loaded
            return object()
        return load

    monkeypatch.setattr(cli, "model_loader", loader)
    args = build_parser().parse_args(argv)
    with pytest.raises(_Loaded):
        args.func(args)
    return paths


def _argv(command: str) -> list[str]:
    """The command with the least it needs to reach its first model load."""
    return [command] if command == "serve" else [command, "--prompt", "x"]


def _target_of(command: str) -> Callable[..., object]:
    return lambda mp, tmp: _loaded_paths(mp, tmp, _argv(command), 1)[-1]


def _draft_of(command: str) -> Callable[..., object]:
    from specdecode.drafters.registry import REGISTRY

    needs = next(n for n, s in REGISTRY.items() if s.needs_draft_model and not s.own_tokenizer)
    return lambda mp, tmp: _loaded_paths(mp, tmp, [*_argv(command), "--drafter", needs], 2)[-1]


def _drafter_of(command: str) -> Callable[..., object]:
    return lambda mp, tmp: cli.default_drafter_name(_parse(command))


def _drafter_option(dest: str) -> Callable[..., object]:
    from specdecode.drafters.registry import DrafterOptions, with_defaults

    return lambda mp, tmp: with_defaults(DrafterOptions()).options[dest]


def _distill_field(dest: str) -> Optional[Callable[..., object]]:
    """A ``distill --method X`` flag's default: the field of that method's training config."""
    import importlib

    from specdecode.train import cli as train_cli

    values = []
    for spec in train_cli._FROZEN.values():
        fields = dict(spec.own) if dest not in train_cli._FROZEN_ONLY else {dest: train_cli._FROZEN_ONLY[dest]}
        if dest in fields:
            cls = getattr(importlib.import_module(f"specdecode.train.{spec.module}"), spec.config)
            defaults = {f.name: f.default for f in dataclasses.fields(cls)}
            values.append(defaults.get(fields[dest]))
    if not values or values[0] is None or dataclasses.MISSING in values:
        return None  # described in words ("half the target's"): computed from the target
    return lambda mp, tmp: values[0] if len(set(map(str, values))) == 1 else tuple(values)


def _bench_setting(name: str) -> Callable[..., object]:
    from specdecode.bench.cli import resolve_settings

    def get(mp: pytest.MonkeyPatch, tmp: Path) -> object:
        s = resolve_settings(_parse("bench"))
        if name == "gammas":
            return ",".join(map(str, s.gammas)) + (",auto" if s.auto_gamma else "")
        return getattr(s, name)

    return get


def _workload(command: str) -> Callable[..., object]:
    from specdecode.bench.workloads import resolve_workload

    return lambda mp, tmp: resolve_workload(None)


def _resolvers() -> dict[tuple[str, str], Callable[..., object]]:
    from specdecode.drafters.registry import all_options
    from specdecode.train import cli as train_cli

    r: dict[tuple[str, str], Callable[..., object]] = {}
    for command in ("generate", "chat", "serve"):
        r[(command, "target")] = _target_of(command)
        r[(command, "draft")] = _draft_of(command)
        r[(command, "drafter")] = _drafter_of(command)
    r[("calibrate", "target")] = lambda mp, tmp: cli.resolve_target(_parse("calibrate"))
    for command in ("bench", "bench costs"):
        r[(command, "target")] = lambda mp, tmp, c=command: cli.resolve_target(_parse(c))
    r[("bench", "draft")] = lambda mp, tmp: cli.resolve_draft_path(_parse("bench"), needed=True)
    for name in ("gammas", "lookup_tokens", "peer_gammas", "reps", "threads", "cost_repeats"):
        r[("bench", name)] = _bench_setting(name)
    for command in ("bench", "bench variants", "bench replay"):
        r[(command, "workload")] = _workload(command)
    for claim in CLAIMS:
        option = all_options().get(claim.dest)
        if option is not None and option.default is not None and option.help in claim.help:  # the registry's flag
            r[(claim.command, claim.dest)] = _drafter_option(claim.dest)
        if claim.command == "distill" and (claim.dest in train_cli._OWN_FLAGS or claim.dest in train_cli._FROZEN_ONLY):
            got = _distill_field(claim.dest)
            if got is not None:
                r[(claim.command, claim.dest)] = got
    return r


def _read(claim: Claim, actual: Any) -> bool:
    """Whether the claim says ``actual``, reading lists and γ ranges with the bench's own parsers."""
    from specdecode.bench.flags import parse_gammas, parse_int_list

    if claim.command == "bench" and claim.dest == "gammas":
        return parse_gammas(claim.text) == parse_gammas(str(actual))
    if claim.command == "bench" and claim.dest in ("lookup_tokens", "peer_gammas"):
        return parse_int_list(claim.text, claim.option) == list(actual)
    if isinstance(actual, Path) and claim.dest == "workload":
        from specdecode.bench.workloads import resolve_workload

        return resolve_workload(_first(claim.text)) == actual
    return _same(claim.text, actual)


CLAIMS = _claims()
RESOLVERS = _resolvers()

def _params() -> list[Any]:
    return [pytest.param(c, id=f"{c.command}-{c.option}-{c.text[:24]}") for c in CLAIMS]


@pytest.mark.parametrize("claim", _params())
def test_help_default_is_what_the_code_does(claim: Claim, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    parser_default = claim.parser_default
    resolver = RESOLVERS.get((claim.command, claim.dest))
    if resolver is not None:
        actual = resolver(monkeypatch, tmp_path)
        where = "what the command resolves an absent flag to"
    elif parser_default is not None:
        if not _literal(claim.text) or isinstance(parser_default, bool):
            return  # a description ("EOS ignored, ...") of a flag that is off or set: nothing literal to compare
        actual, where = parser_default, "the parser's default"
    elif claim.text == "None":
        return  # argparse's own rendering of an unset optional value: true, if terse
    else:
        assert not _literal(claim.text), (
            f"`specdecode {claim.command} {claim.option}` says default {claim.text!r}, but its parser default is "
            "None and this test knows no code that resolves it: add a resolver to RESOLVERS")
        return  # described in words, resolved at run time from the model or the machine
    assert _read(claim, actual), (
        f"`specdecode {claim.command} --help` says {claim.option} defaults to {claim.text!r}, but {where} is "
        f"{actual!r}: fix the help text (or the default)")


def test_claims_were_found() -> None:
    """The scan itself works: the flags every user reads are among the checked claims."""
    seen = {(c.command, c.option) for c in CLAIMS}
    assert {("generate", "--target"), ("generate", "--max-new-tokens"), ("serve", "--port"),
            ("bench", "--reps"), ("distill", "--medusa-heads")} <= seen
    assert len(CLAIMS) > 100


def test_a_lie_is_caught(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The comparison fails on a wrong claim, so a passing suite means something."""
    assert not _same("128", 512) and _same("512", 512) and _same("10", 10.0)
    assert not _same("bundled models/code-target", "smollm2-135m-instruct")
    assert _same("bundled models/code-target", str(default_model_dir(DEFAULT_TARGET)))
    assert _literal("3; quick: 2".split(";")[0]) and not _literal("the model's context window")
    assert not _literal("TARGET/drafters/suffix/") and not _literal("--draft")


def test_cuda_graphs_help_matches_the_gpu_record() -> None:
    """docs/gpu.md records CUDA graphs run on an H200 (identical outputs, no measured gain): the help says so."""
    text = next(a.help for a in _parse_actions("generate") if a.dest == "cuda_graphs")
    assert text is not None and "not yet run" not in text and "H200" in text and "docs/gpu.md" in text


def _parse_actions(command: str) -> list[argparse.Action]:
    parser = build_parser()
    sub = dict(_subparsers(parser))[command]
    return list(sub._actions)
