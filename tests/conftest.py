"""Shared fixtures: tiny real checkpoints built once per session with transformers (no downloads)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny import build_model  # noqa: E402

torch.set_num_threads(1)  # tiny models gain nothing from threads; avoids oversubscription


@pytest.fixture(autouse=True, scope="session")
def fast_path() -> None:
    """Every test runs on the fast CPU kernel when it builds here (SPECDECODE_FAST_LINEAR=0: eager path),
    so the exactness tests cover the code users run."""
    from specdecode.kernels import enable_fast_linear
    from specdecode.kernels.fused import enable_fused_ops

    enable_fast_linear(True, bf16_dot=True)  # the CLI's default (--matmul bf16); fp32 weights are unaffected
    enable_fused_ops(True)


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
