"""`specdecode serve`: load the models named by the usual model flags and run the HTTP server.

The server offers every drafter it can build at once, so each trained artifact comes from its own
flag or bundled default (``--medusa-heads``, ``--eagle-draft``, ``--exit-adapter``); the shared
``--heads DIR`` of ``generate`` still works and fills the one kind it holds, never unloading the others.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from ..config import ConfigError, ModelLoadConfig, add_dataclass_args, from_args
from .config import API_KEY_ENV, ServerConfig, resolve_api_key

if TYPE_CHECKING:
    from .state import ServerState

log = logging.getLogger("specdecode.server")

# `--gamma auto`: requests may draft up to this many tokens; the scheduler's policy picks 0..AUTO_GAMMA each step.
AUTO_GAMMA = 8


def add_subcommands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from ..cli import DEFAULT_EAGLE, DEFAULT_EXIT_ADAPTER, DEFAULT_HEADS, add_model_args

    p = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API with a web page",
                       description="OpenAI-compatible completions and chat completions (streaming too), "
                                   "continuous batching with speculative decoding, /metrics, /health, and a web "
                                   "page at / that colours accepted draft tokens.")
    add_model_args(p)
    p.add_argument("--medusa-heads", default=None, metavar="DIR",
                   help="medusa, medusa-chain: the Medusa heads directory (default with the bundled target: "
                        f"bundled models/{DEFAULT_HEADS})")
    p.add_argument("--eagle-draft", default=None, metavar="DIR",
                   help=f"eagle: the EAGLE-3 draft directory (default with the bundled target: models/{DEFAULT_EAGLE})")
    p.add_argument("--exit-adapter", default=None, metavar="DIR",
                   help="layerskip-adapter: the exit adapter directory (default with the bundled target: "
                        f"models/{DEFAULT_EXIT_ADAPTER})")
    add_dataclass_args(p, ServerConfig)
    p.set_defaults(func=cmd_serve)


@dataclass(frozen=True)
class Artifacts:
    """The trained drafter artifacts the server loads; None: that drafter is not offered."""

    heads: Optional[str] = None  # Medusa
    eagle: Optional[str] = None  # EAGLE-3
    exit_adapter: Optional[str] = None  # layerskip-adapter


def resolve_artifacts(args: argparse.Namespace) -> Artifacts:
    """Each kind from its own flag, else from ``--heads`` when that holds this kind, else the bundled
    one when the target is the bundled one (they fit only it)."""
    from ..cli import DEFAULT_EAGLE, DEFAULT_EXIT_ADAPTER, DEFAULT_HEADS, default_model_dir
    from ..drafters.eagle_model import is_eagle_dir
    from ..drafters.exit_adapter import is_exit_adapter_dir

    def is_medusa_dir(path: Optional[str]) -> bool:
        return path is not None and not is_eagle_dir(path) and not is_exit_adapter_dir(path) and Path(path).is_dir()

    shared = getattr(args, "heads", None)
    bundled_target = not getattr(args, "target", None)

    def pick(own: Optional[str], flag: str, kind: str, is_kind: Callable[[Optional[str]], bool],
             default: str) -> Optional[str]:
        if own:
            if not is_kind(own):
                raise ConfigError(f"{flag} {own}: not {kind} directory; pass the directory "
                                  f"`specdecode distill` wrote, or drop {flag}")
            return str(own)
        if shared and is_kind(shared):
            return str(shared)
        path = default_model_dir(default)
        return str(path) if bundled_target and is_kind(str(path)) else None

    return Artifacts(
        heads=pick(getattr(args, "medusa_heads", None), "--medusa-heads", "a Medusa heads", is_medusa_dir,
                   DEFAULT_HEADS),
        eagle=pick(getattr(args, "eagle_draft", None), "--eagle-draft", "an EAGLE-3 draft", is_eagle_dir,
                   DEFAULT_EAGLE),
        exit_adapter=pick(getattr(args, "exit_adapter", None), "--exit-adapter", "an exit adapter",
                          is_exit_adapter_dir, DEFAULT_EXIT_ADAPTER))


def build_state(args: argparse.Namespace) -> "ServerState":
    """Load the target, the draft and every drafter the flags (or the bundled defaults) make available."""
    from ..cli import model_loader, resolve_draft_path, resolve_target
    from ..drafters.registry import get_spec
    from .state import make_state

    config = from_args(ServerConfig, args)
    if config.api_key is not None:
        log.warning("--api-key on the command line is visible to other users in `ps`; prefer $%s or "
                    "--api-key-file", API_KEY_ENV)
    config = resolve_api_key(config, os.environ)
    artifacts = resolve_artifacts(args)
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
    # the default drafter is prepared (its costs measured) on the engine thread once the server listens:
    # /health answers "warming" meanwhile, and requests queue
    with _phase("building the drafters and the decode core (cost measurement on first use)"):
        return make_state(target, draft, config, default_drafter=args.drafter or "model", default_gamma=gamma,
                          ngram_max=args.ngram_max, ngram_min=args.ngram_min, draft_vocab=args.draft_vocab,
                          exit_layer=args.exit_layer, skip_layers=args.skip_layers, heads=artifacts.heads,
                          eagle=artifacts.eagle, exit_adapter=artifacts.exit_adapter, prepare_in_background=True)


def cmd_serve(args: argparse.Namespace) -> int:
    from .runner import make_server

    state = build_state(args)
    server = make_server(state)
    config = state.config
    print(f"specdecode serve: {state.model_name} on http://{config.host}:{config.port}/ "
          f"(drafter {state.default_drafter}, gamma {state.default_gamma}, batch {config.max_batch_size}; "
          f"drafters: {', '.join(sorted(state.scheduler.drafters))})", flush=True)
    server.run()
    return 0


@contextmanager
def _phase(what: str) -> Iterator[None]:
    """Say what a slow start is doing, and how long it took (a silent 90 s start looks like a hang)."""
    log.info("%s ...", what)
    t0 = time.perf_counter()
    yield
    log.info("%s: done in %.1f s", what.split(" (")[0], time.perf_counter() - t0)
