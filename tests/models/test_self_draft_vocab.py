"""Self-drafts over a vocabulary cut (``drafters/vocab.self_draft_ids``): the draft proposes only the cut's
tokens, the output stays plain decoding's, and a GGUF target's frequency list lives beside the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gguf_util import tiny_gguf
from specdecode import DrafterOptions, build_drafter, generate, load_model
from specdecode.drafters.vocab import rank_tokens, self_draft_ids, vocab_path, write_vocab_file

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("transformers")
    _, path = tiny_gguf(tmp_path_factory.mktemp("cut"), "Q8_0")
    return load_model(path)


def test_no_cut_by_default_without_a_frequency_list(target) -> None:
    assert self_draft_ids(target, "auto") is None and self_draft_ids(target, "full") is None
    assert torch.equal(self_draft_ids(target, 20), torch.arange(20))  # a BPE vocabulary ranks by id


@pytest.mark.parametrize("name", ["quant", "layerskip"])
def test_a_cut_self_draft_proposes_inside_the_cut_and_changes_no_output(target, name: str) -> None:
    ids = [5, 9, 13, 2, 5, 9, 13, 2]
    plain = generate(target, ids, max_new_tokens=24, ignore_eos=True).token_ids
    drafter = build_drafter(name, DrafterOptions(gamma=3, vocab=40))
    proposed: list[int] = []
    pick = drafter._pick

    def spy(logits, ctx, probs, index):  # type: ignore[no-untyped-def]
        t = pick(logits, ctx, probs, index)
        proposed.append(t)
        return t

    drafter._pick = spy  # type: ignore[method-assign]
    out = generate(target, ids, drafter=drafter, max_new_tokens=24, ignore_eos=True)
    assert out.token_ids == plain
    assert drafter.cut is not None and drafter.cut.size == 40
    assert proposed and all(0 <= t < 40 for t in proposed), proposed


def test_a_gguf_targets_frequency_list_sits_beside_the_file(target) -> None:
    path = Path(target.path)
    assert vocab_path(path) == path.with_name(path.name + ".draft_vocab.json")
    stream = np.array([7, 7, 7, 3, 3, 11], dtype=np.int64)
    ranked, counts = rank_tokens(stream, target.vocab_size)
    written = write_vocab_file(path, ranked, counts, 2, "test")
    try:
        assert written == vocab_path(path)
        assert self_draft_ids(target, "auto").tolist() == [3, 7]
    finally:
        written.unlink()
