"""Compile a one-file C++ torch extension on first use, cached per source and build environment.

Shared by the package's CPU kernels. torch's loader writes a ``build.ninja`` that names the
source's path, the compiler, torch's and Python's include paths and torch's library path, and
ninja rebuilds whenever that file changes: two virtualenvs (or checkouts) sharing one build
folder rebuild each other's kernels on every alternate run (~40 s each on 2 cores, and every
other process's timings are wrong meanwhile). So the folder is keyed by everything that reaches
the command line (``toolchain``) plus the source's bytes, and the source is compiled from a copy
inside the folder, so its path is the same for every checkout. The ninja that builds is the interpreter's own
where it has one (``ninja_path``): a pip-installed ninja 1.13 and the system's 1.11 rebuilt each other's
builds in one folder (a process started without the venv on PATH finds the system's), so every test run
compiled the three kernels again. ``build_extension`` returns the module, or
raises ``ExtensionBuildError`` with one readable line (the compiler's first
complaint, not ninja's echo of the command) that callers log once before
falling back to eager PyTorch. A cached build that does not load is deleted and built once more, and
``extension_problems`` says which extensions are off, for /health and the server's start line: those that
failed, and those whose callers fell back for another reason (``report_fallback``: no AVX2, switched off).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import sys
import sysconfig
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional, Sequence

import torch

logger = logging.getLogger(__name__)


class ExtensionBuildError(RuntimeError):
    """The extension could not be compiled or loaded here."""


CFLAGS = ("-O3", "-fopenmp")
LDFLAGS = ("-fopenmp",)


def ninja_path() -> str:
    """The ninja that builds: the one beside the interpreter (a venv's, installed with torch's build
    requirements) wherever PATH points, else PATH's ("" if none)."""
    own = Path(sys.executable).parent / "ninja"
    return str(own) if own.is_file() and os.access(own, os.X_OK) else (shutil.which("ninja") or "")


def _cpp_extension() -> ModuleType:
    """torch's C++ extension builder."""
    from torch.utils import cpp_extension  # lazy: ~80 ms (setuptools), needed only to build or locate a kernel

    return cpp_extension


def toolchain(cflags: Sequence[str] = CFLAGS, ldflags: Sequence[str] = LDFLAGS) -> tuple[str, ...]:
    """What reaches the build's command lines besides the source: compiler, flags, torch's version,
    install path, include and library paths, its C++ ABI, and Python's version and include path.
    Each differs between two environments on one machine whenever their binaries would."""
    ext = _cpp_extension()
    try:
        includes = ext.include_paths("cpu")
    except TypeError:  # torch < 2.4: include_paths(cuda=False)
        includes = ext.include_paths()
    try:
        libraries = ext.library_paths("cpu")
    except TypeError:
        libraries = ext.library_paths()
    abi = str(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", ""))
    return (os.environ.get("CXX", "c++"), ninja_path(), *cflags, "|", *ldflags, "|", torch.__version__,
            os.path.dirname(torch.__file__),
            *includes, "|", *libraries, "|", abi, sys.version, sysconfig.get_paths().get("include", ""))


def source_key(sources: Sequence[Path], cflags: Sequence[str] = CFLAGS, ldflags: Sequence[str] = LDFLAGS,
               tools: Optional[Sequence[str]] = None) -> str:
    """Hash of what decides the binary (12 hex digits): the sources' names and bytes and the
    ``toolchain`` (``tools``, given: that instead of this environment's)."""
    h = hashlib.sha256()
    for src in sources:
        h.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    h.update("\0".join(toolchain(cflags, ldflags) if tools is None else tools).encode())
    return h.hexdigest()[:12]


def build_dir(name: str, sources: Sequence[Path] = (), cflags: Sequence[str] = CFLAGS,
              ldflags: Sequence[str] = LDFLAGS, tools: Optional[Sequence[str]] = None) -> Path:
    """``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/specdecode/torch_extensions``, one folder per source and
    build environment (``source_key``): a development venv and a service's install each keep their
    own build, and two checkouts of one version in one environment share theirs."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    base = Path(root).expanduser() if root else Path("~/.cache/specdecode/torch_extensions").expanduser()
    tag = re.sub(r"[^A-Za-z0-9]+", "_", f"torch{torch.__version__}_py{sys.version_info[0]}{sys.version_info[1]}")
    return base / f"{name}_{tag}_{source_key(sources, cflags, ldflags, tools)}"


_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.MULTILINE)


def source_files(source: Path) -> list[Path]:
    """``source`` and the headers it includes from beside it (``#include "x.h"``, recursively), each once in
    first-include order: what a build of it reads from this package, so what its key covers and its build
    folder holds (a header's change must not load a stale library)."""
    files: list[Path] = []
    todo = [source]
    while todo:
        f = todo.pop(0)
        if f not in files:
            files.append(f)
            todo += [f.parent / h for h in _LOCAL_INCLUDE.findall(f.read_text()) if (f.parent / h).is_file()]
    return files


def stable_source(directory: Path, source: Path) -> Path:
    """A copy of ``source`` inside its build folder (written only when missing or different): the path
    ninja sees is then the same from every checkout, and an unchanged copy keeps its mtime."""
    copy = directory / "src" / source.name
    data = source.read_bytes()
    if not copy.is_file() or copy.read_bytes() != data:
        copy.parent.mkdir(parents=True, exist_ok=True)
        tmp = copy.with_suffix(copy.suffix + f".{os.getpid()}.tmp")
        shutil.copyfile(source, tmp)
        os.replace(tmp, copy)  # atomic: a concurrent build never reads half a file
    return copy


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


Loader = Callable[..., ModuleType]  # torch.utils.cpp_extension.load's keywords: name, sources, ..., verbose

# every extension build_extension was asked for: None once loaded, else why it is not (for /health)
_STATUS: dict[str, Optional[str]] = {}
# a short name for each problem in _STATUS that is not a failed build (/health shows it: the detail names paths)
_REASONS: dict[str, str] = {}
BUILD_FAILED = "build_failed"


def extension_problems() -> dict[str, str]:
    """The extensions that are off in this process (failed to build or load, or their caller fell back:
    ``report_fallback``), with the reason (their callers run eager PyTorch instead: slower, so the server
    says so)."""
    return {name: why for name, why in _STATUS.items() if why is not None}


def extension_reasons() -> dict[str, str]:
    """``extension_problems``'s extensions with a short reason name each, free of local paths: "build_failed",
    or what a caller gave ``report_fallback`` ("no_avx2", "disabled")."""
    return {name: _REASONS.get(name, BUILD_FAILED) for name in extension_problems()}


def report_fallback(name: str, reason: Optional[str], detail: str = "") -> None:
    """Record that the caller of extension ``name`` runs eager PyTorch although the extension built (``reason``
    a short name such as "no_avx2" or "disabled", ``detail`` the log's line), or, ``reason`` None, that it runs
    the extension (a switch read per call may turn it back on). /health's ``fast_path`` is then false whenever
    eager PyTorch runs instead, at about half the speed, not only when a build failed."""
    if reason is None:
        _STATUS[name] = None
        _REASONS.pop(name, None)
        return
    _STATUS[name] = detail or reason
    _REASONS[name] = reason


def build_extension(name: str, source: Path, loader: Optional[Loader] = None) -> ModuleType:
    """Compile (first call) or load (cached) ``source`` as the extension ``name``.

    A cached library that fails to load (truncated by a full disk, overwritten, a killed build) is never
    rebuilt by ninja, whose outputs look up to date: its outputs are deleted and it is built once more,
    rather than every later process falling back to eager PyTorch for good. ``loader``: torch's ``load``
    unless given (tests pass a stub)."""
    try:
        module = _build(name, source, loader)
    except ExtensionBuildError as exc:
        _STATUS[name] = str(exc)
        _REASONS.pop(name, None)
        raise
    report_fallback(name, None)
    return module


def _build(name: str, source: Path, loader: Optional[Loader]) -> ModuleType:
    cached = False
    try:
        directory = build_dir(name, source_files(source))
        directory.mkdir(parents=True, exist_ok=True)
        clear_stale_lock(directory)
        cached = any(directory.glob("*.so"))
        return _load(name, source, directory, loader, fresh=not cached)
    except Exception as exc:  # no compiler / ninja / headers, or a broken cached library
        if not cached:
            raise ExtensionBuildError(
                f"could not build the C++ extension {name} ({type(exc).__name__}: {summarise(exc)})") from exc
        logger.warning("the cached build of %s in %s does not load (%s: %s); deleting it and building it again",
                       name, directory, type(exc).__name__, summarise(exc))
    try:
        for out in [*directory.glob("*.so"), *directory.glob("*.o")]:
            out.unlink()
        if loader is None:
            _forget_build(name)
        return _load(name, source, directory, loader, fresh=True)
    except Exception as exc:
        raise ExtensionBuildError(f"could not rebuild the C++ extension {name} after its cached build failed to "
                                  f"load ({type(exc).__name__}: {summarise(exc)})") from exc


def _forget_build(name: str) -> None:
    """Make torch's next ``load`` of ``name`` run the build: it skips the build step for an extension this
    process has already loaded (or tried to) with the same sources and flags."""
    entries = getattr(getattr(_cpp_extension(), "JIT_EXTENSION_VERSIONER", None), "entries", None)
    if isinstance(entries, dict):
        entries.pop(name, None)


def _load(name: str, source: Path, directory: Path, loader: Optional[Loader], fresh: bool) -> ModuleType:
    """torch's ``load`` into ``directory``, quietly, with this environment's ninja first on PATH."""
    if loader is None:
        loader = _cpp_extension().load
    if fresh:
        logger.info("compiling %s into %s (first use of this source only)", source.name, directory)
    t0 = time.perf_counter()
    # keep torch's build chatter (compiler-ABI warnings etc.) out of the log
    torch_log = logging.getLogger("torch.utils.cpp_extension")
    level = torch_log.level
    torch_log.setLevel(logging.ERROR)
    path = os.environ.get("PATH")
    ninja = ninja_path()
    if ninja:  # torch runs whichever `ninja` PATH finds first: make it this one (the folder's key)
        os.environ["PATH"] = os.path.dirname(ninja) + os.pathsep + (path or "")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copies = [stable_source(directory, f) for f in source_files(source)]  # headers beside the source
            module = loader(name=name, sources=[str(copies[0])], extra_cflags=list(CFLAGS),
                            extra_ldflags=list(LDFLAGS), build_directory=str(directory), verbose=False)
    finally:
        torch_log.setLevel(level)
        if path is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = path
    if fresh:
        logger.info("compiled %s in %.1f s", source.name, time.perf_counter() - t0)
    return module
