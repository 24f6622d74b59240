"""The kernel build folder is keyed by content: checkouts and versions never rebuild each other's kernels."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdecode.kernels.build import CFLAGS, build_dir, source_key

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


def test_the_shipped_kernels_have_distinct_stable_keys() -> None:
    kernels = Path(__file__).resolve().parents[2] / "src" / "specdecode" / "kernels"
    sources = sorted(kernels.glob("*.cpp"))
    assert sources
    keys = [source_key([s]) for s in sources]
    assert len(set(keys)) == len(keys) and keys == [source_key([s]) for s in sources]
