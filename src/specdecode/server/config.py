"""Serving flags: one dataclass is the source of the `specdecode serve` flags and their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Optional

from ..config import ConfigError, _help
from ..sizing.gamma import speculation_flag
API_KEY_ENV = "SPECDECODE_API_KEY"


@dataclass(frozen=True)
class ServerConfig:
    """How the HTTP server and its scheduler behave (model flags come from ``cli.add_model_args``)."""

    host: str = field(default="127.0.0.1", metadata=_help("address to listen on (loopback by default)"))
    port: int = field(default=8000, metadata=_help("TCP port to listen on"))
    api_key: Optional[str] = field(
        default=None, metadata=_help("require 'Authorization: Bearer KEY' on /v1/*; unset = no auth, unless "
                                     "--api-key-file or $SPECDECODE_API_KEY gives one (a key here shows in `ps`)"))
    api_key_file: Optional[str] = field(
        default=None, metadata=_help("read the API key from this file (surrounding whitespace ignored) instead "
                                     "of --api-key"))
    allowed_hosts: Optional[str] = field(
        default=None, metadata=_help("without an API key, requests must name this server in their Host header "
                                     "(localhost, 127.0.0.1, [::1], the --host address; any IP when bound to all "
                                     "addresses), which stops DNS rebinding; comma-separated extra names here, "
                                     "or '*' for any"))
    max_batch_size: int = field(
        default=16, metadata=_help("requests decoded together: rows of the batched KV cache"))
    max_queue: int = field(
        default=64, metadata=_help("requests waiting for a free row; more are refused with HTTP 429"))
    request_timeout: float = field(
        default=300.0, metadata=_help("seconds a request may take from arrival to its last token"))
    speculation: Optional[str] = field(
        default=None, metadata=_help("whether a request without its own gamma may draft fewer than the --gamma "
                                     "cap: auto = the cost policy picks 0..cap each step (0 = plain decoding "
                                     "when drafting does not pay), always = the full cap every step; unset = "
                                     "auto with --gamma auto, always with --gamma N"))
    max_context: Optional[int] = field(
        default=None, metadata=_help("cap on tokens per sequence; unset: the model's context window"))
    max_body_bytes: int = field(
        default=4 * 1024 * 1024, metadata=_help("largest request body accepted; bigger ones get HTTP 413"))
    header_timeout: float = field(
        default=10.0, metadata=_help("seconds a client has to send a request's headers (from connecting, or from "
                                     "the previous answer); then it gets HTTP 408 and is disconnected"))
    body_timeout: float = field(
        default=30.0, metadata=_help("seconds a client has to send a request's body once its headers are in; "
                                     "then it gets HTTP 408 and is disconnected"))
    max_connections: int = field(
        default=1024, metadata=_help("open connections at most (kept under the process's open-file limit); at "
                                     "the cap a new one closes the oldest connection that has no request in "
                                     "progress, else it is refused with HTTP 503"))
    drain_timeout: float = field(
        default=30.0, metadata=_help("on SIGTERM: seconds running requests may take to finish (new and queued "
                                     "ones get HTTP 503 at once); past it they end with an error event"))
    openapi: bool = field(default=False, metadata=_help("serve the OpenAPI schema at /openapi.json"))
    threads: Optional[int] = field(
        default=None, metadata=_help("most CPU threads of the decode engine, which drops to one while other "
                                     "processes hold the cores; unset: torch's, i.e. $OMP_NUM_THREADS, else "
                                     "the physical cores"))

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_queue < 0:
            raise ConfigError(f"max_queue must be >= 0, got {self.max_queue}")
        if not self.request_timeout > 0:
            raise ConfigError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")
        speculation_flag(self.speculation)  # auto, always or unset: else a ConfigError naming the choices
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        for name in ("header_timeout", "body_timeout"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1, got {self.max_connections}")
        if not self.drain_timeout >= 0:
            raise ConfigError(f"drain_timeout must be >= 0 seconds, got {self.drain_timeout}")
        if self.allowed_hosts is not None and any(not h.strip() for h in self.allowed_hosts.split(",")):
            raise ConfigError(f"allowed_hosts must be comma-separated host names, got {self.allowed_hosts!r}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if self.max_context is not None and self.max_context < 2:
            raise ConfigError(f"max_context must be >= 2, got {self.max_context}")


def resolve_api_key(config: ServerConfig, environ: Mapping[str, str]) -> ServerConfig:
    """The config with its key from ``api_key``, else ``api_key_file``, else $SPECDECODE_API_KEY in
    ``environ`` (a key on the command line shows in ``ps``; the other two do not)."""
    if config.api_key is not None and config.api_key_file is not None:
        raise ConfigError("give the API key once: --api-key or --api-key-file, not both")
    key = config.api_key
    if key is None and config.api_key_file is not None:
        try:
            key = Path(config.api_key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--api-key-file {config.api_key_file}: cannot read it ({e.__class__.__name__}); "
                              "give a readable UTF-8 file holding the key") from None
        if not key:
            raise ConfigError(f"--api-key-file {config.api_key_file} is empty; put the key in it")
    if key is None and environ.get(API_KEY_ENV, "").strip():
        key = environ[API_KEY_ENV].strip()
    return replace(config, api_key=key, api_key_file=None)
