"""The conformance suite reuses the server tests' helpers (a server on a free loopback port)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
