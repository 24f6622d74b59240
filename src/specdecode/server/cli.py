"""`specdecode serve`: load the models named by the usual model flags and run the HTTP server.

The server offers every drafter it can build at once, so each trained artifact comes from its own
flag (derived from the registry's declarations), the shared ``--heads DIR`` (the kind it holds), or
beside the target; giving one never unloads the others.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

import torch

from .. import cli as main_cli  # looked up at call time, where tests put stand-ins
from ..config import add_dataclass_args, from_args
from ..drafters.registry import artifacts_from_args
from ..kernels.build import extension_problems, extension_reasons
from .config import API_KEY_ENV, ServerConfig, resolve_api_key
from .ray_config import RAY_EXTRA_HINT, RayConfig, ray_config_of
from .startup import build_state

if TYPE_CHECKING:
    pass

log = logging.getLogger("specdecode.server")


def add_subcommands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API with a web page",
                       description="OpenAI-compatible completions and chat completions (streaming too), "
                                   "continuous batching with speculative decoding, /metrics, /health, and a web "
                                   "page at / that colours accepted draft tokens.")
    main_cli.add_model_args(p)  # the drafters' own flags (each artifact's too) are derived from the registry
    add_dataclass_args(p, ServerConfig)
    add_dataclass_args(p, RayConfig)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    ray_config = ray_config_of(args)
    if ray_config.ray:
        return serve_on_ray(args, ray_config)
    from .runner import make_server, raise_fd_limit  # lazy: uvicorn and starlette load only to serve

    # Only the engine thread runs parallel ops. An OpenMP team belongs to the thread that starts it, and a
    # team the main thread started while loading slows the engine's parallel ops 2-3x (below 1 thread's speed
    # on a 2-core machine). Loading is no faster with more threads.
    threads = torch.get_num_threads()  # torch's default: $OMP_NUM_THREADS, else the physical cores
    torch.set_num_threads(1)
    state = build_state(args, engine_threads=threads)
    raise_fd_limit()  # room for --max-connections sockets (make_server keeps the cap under the limit)
    server = make_server(state)
    config = state.config
    print(f"specdecode serve: {state.model_name} on http://{config.host}:{config.port}/ "
          f"(drafter {state.default_drafter}, gamma {state.describe_gamma()}, batch {config.max_batch_size}; "
          f"drafters: {', '.join(sorted(state.scheduler.drafters))})", flush=True)
    failed = extension_problems()
    if failed:  # a silent fall-back serves at about half the speed for good: say it where it is seen
        off = ", ".join(f"{name}: {why}" for name, why in sorted(extension_reasons().items()))
        print(f"specdecode serve: the fast path is OFF ({off}; eager PyTorch runs instead, about half the "
              "speed; the log says why)", flush=True)
        for _, why in sorted(failed.items()):
            log.warning("fast path off: %s", why)
    server.run()
    return 0


def serve_on_ray(args: argparse.Namespace, ray_config: RayConfig) -> int:
    """``serve --ray``: the flags are checked here, the models load in each replica (``ray_app.py``)."""
    try:
        from .ray_app import serve_on_ray as run  # lazy: Ray, an optional extra, loads only with --ray
    except ImportError as e:
        if (e.name or "").split(".")[0] != "ray":
            raise
        raise main_cli.CLIError(f"--ray needs Ray Serve, which is not installed here: {RAY_EXTRA_HINT}") from None
    config = from_args(ServerConfig, args)
    if config.api_key is not None:
        log.warning("--api-key on the command line is visible to other users in `ps`; prefer $%s or "
                    "--api-key-file", API_KEY_ENV)
    config = resolve_api_key(config, os.environ)
    if config.port == 0:
        raise main_cli.CLIError("--port 0 (any free port) does not work with --ray: Ray's HTTP proxy needs the port "
                                "up front; give one")
    artifacts_from_args(args)  # a bad artifact flag fails here, not in every replica
    return run(args, config, ray_config)
