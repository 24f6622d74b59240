"""The packed-weights cache: a GGUF's second load maps what its first packed, never stale bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from specdecode import load_model
from specdecode.models import gguf_load
from specdecode.models import pack_cache

from gguf_util import tiny_gguf
from test_gguf_stored import _k_quant_file

IDS = torch.tensor([[5, 9, 13, 2, 7, 11]])


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "packed"


def logits(path: Path, **kw: object) -> torch.Tensor:
    model = load_model(path, **kw)  # type: ignore[arg-type]
    with torch.inference_mode():
        return model.forward(IDS, model.new_cache(1, 8)).clone()


def no_packing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("repacked although the cache holds this file")

    monkeypatch.setattr(gguf_load, "_pack", refuse)


def test_every_packed_dtype_can_be_kept() -> None:
    from specdecode.kernels.quant import _DTYPES as PACKED  # every packed format's marking dtype

    assert len(PACKED) >= 8 and set(PACKED.values()) <= set(pack_cache._DTYPES.values())


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1", "Q4_K", "Q5_K"])
def test_the_second_load_maps_what_the_first_packed(tmp_path: Path, cache: Path, qtype: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q8_0 file (int8 as stored) and a K-quant one (q4k, the rest Q8_0): the same logits from the packer,
    from the load that writes the cache and from the one that maps it without packing."""
    path = _k_quant_file(tmp_path, qtype, ("ffn", "attn_q")) if qtype.endswith("_K") else tiny_gguf(tmp_path, qtype)[1]
    plain = logits(path, pack_cache=False)
    assert not cache.exists() or not list(cache.iterdir())  # off: nothing written
    first = logits(path)
    files = list(cache.glob("*.pack"))
    assert len(files) == 1 and files[0] == pack_cache.cache_path(path, files[0].name.split("-")[-2])
    with monkeypatch.context() as mp:
        no_packing(mp)
        second = logits(path)
    assert torch.equal(first, plain) and torch.equal(second, plain)


def test_a_changed_file_is_repacked_not_read_stale(tmp_path: Path, cache: Path) -> None:
    """The same path rewritten with other weights of the same size, its date put back: another key."""
    _, path = tiny_gguf(tmp_path / "a", "Q8_0", seed=0)
    _, other = tiny_gguf(tmp_path / "b", "Q8_0", seed=1)
    logits(path)
    st = path.stat()
    assert other.stat().st_size == st.st_size
    path.write_bytes(other.read_bytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert torch.equal(logits(path), logits(other, pack_cache=False))
    assert len(list(cache.glob("*.pack"))) == 1  # the old entry went as stale when the new one was written


def test_a_truncated_cache_file_is_ignored_and_rebuilt(tmp_path: Path, cache: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    _, path = tiny_gguf(tmp_path, "Q8_0")
    want = logits(path)
    (f,) = cache.glob("*.pack")
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # its trailer and index gone
    assert torch.equal(logits(path), want)
    assert "ignoring the packed-weights cache" in caplog.text
    assert pack_cache.PackedFile(f).names()  # rebuilt whole


def test_entries_of_files_gone_are_removed_when_one_is_written(tmp_path: Path, cache: Path) -> None:
    _, gone = tiny_gguf(tmp_path / "gone", "Q8_0", seed=0)
    _, kept = tiny_gguf(tmp_path / "kept", "Q8_0", seed=1)
    logits(gone)
    logits(kept)
    assert len(list(cache.glob("*.pack"))) == 2
    gone.unlink()
    _, new = tiny_gguf(tmp_path / "new", "Q8_0", seed=2)
    logits(new)
    names = sorted(p.name.split("-int8-")[0] for p in cache.glob("*.pack"))
    assert names == sorted([kept.stem, new.stem])


def test_an_unwritable_cache_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SPECDECODE_CACHE", str(blocker))  # mkdir under a file fails
    _, path = tiny_gguf(tmp_path, "Q8_0")
    assert torch.equal(logits(path), logits(path, pack_cache=False))


def test_a_tensor_written_to_stays_private(tmp_path: Path, cache: Path) -> None:
    """Copy-on-write mapping: a process that writes into a mapped weight changes neither the file nor
    another load."""
    _, path = tiny_gguf(tmp_path, "Q8_0")
    want = logits(path)
    (f,) = cache.glob("*.pack")
    packed = pack_cache.PackedFile(f)
    name = next(iter(packed.names()))
    t = packed.get(name)
    t.zero_()
    assert torch.equal(logits(path), want)


def test_the_writer_hands_back_the_files_pages_and_puts_the_file_in_place(tmp_path: Path, cache: Path) -> None:
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    w = pack_cache.CacheWriter(gguf, "int8")
    a, b = torch.arange(5000, dtype=torch.int16).view(50, 100), torch.randn(3, 7)
    ka, kb = w.keep("a", a), w.keep("b", b)
    assert torch.equal(ka, a) and torch.equal(kb, b)
    assert ka.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()  # not the packed tensor itself
    assert not list(cache.glob("*.pack"))  # in place only once whole
    path = w.finish()
    assert path is not None and path.is_file() and not list(cache.glob("*.tmp*"))
    got = pack_cache.PackedFile(path)
    assert torch.equal(got.get("a"), a) and torch.equal(got.get("b"), b) and got.fmt == "int8"


def test_a_write_that_fails_midway_leaves_no_file_and_a_correct_model(tmp_path: Path, cache: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _, path = tiny_gguf(tmp_path, "Q8_0")
    want = logits(path, pack_cache=False)
    calls = {"n": 0}
    keep = pack_cache.CacheWriter.keep

    def full_disk(self: pack_cache.CacheWriter, name: str, t: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 3 and self._file is not None:
            self._file.close()  # the next write raises OSError (ValueError on a closed file is not it): reopen RO
            self._file = self._tmp.open("rb")  # type: ignore[assignment]
        return keep(self, name, t)

    monkeypatch.setattr(pack_cache.CacheWriter, "keep", full_disk)
    assert torch.equal(logits(path), want)
    assert calls["n"] > 3 and not list(cache.glob("*.pack")) and not list(cache.glob("*.tmp*"))
