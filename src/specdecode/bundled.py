"""Where the bundled models live (the toy code-target and its drafters), read by the CLI and the registry."""

from __future__ import annotations

import os
from pathlib import Path

REPO_MODELS = Path(__file__).resolve().parents[2] / "models"
DEFAULT_TARGET = "code-target"
DEFAULT_DRAFT = "code-draft"


def default_model_dir(name: str) -> Path:
    """The bundled default models: $SPECDECODE_MODELS_DIR, else models/ beside the source tree."""
    root = Path(os.environ.get("SPECDECODE_MODELS_DIR", REPO_MODELS))
    return root / name
