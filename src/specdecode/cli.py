"""`specdecode` command line: generate, plus the subcommands other modules register (lazy imports)."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from .bundled import DEFAULT_DRAFT, DEFAULT_TARGET, default_model_dir
from .cache import ContextLengthError
from .chat import encode_chats
from .config import (ConfigError, GenerationConfig, ModelLoadConfig, SamplingConfig, VerifyConfig, add_dataclass_args,
                     from_args)
from .constraints import bind, spec_from_files
from .drafters import DrafterOptions, VocabularyMismatchError
from .drafters import build_drafter as build_named_drafter
from .drafters.base import BatchDrafter
from .drafters.registry import (ALONE_DEFAULT, PAIRED_DEFAULT, PLAIN, REGISTRY, add_drafter_args, artifacts_from_args,
                                draft_model_beside, get_spec, options_from_args)
from .drafters.vocab import parse_vocab_spec
from .rows import FinishEvent, StepEvent
from .engine import stream
from .models import Model, ModelNotFoundError, UnsupportedModelError, load_model
from .sizing.gamma import DEFAULT_CAP, Gamma
from .sizing.gamma import parse_gamma as parse_gamma_text

# Subcommand modules: each exposes add_subcommands(subparsers). Imported only
# when present so a missing optional dependency never breaks `generate`.
SUBCOMMAND_MODULES = ("specdecode.chat_cli", "specdecode.train.cli", "specdecode.bench.cli", "specdecode.server.cli",
                      "specdecode.train.calibrate", "specdecode.train.datastore")


class CLIError(Exception):
    """A user error the CLI reports in one line, without a traceback."""


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The target, draft and drafter flags of generate and serve: the drafters' own flags come from the registry."""
    p.add_argument("--target", help="target model: a Hugging Face directory, a .gguf file, a cached hub id, or a name "
                                    f"`specdecode pull` fetched (default: bundled models/{DEFAULT_TARGET})")
    p.add_argument("--draft", help="draft model directory (default with a drafter that needs one: bundled "
                                   f"models/{DEFAULT_DRAFT})")
    p.add_argument("--drafter", choices=tuple(REGISTRY), default=None,
                   help=f"how tokens are proposed (default: {PAIRED_DEFAULT} with the bundled target or --draft, else "
                        f"{ALONE_DEFAULT}): " + "; ".join(f"{name} = {spec.help}" for name, spec in REGISTRY.items()))
    p.add_argument("--gamma", type=parse_gamma, default="auto",
                   help=f"N: draft N tokens every target pass; 'auto': the cost policy picks 0 to {DEFAULT_CAP} "
                        "(a drafter's own cap where it has one) each pass, from measured costs and acceptance "
                        "(default: auto)")
    p.add_argument("--draft-vocab", type=parse_draft_vocab, default="auto",
                   help="tokens a draft model may propose: 'auto' = the cut recommended by the draft's "
                        "draft_vocab.json (its most frequent training tokens; full vocabulary without one), "
                        "'full', or a number N of most frequent tokens. Self-drafts (the target's own layers or "
                        "its quantized copy) read NAME.gguf.draft_vocab.json beside a GGUF target (`specdecode "
                        "draft-vocab --draft FILE.gguf`), or with a number and no file rank by the tokenizer. A "
                        "smaller output layer makes each draft step cheaper; the output is exact either way "
                        "(default: auto)")
    add_drafter_args(p)
    add_dataclass_args(p, ModelLoadConfig)


def parse_draft_vocab(text: str) -> object:
    try:
        return parse_vocab_spec(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_gamma(text: str) -> Gamma:
    """``--gamma`` for argparse (the rule itself: ``sizing/gamma.py``)."""
    try:
        return parse_gamma_text(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def resolve_target(args: argparse.Namespace) -> str:
    if args.target:
        return args.target
    path = default_model_dir(DEFAULT_TARGET)
    if not (path / "config.json").is_file():
        raise CLIError(f"no --target given and the bundled default model is missing at {path}; "
                       "pass --target DIR or train one with `specdecode train`")
    return str(path)


def resolve_draft_path(args: argparse.Namespace, needed: bool, wanted: bool = False) -> Optional[str]:
    """The draft model directory for generate, serve and bench: --draft if given; else, when a draft
    model is ``needed`` (or ``wanted``: the bench, for its draft methods), the one trained for --target in
    its ``drafters/model/``; else, when needed, the bundled one (which only fits the bundled target).
    auto with a --target needs none: it takes a draft model only from --draft (see build_drafter)."""
    if getattr(args, "draft", None):
        return str(args.draft)
    if args.target and (needed or wanted):
        beside = draft_model_beside(args.target)
        if beside is not None:
            return str(beside)
    if not needed:
        return None
    if args.target and getattr(args, "drafter", None) is None:
        free = ", ".join(n for n, sp in REGISTRY.items() if not sp.needs_draft_model)
        raise CLIError(f"--target given without --draft: pass --draft DIR, or a --drafter that needs none ({free})")
    path = default_model_dir(DEFAULT_DRAFT)
    if not (path / "config.json").is_file():
        raise CLIError(f"no --draft given and the bundled draft is missing at {path}; pass --draft DIR")
    return str(path)


def default_drafter_name(args: argparse.Namespace) -> str:
    """--drafter, else the bundled target's (or a --draft's) paired default, else the one needing no artifact."""
    if args.drafter:
        return str(args.drafter)
    return ALONE_DEFAULT if args.target and not getattr(args, "draft", None) else PAIRED_DEFAULT


def drafter_options(args: argparse.Namespace, load: Callable[[str], Model],
                    needs_draft_model: bool) -> DrafterOptions:
    """What the registry builds drafters from, as the model flags say (loads the draft model if needed)."""
    path = resolve_draft_path(args, needs_draft_model)
    return DrafterOptions(draft=load(path) if path else None, gamma=args.gamma, vocab=args.draft_vocab,
                          options=options_from_args(args), artifacts=artifacts_from_args(args))


def build_drafter(args: argparse.Namespace, load: Callable[[str], Model]) -> Optional[BatchDrafter]:
    """The drafter named by --drafter/--draft/--gamma (None for plain decoding)."""
    name = default_drafter_name(args)
    spec = get_spec(name)
    # a drafter that merely uses a draft model (auto) takes the bundled one beside the bundled target only,
    # not one trained beside a --target: SmolLM2's pays 1.03x alone and costs auto ~5% to explore (lab notes)
    needs_draft = spec.needs_draft_model or (spec.uses_draft_model and not args.target)
    return build_named_drafter(name, drafter_options(args, load, needs_draft))


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if args.prompt_file is not None:
        try:
            return Path(args.prompt_file).read_text()
        except OSError as e:
            raise CLIError(f"cannot read --prompt-file: {e}") from e
    if sys.stdin.isatty():
        raise CLIError("no prompt: pass --prompt TEXT, --prompt-file FILE, or pipe text on stdin")
    return sys.stdin.read()


def model_loader(cfg: ModelLoadConfig) -> Callable[[str], Model]:
    """Load models as the flags say: device, dtypes (``--kv-dtype`` too), and each model's kernels
    (``--fast-linear``, ``--matmul``)."""
    def load(path: str) -> Model:
        return load_model(path, device=cfg.device, dtype=cfg.dtype, weight_dtype=cfg.weight_dtype,
                          fast=cfg.fast_linear, matmul=cfg.matmul, kv_dtype=cfg.kv_dtype, fixed_rows=cfg.fixed_rows,
                          cuda_graphs=cfg.cuda_graphs, pack_cache=cfg.pack_cache)

    return load


GREEN, RESET = "\033[32m", "\033[0m"


def cmd_generate(args: argparse.Namespace) -> int:
    sampling = from_args(SamplingConfig, args)
    generation = from_args(GenerationConfig, args)
    verify = from_args(VerifyConfig, args)
    load_cfg = from_args(ModelLoadConfig, args)
    prompt = _read_prompt(args)
    spec = spec_from_files(args.json_schema, args.regex, args.grammar, args.json_object)  # before loading models

    load = model_loader(load_cfg)

    target = load(resolve_target(args))
    drafter = build_drafter(args, load)
    constraint = bind(spec, target) if spec is not None else None
    colour = sys.stdout.isatty() and not args.no_color and not args.json
    if args.chat:  # an instruct model answers a message in its template; raw text it merely continues
        ids: Union[str, list[int]] = encode_chats(target, [(("user", prompt),)])[0]
    else:
        ids = prompt
        if not args.json and not args.stream:
            sys.stdout.write(prompt)
    finish: Optional[FinishEvent] = None
    for ev in stream(target, ids, drafter, sampling, generation, verify, constraint, gamma=args.gamma):
        if isinstance(ev, StepEvent):
            if args.json:
                continue
            for piece, from_draft in zip(ev.pieces, ev.from_draft + [False] * (len(ev.pieces) - len(ev.from_draft))):
                sys.stdout.write(f"{GREEN}{piece}{RESET}" if colour and from_draft and piece else piece)
            if args.stream:
                sys.stdout.flush()
        else:
            finish = ev
    assert finish is not None
    if args.json:
        print(json.dumps({"text": finish.text, "token_ids": finish.token_ids, "finish_reason": finish.reason,
                          "stats": finish.stats.to_dict()}))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
        drafter_name = default_drafter_name(args) if drafter else PLAIN
        legend = f" | {GREEN}green{RESET} = accepted draft tokens" if colour else ""
        print(f"[{drafter_name}] {finish.stats.summary()} | finish: {finish.reason}{legend}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdecode",
        description="Exact speculative decoding: a small drafter proposes tokens, the target verifies them in "
                    "one pass; the output follows the target's distribution exactly.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    g = sub.add_parser("generate", help="generate text with speculative decoding",
                       description="Complete a prompt with the target model, drafting with a small model "
                                   "(default), prompt lookup, or nothing. With no model flags the bundled "
                                   "code-target/code-draft pair is used.")
    g.add_argument("--prompt", help="prompt text")
    g.add_argument("--prompt-file", help="read the prompt from this file")
    g.add_argument("--chat", action="store_true",
                   help="send the prompt as one user message in the target's chat template (an instruct model, "
                        "e.g. smollm2-135m-instruct, then answers it instead of continuing the text); "
                        "`specdecode chat` holds a conversation")
    add_model_args(g)
    add_dataclass_args(g, SamplingConfig)
    add_dataclass_args(g, GenerationConfig)
    add_dataclass_args(g, VerifyConfig)
    s = g.add_argument_group("structured output (exact under speculation; needs the [structured] extra)")
    s.add_argument("--json-schema", metavar="FILE", help="constrain the output to JSON valid against this schema file")
    s.add_argument("--json-object", action="store_true", help="constrain the output to a JSON object")
    s.add_argument("--regex", metavar="PATTERN", help="constrain the output to match this regular expression")
    s.add_argument("--grammar", metavar="FILE", help="constrain the output to this Lark grammar file")
    g.add_argument("--stream", action="store_true", help="print text as it is generated")
    g.add_argument("--json", action="store_true", help="print one JSON object with text, token_ids and stats")
    g.add_argument("--no-color", action="store_true", help="do not colour accepted draft tokens")
    g.set_defaults(func=cmd_generate)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                continue  # that part of the package is not built yet
            raise
        module.add_subcommands(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="specdecode: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (CLIError, ConfigError, ContextLengthError, ModelNotFoundError, UnsupportedModelError,
            VocabularyMismatchError) as e:
        print(f"specdecode: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # `python -m specdecode.cli` runs this file as __main__, a second copy of the module: its CLIError is not the
    # one the subcommands raise (they import specdecode.cli), so an error would escape as a traceback
    from specdecode.cli import main as _main

    sys.exit(_main())
