"""Fixtures: tiny real checkpoints and servers on free loopback ports (background threads)."""

from __future__ import annotations

from typing import Iterator

import pytest

import specdecode
from specdecode.server.config import ServerConfig
from server_helpers import MODEL_NAME, Models, RunningServer, serve
from tiny import build_model


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("server-models")
    # A 4096-token window so a generation can be long enough to be interrupted.
    t = build_model(root / MODEL_NAME, "llama", seed=0, max_position_embeddings=4096)
    d = build_model(root / "draft", "llama", seed=4, layers=1, hidden=32)
    return Models(specdecode.load_model(t), specdecode.load_model(d), t)


@pytest.fixture(scope="module")
def server(models: Models) -> Iterator[RunningServer]:
    """Self-speculation (draft = target) with the full γ every step: every draft token is accepted,
    so batched verification, multi-token acceptance and rollback are all exercised."""
    yield from serve(models, models.target, ServerConfig(max_batch_size=16, max_queue=32, request_timeout=60,
                                                         speculation="always"))


@pytest.fixture(scope="module")
def auto_server(models: Models) -> Iterator[RunningServer]:
    """A separate random draft (acceptance ~0) under the cost-based policy (``--speculation auto``), which
    picks 0 to 4 tokens a pass for a request without its own γ."""
    yield from serve(models, models.draft, ServerConfig(max_batch_size=16, max_queue=32, request_timeout=60,
                                                        speculation="auto"))
