"""Compile a one-file C++ torch extension on first use, cached per torch/Python version.

Shared by the package's CPU kernels. ``build_extension`` returns the module, or
raises ``ExtensionBuildError`` with one readable line (the compiler's first
complaint, not ninja's echo of the command) that callers log once before
falling back to eager PyTorch.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)


class ExtensionBuildError(RuntimeError):
    """The extension could not be compiled or loaded here."""


def build_dir(name: str) -> Path:
    """``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/specdecode/torch_extensions``, one folder per torch/Python."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    base = Path(root).expanduser() if root else Path("~/.cache/specdecode/torch_extensions").expanduser()
    # torch's own versioning only hashes sources and flags, not the torch it was built against
    tag = re.sub(r"[^A-Za-z0-9]+", "_", f"torch{torch.__version__}_py{sys.version_info[0]}{sys.version_info[1]}")
    return base / f"{name}_{tag}"


def summarise(exc: BaseException) -> str:
    """One line for the log: the compiler's first complaint, not ninja's echo of the command."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    noise = re.compile(r"^(Error building extension|FAILED:|ninja:|\[\d+/\d+\])|\s-MMD\s|\s-shared\s")
    useful = [ln for ln in lines if not noise.search(ln)]
    keyed = [ln for ln in useful if re.search(r"error|not found|no such|cannot|fatal|undefined", ln, re.IGNORECASE)]
    line = (keyed or useful or lines or [type(exc).__name__])[0]
    return line if len(line) <= 300 else line[:297] + "..."


def clear_stale_lock(directory: Path, max_age_s: float = 600.0) -> None:
    """torch's build lock is a plain file: a build killed midway leaves it and later loads wait forever."""
    lock = directory / "lock"
    try:
        if time.time() - lock.stat().st_mtime > max_age_s:
            lock.unlink()
            logger.info("removed a stale build lock %s", lock)
    except OSError:
        pass


def build_extension(name: str, source: Path) -> ModuleType:
    """Compile (first call) or load (cached) ``source`` as the extension ``name``."""
    try:
        from torch.utils.cpp_extension import load

        directory = build_dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        clear_stale_lock(directory)
        if not any(directory.glob("*.so")):
            logger.info("compiling %s into %s (first use only)", source.name, directory)
        # keep torch's build chatter (compiler-ABI warnings etc.) out of the log
        torch_log = logging.getLogger("torch.utils.cpp_extension")
        level = torch_log.level
        torch_log.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return load(name=name, sources=[str(source)], extra_cflags=["-O3", "-fopenmp"],
                            extra_ldflags=["-fopenmp"], build_directory=str(directory), verbose=False)
        finally:
            torch_log.setLevel(level)
    except Exception as exc:  # no compiler / ninja / headers
        raise ExtensionBuildError(f"could not build the C++ extension {name} ({type(exc).__name__}: {summarise(exc)})") from exc
