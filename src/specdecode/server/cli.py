"""`specdecode serve`: load the models named by the usual model flags and run the HTTP server."""

from __future__ import annotations

import argparse
import logging
import time
from contextlib import contextmanager
from typing import Iterator

from ..config import ModelLoadConfig, add_dataclass_args, from_args
from .config import ServerConfig

log = logging.getLogger("specdecode.server")

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
    from ..cli import model_loader, resolve_draft_path, resolve_eagle_path, resolve_heads_path, resolve_target
    from ..drafters.registry import get_spec
    from .app import make_state
    from .runner import make_server

    config = from_args(ServerConfig, args)
    load = model_loader(from_args(ModelLoadConfig, args))
    with _phase("loading the target (and building its kernels on first use)"):
        target = load(resolve_target(args))
    spec = get_spec(args.drafter or "model")
    draft_path = resolve_draft_path(args, spec.needs_draft_model or (spec.uses_draft_model and not args.target))
    draft = None
    if draft_path:
        with _phase(f"loading the draft {draft_path}"):
            draft = load(draft_path)
    gamma = AUTO_GAMMA if args.gamma == "auto" else int(args.gamma)
    with _phase("building the drafters and the decode core (cost measurement on first use)"):
        state = make_state(target, draft, config, default_drafter=args.drafter or "model", default_gamma=gamma,
                           ngram_max=args.ngram_max, ngram_min=args.ngram_min, draft_vocab=args.draft_vocab,
                           exit_layer=args.exit_layer, skip_layers=args.skip_layers, heads=resolve_heads_path(args),
                           eagle=resolve_eagle_path(args))
    server = make_server(state)
    print(f"specdecode serve: {state.model_name} on http://{config.host}:{config.port}/ "
          f"(drafter {state.default_drafter}, gamma {state.default_gamma}, batch {config.max_batch_size})",
          flush=True)
    server.run()
    return 0


@contextmanager
def _phase(what: str) -> Iterator[None]:
    """Say what a slow start is doing, and how long it took (a silent 90 s start looks like a hang)."""
    log.info("%s ...", what)
    t0 = time.perf_counter()
    yield
    log.info("%s: done in %.1f s", what.split(" (")[0], time.perf_counter() - t0)
