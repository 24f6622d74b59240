"""The suffix datastore: its file round trip and checks, the answers it is built from, and how the drafter
weighs its matches against the live text's (a longer live match wins; its own calibration; kept on forget)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdecode.config import ConfigError, SamplingConfig
from specdecode.sizing.costs import Costs
from specdecode.draft import DraftContext
from specdecode.drafters.suffix import BUCKETS, STORE_LEAD, SuffixDrafter, _slot
from specdecode.drafters.suffix_store import STORE_FILE, is_store_dir, load_store, read_store, save_store
from specdecode.train.datastore import answer_of

FREE = Costs(c=0.0, v=(1.0,) * 64)
V = 500


class _Target:
    """What ``prepare_rows`` reads of a target."""

    path, vocab_size = "tiny", V
    device = torch.device("cpu")


def _drafter(tmp_path: Path, docs: list[list[int]]) -> SuffixDrafter:
    d = SuffixDrafter(costs=FREE, store=str(save_store(tmp_path / "store", docs, V, {"source": "test"})))
    d.prepare_rows(_Target(), 1, 64)  # type: ignore[arg-type]
    return d


def _ctx(tokens: list[int], k: int = 8) -> DraftContext:
    return DraftContext(tokens, k, SamplingConfig(), None)


def test_store_round_trip_and_its_checks(tmp_path: Path) -> None:
    docs = [[1, 2, 3], [499, 0], [7]]
    out = save_store(tmp_path / "s", docs, V, {"source": "test"})
    assert is_store_dir(out) and not is_store_dir(tmp_path)
    back, info = read_store(out)
    assert back == docs and info["vocab_size"] == V and info["tokens"] == 6 and info["recipe"] == {"source": "test"}
    index = load_store(out, V)
    assert index.n_tokens == 6 and index.lookup([9, 1, 2]) == (2, [(0, 2)])
    with pytest.raises(ConfigError, match="--suffix-datastore .* vocabulary of 500 .* has 600"):
        load_store(out, 600)
    with pytest.raises(ConfigError, match="not a suffix datastore"):
        load_store(tmp_path, V)
    with pytest.raises(ValueError, match=r"\[0, 500\)"):
        save_store(tmp_path / "bad", [[500]], V, {})
    from safetensors.numpy import load_file, save_file

    arrays = load_file(str(out / STORE_FILE))
    arrays["lengths"][0] += 1
    save_file(arrays, str(out / STORE_FILE))
    with pytest.raises(ConfigError, match="damaged"):
        load_store(out, V)


def test_answer_is_cut_after_the_last_header_through_the_first_end() -> None:
    header, eos = [1, 50, 51], {2}
    row = [1, 50, 60, 9, 2, 1, 50, 51, 30, 31, 2, 40, 41]  # a user turn, then the assistant's answer and more
    assert answer_of(row, header, eos) == [30, 31, 2]
    assert answer_of([1, 50, 51, 30, 31], header, eos) == [30, 31]  # ran out of room before its end
    assert answer_of([30, 31, 2], header, eos) is None  # a corpus window: no answer in it


def test_a_store_match_drafts_where_the_live_text_has_none(tmp_path: Path) -> None:
    d = _drafter(tmp_path, [[10, 11, 12, 13, 14, 15]])
    got = d.propose_rows({0: _ctx([90, 91, 10, 11], k=4)})[0]
    assert got.tokens == [12, 13, 14, 15]
    assert d._rows[0].pending is not None and d._rows[0].pending[0] == _slot(2, True)


def test_a_longer_live_match_wins_unless_the_store_leads_by_more_than_the_lead(tmp_path: Path) -> None:
    stored = [20, 21, 22, 23, 24, 30, 31, 32]  # "20 .. 24" goes on with 30 in the store
    live = [21, 22, 23, 24, 40, 41, 42, 43]  # and with 40 in the row's own text
    d = _drafter(tmp_path, [stored])
    # live match "21 22 23 24" (4), store match "20 .. 24" (5): a lead of 1 <= STORE_LEAD, the live text wins
    got = d.propose_rows({0: _ctx([7] + live + [9, 20, 21, 22, 23, 24], k=3)})[0]
    assert got.tokens == [40, 41, 42]
    # with a live match of 1 token ("24") the store's 5 lead by 4 > STORE_LEAD: the store wins
    assert 5 - 1 > STORE_LEAD
    got = d.propose_rows({1: _ctx([24, 40, 41, 9, 20, 21, 22, 23, 24], k=3)})[1]
    assert got.tokens == [30, 31, 32]


def test_store_matches_calibrate_apart_and_survive_forget(tmp_path: Path) -> None:
    d = _drafter(tmp_path, [[10, 11, 12, 13, 14, 15]])
    before_live, before_store = d.conf(2), d.conf(2, stored=True)
    d.propose_rows({0: _ctx([90, 91, 10, 11], k=4)})
    d.on_verified_row(0, 0)  # rejected at once
    assert d.conf(2, stored=True) < before_store and d.conf(2) == before_live
    assert _slot(2, True) == _slot(2, False) + len(BUCKETS)
    d.forget()
    assert d.store is not None and d.store.n_tokens == 6  # the datastore holds no request's text


def test_the_shipped_datastore_is_found_beside_smollm2() -> None:
    """``--target smollm2-135m-instruct`` finds it with no flags (the GGUF itself is not needed for that), and it
    holds SmolLM2's token ids."""
    from specdecode.drafters.registry import resolve_artifacts

    found = resolve_artifacts({}, None, "smollm2-135m-instruct")
    assert Path(found["suffix"]).name == "suffix"
    docs, info = read_store(Path(found["suffix"]))
    assert info["vocab_size"] == 49152 and len(docs) == info["answers"] > 1000
    assert all(0 <= t < 49152 for d in docs[:50] for t in d)


def test_store_index_finds_what_the_live_index_finds() -> None:
    """The datastore's numpy index answers every lookup as the live index would over the same documents: the
    same longest match and the same hits, most recent first, among the last ``max_occurrences`` of a key (ids
    past 2^15 included: a packed key's top bit is set)."""
    from specdecode.drafters.suffix_index import SuffixIndex
    from specdecode.drafters.suffix_store import StoreIndex

    g = torch.Generator().manual_seed(0)
    alphabet = torch.tensor([3, 4, 5, 40000, 65535])  # few symbols: long repeated matches and many hits per key
    docs = [alphabet[torch.randint(0, 5, (int(n),), generator=g)].tolist()
            for n in torch.randint(1, 60, (40,), generator=g)]
    store, live = StoreIndex(docs, max_occurrences=8), SuffixIndex(max_tokens=1 << 20, max_occurrences=8)
    for d in docs:
        live.append(live.new_doc(), d)
    queries = [alphabet[torch.randint(0, 5, (12,), generator=g)].tolist() for _ in range(300)] + [[], [7], [40000]]
    for q in queries:
        assert store.lookup(q) == live.lookup(q), q
    assert store.n_tokens == live.n_tokens
    hit = next(q for q in queries if store.lookup(q)[0] >= 3)
    m, hits = store.lookup(hit)
    assert all(store.continuation(d, e, 4) == live.continuation(d, e, 4) for d, e in hits)
