"""Shared fixtures: tiny real checkpoints built once per session with transformers (no downloads)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny import build_model  # noqa: E402

torch.set_num_threads(1)  # tiny models gain nothing from threads; avoids oversubscription


# Models come from load_model, whose default is the fast CPU kernel with bf16-dot products where it builds
# (SPECDECODE_FAST_LINEAR=0: eager path), so the exactness tests cover the code users run.


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Targets per architecture plus draft models that share the llama target's tokenizer."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "llama": build_model(root / "llama", "llama", seed=0),
        "qwen2": build_model(root / "qwen2", "qwen2", seed=1),
        "gpt2": build_model(root / "gpt2", "gpt2", seed=2),
        "mistral": build_model(root / "mistral", "mistral", seed=3),
        "draft": build_model(root / "draft", "llama", seed=4, layers=1, hidden=32),
        "gpt2_draft": build_model(root / "gpt2_draft", "gpt2", seed=5, layers=1, hidden=32),
    }
