"""`specdecode serve`: load the models named by the usual model flags and run the HTTP server."""

from __future__ import annotations

import argparse

from ..config import ModelLoadConfig, add_dataclass_args, from_args
from .config import ServerConfig

# `--gamma auto`: requests may draft up to this many tokens; the scheduler's policy picks 0..AUTO_GAMMA each step.
AUTO_GAMMA = 8


def add_subcommands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from ..cli import add_model_args

    p = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API with a web page",
                       description="OpenAI-compatible completions and chat completions (streaming too), "
                                   "continuous batching with speculative decoding, /metrics, /health, and a web "
                                   "page at / that colours accepted draft tokens.")
    add_model_args(p)
    add_dataclass_args(p, ServerConfig)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..cli import model_loader, resolve_draft_path, resolve_heads_path, resolve_target
    from ..drafters.registry import get_spec
    from .app import create_app, make_state

    config = from_args(ServerConfig, args)
    load = model_loader(from_args(ModelLoadConfig, args))
    target = load(resolve_target(args))
    draft_path = resolve_draft_path(args, get_spec(args.drafter or "model").needs_draft_model)
    draft = load(draft_path) if draft_path else None
    gamma = AUTO_GAMMA if args.gamma == "auto" else int(args.gamma)
    state = make_state(target, draft, config, default_drafter=args.drafter or "model", default_gamma=gamma,
                       ngram_max=args.ngram_max, ngram_min=args.ngram_min, draft_vocab=args.draft_vocab,
                       exit_layer=args.exit_layer, skip_layers=args.skip_layers, heads=resolve_heads_path(args))
    app = create_app(state)
    print(f"specdecode serve: {state.model_name} on http://{config.host}:{config.port}/ "
          f"(drafter {state.default_drafter}, gamma {state.default_gamma}, batch {config.max_batch_size})")
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning",
                timeout_graceful_shutdown=int(min(30.0, config.request_timeout)))
    return 0
