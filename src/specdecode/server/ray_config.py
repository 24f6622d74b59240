"""`specdecode serve --ray`: the flags of the Ray Serve application, and the conversation key its router uses.

Nothing here imports Ray: the flags parse, and a mistake in them is reported, on an install without the
``ray`` extra; ``ray_app.py`` is imported only once ``--ray`` is given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from ..config import ConfigError, _help

RAY_EXTRA_HINT = "pip install 'specdecode[ray]'"
# follow-up turns prefer the replica that served the first: Ray Serve routes by the ids a replica holds, and
# each id held is metadata pushed to every router, so a replica remembers this many conversations (LRU)
CONVERSATIONS_PER_REPLICA = 64
# a replica takes ~10-30 s to start (torch, the models, the kernels): a queue that lasts 5 s is pressure,
# while a replica is let go only after 2 minutes below target, so a lull between bursts keeps it
UPSCALE_DELAY_S = 5.0
DOWNSCALE_DELAY_S = 120.0


@dataclass(frozen=True)
class RayConfig:
    """How ``serve --ray`` places and scales its replicas (each one decode core, as ``serve`` runs)."""

    ray: bool = field(default=False, metadata=_help(
        f"serve through Ray Serve ({RAY_EXTRA_HINT}): several replicas, each one decode core with its own "
        "drafters, behind one HTTP port (--host/--port), with least-loaded routing and failover"))
    replicas: Optional[int] = field(default=None, metadata=_help(
        "with --ray: replicas to start (default 2; with --min-replicas/--max-replicas, the number to start with)"))
    min_replicas: Optional[int] = field(default=None, metadata=_help(
        "with --ray: scale on queue depth, down to this many replicas (needs --max-replicas)"))
    max_replicas: Optional[int] = field(default=None, metadata=_help(
        "with --ray: scale on queue depth, up to this many replicas (a replica is added while each one holds "
        "more than --max-batch-size requests)"))
    ray_address: Optional[str] = field(default=None, metadata=_help(
        "with --ray: the Ray cluster to run on (host:port or ray://host:port); unset: a local one on this machine "
        "with --threads CPUs per replica"))

    def __post_init__(self) -> None:
        for name in ("replicas", "min_replicas", "max_replicas"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be >= 1, got {v}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ConfigError("autoscaling needs both --min-replicas and --max-replicas (or neither, for a fixed "
                              "--replicas)")
        lo, hi = self.min_replicas, self.max_replicas
        if lo is not None and hi is not None:
            if lo > hi:
                raise ConfigError(f"--min-replicas {lo} is above --max-replicas {hi}")
            if self.replicas is not None and not lo <= self.replicas <= hi:
                raise ConfigError(f"--replicas {self.replicas} must lie in [--min-replicas {lo}, "
                                  f"--max-replicas {hi}] (it is the number to start with)")

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    @property
    def initial_replicas(self) -> int:
        return self.replicas or self.min_replicas or 2

    def check_used_with_ray(self) -> None:
        """A --replicas (or another Ray flag) without --ray would be silently ignored: say so instead."""
        if self.ray:
            return
        given = [f"--{f.name.replace('_', '-')}" for f in fields(self) if f.name != "ray" and getattr(self, f.name)]
        if given:
            raise ConfigError(f"{', '.join(given)} only apply with --ray; add --ray (and {RAY_EXTRA_HINT})")


def ray_config_of(args: argparse.Namespace) -> RayConfig:
    """The flags as a RayConfig; a Ray flag given without --ray is an error rather than ignored."""
    config = RayConfig(**{f.name: getattr(args, f.name) for f in fields(RayConfig)})
    config.check_used_with_ray()
    return config


def conversation_key(body: bytes) -> tuple[Optional[str], bool]:
    """(key, follow-up) of a chat request's body: the key hashes its messages up to and including the first
    user message, which every later turn of the conversation repeats; a follow-up carries an assistant turn.
    (None, False) when the body holds no such messages (the replica then answers with the right 4xx)."""
    try:
        obj: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None, False
    messages = obj.get("messages") if isinstance(obj, dict) else None
    if not isinstance(messages, list):
        return None, False
    head: list[Any] = []
    for m in messages:
        if not isinstance(m, dict):
            return None, False
        head.append([m.get("role"), m.get("content")])
        if m.get("role") == "user":
            break
    else:
        return None, False
    follow_up = any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)
    digest = hashlib.sha256(json.dumps(head, sort_keys=True, ensure_ascii=False).encode("utf-8", "replace"))
    return "conv-" + digest.hexdigest()[:32], follow_up
