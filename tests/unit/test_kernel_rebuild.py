"""A cached kernel library that does not load is deleted and built once more (issue 49): ninja sees its
outputs as up to date and would never rebuild it, so every later process fell back to eager PyTorch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

import pytest

from specdecode.kernels import build
from specdecode.kernels.build import ExtensionBuildError, build_dir, build_extension, extension_problems

SOURCE = "#include <torch/extension.h>\nint answer() { return 42; }\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) " \
         "{ m.def(\"answer\", &answer); }\n"
GOOD, GARBAGE = b"\x7fELF a library", b"garbage written over the library"


class StubLoader:
    """torch's ``load`` as far as build_extension sees it: compiles (writes a good library) when none is
    there, and fails to import a garbage one, as dlopen does."""

    def __init__(self, compiles: bool = True) -> None:
        self.compiles, self.calls, self.compiled = compiles, 0, 0

    def __call__(self, *, name: str, sources: Sequence[str], extra_cflags: Sequence[str],
                 extra_ldflags: Sequence[str], build_directory: str, verbose: bool) -> ModuleType:
        self.calls += 1
        lib = Path(build_directory) / f"{name}.so"
        if not lib.exists():
            if not self.compiles:
                raise RuntimeError("Error building extension: c++: error: no compiler here")
            lib.write_bytes(GOOD)
            self.compiled += 1
        if lib.read_bytes() != GOOD:
            raise ImportError(f"{lib}: invalid ELF header")
        return ModuleType(name)


def _cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, content: Optional[bytes]) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_STATUS", {})
    src = tmp_path / "k.cpp"
    src.write_text(SOURCE)
    if content is not None:
        d = build_dir(name, [src])
        d.mkdir(parents=True)
        (d / f"{name}.so").write_bytes(content)
        (d / "k.o").write_bytes(content)
    return src


def test_a_garbage_cached_library_is_deleted_and_rebuilt_once(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    src = _cached(tmp_path, monkeypatch, "ext_a", GARBAGE)
    loader = StubLoader()
    module = build_extension("ext_a", src, loader=loader)
    assert module.__name__ == "ext_a"
    assert (loader.calls, loader.compiled) == (2, 1)  # the failed load, then a fresh build
    d = build_dir("ext_a", [src])
    assert (d / "ext_a.so").read_bytes() == GOOD and not (d / "k.o").exists()
    assert extension_problems() == {}
    assert build_extension("ext_a", src, loader=loader) is not None and loader.calls == 3  # loads, no rebuild


def test_a_rebuild_that_fails_is_tried_once_and_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _cached(tmp_path, monkeypatch, "ext_b", GARBAGE)
    loader = StubLoader(compiles=False)
    with pytest.raises(ExtensionBuildError, match="could not rebuild the C\\+\\+ extension ext_b"):
        build_extension("ext_b", src, loader=loader)
    assert loader.calls == 2
    assert set(extension_problems()) == {"ext_b"}


def test_a_fresh_build_that_fails_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _cached(tmp_path, monkeypatch, "ext_c", None)
    loader = StubLoader(compiles=False)
    with pytest.raises(ExtensionBuildError, match="could not build the C\\+\\+ extension ext_c.*no compiler"):
        build_extension("ext_c", src, loader=loader)
    assert loader.calls == 1 and "ext_c" in extension_problems()


def test_health_says_when_the_fast_path_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from specdecode.server.app import kernel_status

    monkeypatch.setattr(build, "_REASONS", {})  # no reason an earlier test recorded
    monkeypatch.setattr(build, "_STATUS", {"specdecode_decode_ops": None})
    assert kernel_status() == {"fast_path": True, "failed": [], "reasons": {}}
    monkeypatch.setattr(build, "_STATUS", {"specdecode_decode_ops": None, "specdecode_smallm_linear": "no compiler"})
    assert kernel_status() == {"fast_path": False, "failed": ["specdecode_smallm_linear"],
                               "reasons": {"specdecode_smallm_linear": "build_failed"}}


@pytest.mark.slow
def test_a_real_corrupt_library_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With torch's own loader and compiler: a library overwritten with garbage builds again and loads."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_STATUS", {})
    src = tmp_path / "k.cpp"
    src.write_text(SOURCE)
    name = "specdecode_test_rebuild"
    # the first build in another process: this one must not have the library mapped when it is overwritten
    first = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from specdecode.kernels."
                            "build import build_extension; build_extension(sys.argv[1], Path(sys.argv[2]))",
                            name, str(src)], capture_output=True, text=True, timeout=600)
    if first.returncode != 0:
        pytest.skip(f"no C++ toolchain here: {first.stderr[-300:]}")
    libs = list(build_dir(name, [src]).glob("*.so"))
    assert libs
    for lib in libs:
        lib.write_bytes(GARBAGE)
    module = build_extension(name, src)
    assert module.answer() == 42
    assert extension_problems() == {}
