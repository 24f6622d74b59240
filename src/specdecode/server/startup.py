"""What ``serve`` does before it listens, in one process or in each Ray replica alike: load the target, the
draft and every drafter the flags make available, and build the server's state."""

from __future__ import annotations

import argparse
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Iterator, Optional

from .. import cli as main_cli  # looked up at call time, where tests put stand-ins
from ..config import ModelLoadConfig, from_args
from ..drafters.registry import artifacts_from_args, get_spec, options_from_args
from .config import API_KEY_ENV, ServerConfig, resolve_api_key

if TYPE_CHECKING:
    from .state import ServerState

log = logging.getLogger("specdecode.server")


def build_state(args: argparse.Namespace, engine_threads: Optional[int] = None) -> "ServerState":
    """Load the target, the draft and every drafter the flags (or the bundled defaults) make available.
    ``engine_threads``: the decode engine's threads unless --threads says (None: as the process has them)."""
    from .state import make_state  # lazy: pydantic and prometheus_client (~100 ms) load only to serve

    config = from_args(ServerConfig, args)
    if config.api_key is not None:
        log.warning("--api-key on the command line is visible to other users in `ps`; prefer $%s or "
                    "--api-key-file", API_KEY_ENV)
    config = resolve_api_key(config, os.environ)
    if config.threads is None and engine_threads is not None:
        config = replace(config, threads=engine_threads)
    artifacts = artifacts_from_args(args)  # a bad artifact flag fails before loading
    load = main_cli.model_loader(from_args(ModelLoadConfig, args))
    with _phase("loading the target (and building its kernels on first use)"):
        target = load(main_cli.resolve_target(args))
    default_drafter = main_cli.default_drafter_name(args)  # as `generate`'s: auto for a --target without a --draft
    spec = get_spec(default_drafter)
    needs_draft = spec.needs_draft_model or (spec.uses_draft_model and not args.target)
    draft_path = main_cli.resolve_draft_path(args, needs_draft)
    draft = None
    if draft_path:
        with _phase(f"loading the draft {draft_path}"):
            draft = load(draft_path)
    # the default drafter is prepared (its costs measured) on the engine thread once the server listens:
    # /health answers "warming" meanwhile, and requests queue
    # a --target that names a model (a catalogue name, a hub id) rather than a path is a name requests may use;
    # a path is not, so /v1/models never shows where the server's files are
    aliases = (args.target,) if args.target and not os.path.exists(os.path.expanduser(args.target)) else ()
    with _phase("building the drafters and the decode core (cost measurement on first use)"):
        return make_state(target, draft, config, default_drafter=default_drafter, default_gamma=args.gamma,
                          draft_vocab=args.draft_vocab, options=options_from_args(args), artifacts=artifacts,
                          prepare_in_background=True, aliases=aliases)


@contextmanager
def _phase(what: str) -> Iterator[None]:
    """Say what a slow start is doing, and how long it took (a silent 90 s start looks like a hang)."""
    log.info("%s ...", what)
    t0 = time.perf_counter()
    yield
    log.info("%s: done in %.1f s", what.split(" (")[0], time.perf_counter() - t0)
