"""The kernel build folder is keyed by source and build environment: checkouts of one version in one
environment share a build, and two environments (a development venv and a service's install) never
rebuild each other's kernels."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specdecode.kernels import build
from specdecode.kernels.build import (CFLAGS, build_dir, build_extension, source_files, source_key, stable_source,
                                      toolchain)

SOURCE = "#include <torch/extension.h>\nint f() { return 1; }\n"


def _checkout(root: Path, text: str) -> Path:
    root.mkdir(parents=True)
    src = root / "smallm_linear.cpp"
    src.write_text(text)
    return src


def test_two_checkouts_of_one_version_share_a_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    a = _checkout(tmp_path / "dev" / "kernels", SOURCE)
    b = _checkout(tmp_path / "site-packages" / "kernels", SOURCE)
    assert build_dir("ext", [a]) == build_dir("ext", [b])
    assert build_dir("ext", [a]).parent == tmp_path / "cache"
    # and ninja sees one source path from both: the copy inside the folder
    d = build_dir("ext", [a])
    assert stable_source(d, a) == stable_source(d, b) == d / "src" / "smallm_linear.cpp"


def test_two_versions_get_their_own_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    old = _checkout(tmp_path / "v1", SOURCE)
    new = _checkout(tmp_path / "v2", SOURCE.replace("return 1", "return 2"))
    assert build_dir("ext", [old]) != build_dir("ext", [new])
    assert build_dir("ext", [old]).name.startswith("ext_torch")


def test_flags_change_the_key(tmp_path: Path) -> None:
    src = _checkout(tmp_path / "k", SOURCE)
    assert source_key([src]) == source_key([src], CFLAGS)
    assert source_key([src]) != source_key([src], (*CFLAGS, "-mavx2"))
    assert source_key([src]) != source_key([src], CFLAGS, ("-lfoo",))


def test_the_toolchain_names_what_reaches_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import sysconfig

    import torch

    tools = toolchain()
    assert os.path.dirname(torch.__file__) in tools and torch.__version__ in tools
    assert os.path.join(os.path.dirname(torch.__file__), "include") in tools  # torch's include path
    assert sysconfig.get_paths()["include"] in tools and sys.version in tools
    monkeypatch.setenv("CXX", "clang++")
    assert toolchain()[0] == "clang++"


def test_two_environments_get_their_own_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated: every input of the toolchain in turn differs between two environments."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    src = _checkout(tmp_path / "k", SOURCE)
    base = toolchain()
    dirs = {build_dir("ext", [src], tools=base)}
    for i in range(len(base)):
        other = list(base)
        other[i] = other[i] + "-elsewhere"
        dirs.add(build_dir("ext", [src], tools=other))
    assert len(dirs) == len(base) + 1
    assert build_dir("ext", [src], tools=base) == build_dir("ext", [src])  # the default is this environment


def test_the_source_copy_is_written_once(tmp_path: Path) -> None:
    src = _checkout(tmp_path / "k", SOURCE)
    d = tmp_path / "build"
    copy = stable_source(d, src)
    os.utime(copy, (1_000_000, 1_000_000))
    assert stable_source(d, src) == copy and copy.stat().st_mtime == 1_000_000  # untouched: ninja sees no change
    src.write_text(SOURCE + "// edited\n")
    assert stable_source(d, src).read_text().endswith("// edited\n")


def test_the_shipped_kernels_have_distinct_stable_keys() -> None:
    kernels = Path(__file__).resolve().parents[2] / "src" / "specdecode" / "kernels"
    sources = sorted(kernels.glob("*.cpp"))
    assert sources
    keys = [source_key(source_files(s)) for s in sources]
    assert len(set(keys)) == len(keys) and keys == [source_key(source_files(s)) for s in sources]
    # every header beside them is some kernel's (the wheel ships kernels/*.h for them)
    used = {f.name for s in sources for f in source_files(s)[1:]}
    assert used == {h.name for h in kernels.glob("*.h")}


def test_a_kernels_local_headers_are_part_of_its_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel split into headers: they are found (recursively, once each, system and missing ones left to the
    compiler), key its folder (an edited header never loads the stale library) and sit beside the copy compiled."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    k = tmp_path / "k"
    src = _checkout(k, '#include <vector>\n#include "a.h"\n  #  include "b.h"\n#include "gone.h"\n' + SOURCE)
    (k / "a.h").write_text('#pragma once\n#include "b.h"\nint a() { return b(); }\n')
    (k / "b.h").write_text("#pragma once\nint b() { return 2; }\n")
    assert source_files(src) == [src, k / "a.h", k / "b.h"]
    before = build_dir("ext", source_files(src))
    (k / "b.h").write_text("#pragma once\nint b() { return 3; }\n")
    assert build_dir("ext", source_files(src)) != before

    seen: dict[str, object] = {}

    def loader(*, name: str, sources: list[str], extra_cflags: list[str], extra_ldflags: list[str],
               build_directory: str, verbose: bool) -> object:
        seen["sources"] = sources
        seen["beside"] = sorted(p.name for p in Path(sources[0]).parent.iterdir())
        (Path(build_directory) / f"{name}.so").write_bytes(b"lib")
        return object()

    build_extension("ext", src, loader=loader)
    assert seen["sources"] == [str(build_dir("ext", source_files(src)) / "src" / "smallm_linear.cpp")]
    assert seen["beside"] == ["a.h", "b.h", "smallm_linear.cpp"]


TINY = """#include <pybind11/pybind11.h>
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("one", [] { return 1; }); }
"""

BUILD = textwrap.dedent("""
    import sys, pathlib, torch
    from specdecode.kernels.build import build_extension, build_dir
    src = pathlib.Path(sys.argv[1])
    assert build_extension("specdecode_envtest", src).one() == 1
    print(torch.__file__)
    print(build_dir("specdecode_envtest", [src]))
""")


@pytest.mark.slow
def test_two_real_environments_alternate_without_rebuilding(tmp_path: Path) -> None:
    """Two environments whose torch lives at different paths (the second reaches this one's torch through
    a symlinked site folder, as a venv with its own install would, with other include paths): each builds
    once, then alternating runs compile nothing."""
    import torch

    site_b = tmp_path / "env-b" / "site-packages"
    site_b.mkdir(parents=True)
    (site_b / "torch").symlink_to(Path(torch.__file__).resolve().parent, target_is_directory=True)
    src = tmp_path / "envtest.cpp"
    src.write_text(TINY)
    script = tmp_path / "build.py"
    script.write_text(BUILD)
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path / "cache"))
    env.pop("PYTHONPATH", None)

    def run(pythonpath: str) -> tuple[str, Path]:
        e = dict(env, PYTHONPATH=pythonpath) if pythonpath else env
        out = subprocess.run([sys.executable, str(script), str(src)], env=e, capture_output=True, text=True,
                             timeout=600, check=True).stdout.split("\n")
        return out[0], Path(out[1])

    torch_a, dir_a = run("")
    torch_b, dir_b = run(str(site_b))
    assert torch_a != torch_b and dir_a != dir_b  # two environments: two folders
    stamps = {d: (next(d.glob("*.so")).stat().st_mtime_ns, (d / ".ninja_log").read_text()) for d in (dir_a, dir_b)}
    for _ in range(2):
        assert run("")[1] == dir_a and run(str(site_b))[1] == dir_b
    for d, (so, log) in stamps.items():
        assert next(d.glob("*.so")).stat().st_mtime_ns == so and (d / ".ninja_log").read_text() == log, \
            f"{d.name} was rebuilt"
    assert build  # the module under test


@pytest.mark.skipif(not (Path(sys.executable).parent / "ninja").is_file(), reason="no ninja beside this interpreter")
def test_a_process_without_the_venv_on_path_builds_with_the_same_ninja_in_the_same_folder() -> None:
    """`/venv/bin/python` started with PATH=/usr/bin:/bin found the system's ninja (1.11) where this one found
    the venv's (1.13): each rebuilt the other's kernels in one folder, three compiles per test run."""
    from specdecode.kernels.build import ninja_path

    code = ("from specdecode.kernels.build import build_dir, ninja_path\n"
            "print(ninja_path()); print(build_dir('ext'))")
    env = {"PATH": "/usr/bin:/bin", **{k: os.environ[k] for k in ("HOME", "TORCH_EXTENSIONS_DIR") if k in os.environ}}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [ninja_path(), str(build_dir("ext"))]
    assert ninja_path() == str(Path(sys.executable).parent / "ninja")
