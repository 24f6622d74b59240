"""Corpus listing, the held-out split and token packing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specdecode.train import data as D

pytestmark = pytest.mark.slow  # full tier: make test-full


def test_folder_glob_and_file_specs(corpus_dir: Path) -> None:
    by_dir = D.list_corpus([str(corpus_dir)])
    assert len(by_dir) == 24 and all(f.rel.startswith(("pkg/", "lib/")) for f in by_dir)
    by_glob = D.list_corpus([str(corpus_dir / "pkg" / "*.py")])
    assert len(by_glob) == 8 and all("/" not in f.rel for f in by_glob)
    one = D.list_corpus([str(corpus_dir / "lib" / "mod_01.py")])
    assert [f.rel for f in one] == ["mod_01.py"]
    # overlapping specs do not duplicate files
    assert len(D.list_corpus([str(corpus_dir), str(corpus_dir / "pkg" / "*.py")])) == 24


def test_split_is_deterministic_disjoint_and_by_file(corpus_dir: Path) -> None:
    files = D.list_corpus([str(corpus_dir)])
    train, held = D.split_corpus(files)
    train2, held2 = D.split_corpus(list(reversed(files)))
    assert {f.rel for f in held} == {f.rel for f in held2} and held
    assert not {f.path for f in train} & {f.path for f in held}
    assert len(train) + len(held) == len(files)
    assert [f.rel for f in D.held_out_files([str(corpus_dir)])] == [f.rel for f in held]


def test_hash_split_fraction_is_about_five_percent() -> None:
    rels = [f"pkg/module_{i}.py" for i in range(4000)]
    frac = sum(D.is_held_out(r) for r in rels) / len(rels)
    assert 0.04 < frac < 0.06


def test_default_corpus_is_stdlib_without_tests_or_site_packages() -> None:
    files = D.list_corpus()
    rels = [f.rel for f in files]
    assert any(r == "os.py" for r in rels) and len(files) > 100
    assert not any(part in ("test", "tests", "site-packages", "idle_test") for r in rels for part in r.split("/")[:-1])
    train, held = D.split_corpus(files)
    assert 0.02 < len(held) / len(files) < 0.08


def test_missing_path_and_unmatched_glob_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="corpus path .*nope.* does not exist"):
        D.list_corpus([str(tmp_path / "nope")])
    with pytest.raises(FileNotFoundError, match="corpus glob .* matched no files"):
        D.list_corpus([str(tmp_path / "*.zzz")])


def test_empty_corpus_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(D.CorpusError, match="corpus is empty"):
        D.list_corpus([str(tmp_path / "empty")])
    (tmp_path / "blank.py").write_text("")
    with pytest.raises(D.CorpusError, match="corpus is empty"):
        D.list_corpus([str(tmp_path / "blank.py")])
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01\x02")
    with pytest.raises(D.CorpusError, match="corpus is empty"):
        D.list_corpus([str(tmp_path / "bin.dat")])
    (tmp_path / "one.py").write_text("x = 1\n")
    with pytest.raises(D.CorpusError, match="need at least 2"):
        D.split_corpus(D.list_corpus([str(tmp_path / "one.py")]))


def test_token_stream_packing_and_sampler() -> None:
    stream = np.arange(1, 101, dtype=np.int32)
    blocks = D.pack_blocks(stream, 16)
    assert blocks.shape == (6, 16) and blocks[1, 0].item() == 17
    with pytest.raises(D.CorpusError, match="fewer than one block"):
        D.pack_blocks(stream[:10], 16)
    s = D.BlockSampler(stream, 8, 4, seed=3)
    a, b = s.batch(5), D.BlockSampler(stream, 8, 4, seed=3).batch(5)
    assert a.shape == (4, 9) and (a == b).all()
    assert ((a[:, 1:] - a[:, :-1]) == 1).all()  # contiguous windows
    assert not (s.batch(6) == a).all()


def test_token_stream_prefixes_each_document_with_separator(corpus_dir: Path) -> None:
    files = D.list_corpus([str(corpus_dir)])[:3]
    enc = lambda texts: [[len(t) % 7 + 1, 5] for t in texts]  # noqa: E731
    stream = D.token_stream(files, enc, 0)
    assert stream.tolist()[::3] == [0, 0, 0] and len(stream) == 9
