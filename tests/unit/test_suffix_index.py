"""The suffix structure behind suffix drafting: longest match, frequency ranking, bounded memory, sharing."""

from __future__ import annotations

import pytest

from specdecode.config import SamplingConfig
from specdecode.sizing.costs import Costs
from specdecode.draft import DraftContext
from specdecode.drafters.suffix import SuffixDrafter
from specdecode.drafters.suffix_index import SuffixIndex, continuation_tree

FREE = Costs(c=0.0, v=(1.0,) * 64)  # every node free: the tree shape is decided by frequency alone


def test_lookup_finds_the_longest_match_and_its_continuation() -> None:
    idx = SuffixIndex()
    d = idx.new_doc()
    idx.append(d, [1, 2, 3, 4, 9, 2, 3, 5, 7, 3, 4, 8])
    m, hits = idx.lookup([0, 2, 3, 4])  # "2 3 4" occurs once (then 9); "3 4" twice
    assert m == 3 and hits == [(d, 4)]
    assert idx.continuation(d, 4, 3) == [9, 2, 3]
    m, hits = idx.lookup([6, 6, 3])  # only the last token matches: every "3" with a continuation, latest first
    assert m == 1 and [e for _, e in hits] == [10, 7, 3]
    assert idx.lookup([42]) == (0, [])


def test_lookup_excludes_a_document_and_skips_ends_without_continuation() -> None:
    idx = SuffixIndex()
    a, b = idx.new_doc(), idx.new_doc()
    idx.append(a, [5, 6, 7])
    idx.append(b, [5, 6])  # ends at "5 6": no continuation inside b
    m, hits = idx.lookup([5, 6])
    assert m == 2 and hits == [(a, 2)]
    assert idx.lookup([5, 6], exclude=a) == (0, [])


def test_tree_ranks_continuations_by_frequency() -> None:
    conts = [[1, 2, 3], [1, 2, 4], [1, 2, 3], [7, 8], [1, 5]]
    t = continuation_tree(conts, max_nodes=10, min_prob=0.0, match_len=2)
    # the most frequent chain first: 1 (4/5), 1-2 (3/5), 1-2-3 (2/5); then the rest best-first
    assert t.tokens[:3] == [1, 2, 3] and t.parents[:3] == [-1, 0, 1]
    assert t.freqs[:3] == [0.8, 0.6, 0.4]
    assert sorted(t.freqs[3:], reverse=True) == t.freqs[3:]
    for i, p in enumerate(t.parents):
        assert p < i  # parents before children
    siblings = {}
    for tok, p in zip(t.tokens, t.parents):
        siblings.setdefault(p, []).append(tok)
    assert all(len(s) == len(set(s)) for s in siblings.values())  # distinct deterministic candidates
    small = continuation_tree(conts, max_nodes=2, min_prob=0.0, match_len=2)
    assert small.tokens == [1, 2]
    assert continuation_tree(conts, max_nodes=10, min_prob=0.5, match_len=2).tokens == [1, 2]


def test_memory_bound_evicts_oldest_documents_with_their_entries() -> None:
    idx = SuffixIndex(max_tokens=10)
    first = idx.new_doc()
    idx.append(first, [1, 2, 3, 4, 5, 6])
    second = idx.new_doc()
    idx.append(second, [7, 8, 9, 10, 11, 12])
    assert first not in idx and second in idx and idx.n_tokens == 6
    assert idx.lookup([1, 2]) == (0, [])  # the evicted document's n-grams are gone
    assert all(e[0] == second for occ in idx.index.values() for e in occ)
    assert sum(len(occ) for occ in idx.index.values()) <= 3 * idx.n_tokens
    idx.append(first, [1, 2, 3])  # appending to an evicted document is ignored
    assert idx.n_tokens == 6


def test_occurrences_per_key_are_bounded() -> None:
    idx = SuffixIndex(max_occurrences=4)
    d = idx.new_doc()
    idx.append(d, [1, 2] * 50)
    assert max(len(occ) for occ in idx.index.values()) <= 4


def _ctx(tokens: list[int], k: int = 8) -> DraftContext:
    return DraftContext(tokens, k, SamplingConfig(), None)


def test_drafter_shares_outputs_across_rows_but_not_prompts() -> None:
    d = SuffixDrafter(costs=FREE)
    prompt_a = [100, 101, 102]
    d.propose_rows({0: _ctx(prompt_a)})
    out = [10, 11, 12, 13, 14, 15]
    d.propose_rows({0: _ctx(prompt_a + out)})  # row 0's output so far is indexed in the shared structure
    # another row (another request) that just wrote "10 11" gets row 0's continuation
    got = d.propose_rows({1: _ctx([7, 10, 11], k=4)})[1]
    assert got.tokens[:4] == [12, 13, 14, 15]
    # a prompt alone is not shared: "101" is only in row 0's prompt
    assert d.propose_rows({2: _ctx([9, 101], k=4)})[2].tokens == []
    # the finished row's output stays after its row is reset
    d.reset_row(0)
    assert d.propose_rows({3: _ctx([5, 12, 13], k=2)})[3].tokens == [14, 15]


def test_drafter_matches_its_own_sequence_and_proposes_a_tree() -> None:
    d = SuffixDrafter(costs=FREE, min_prob=0.0)
    seq = [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2]
    got = d.propose_rows({0: _ctx(seq, k=6)})[0]
    # "1 2" occurs three times before the end: continued by 3 (twice) and 4 (once)
    assert got.tokens[0] == 3 and got.parents is not None
    roots = [t for t, p in zip(got.tokens, got.parents) if p == -1]
    assert roots == [3, 4]


def test_drafter_calibration_learns_from_rejections() -> None:
    d = SuffixDrafter(costs=Costs(c=0.0, v=tuple(1.0 + 0.3 * k for k in range(64))))
    before = d.conf(3)
    seq = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    for _ in range(20):
        draft = d.propose_rows({0: _ctx(seq)})[0]
        if not draft.tokens:
            break
        d.on_verified_row(0, 0)
    assert d.conf(3) < before
    assert d.propose_rows({0: _ctx(seq)})[0].tokens == []  # no longer pays: plain decoding


def test_drafter_index_is_per_model(tiny_dirs) -> None:  # type: ignore[no-untyped-def]
    import specdecode as sd

    llama, qwen = sd.load_model(tiny_dirs["llama"]), sd.load_model(tiny_dirs["qwen2"])
    d = SuffixDrafter(costs=FREE)
    sd.generate(llama, "def f(x):\n", drafter=d, max_new_tokens=8, ignore_eos=True)
    first = d.shared.n_tokens
    sd.generate(sd.load_model(tiny_dirs["llama"]), "def g(x):\n", drafter=d, max_new_tokens=8, ignore_eos=True)
    assert first > 0 and d.shared.n_tokens > first and len(d.shared.docs) == 2  # same checkpoint: history stays
    sd.generate(qwen, "def f(x):\n", drafter=d, max_new_tokens=8, ignore_eos=True)
    assert len(d.shared.docs) == 1  # another model: its token ids mean other text, so the history restarts


def test_accepted_chain_tokens_are_indexed_at_verification() -> None:
    d = SuffixDrafter(costs=FREE)
    prompt = [1, 2, 3, 4, 1, 2]
    draft = d.propose_rows({0: _ctx(prompt, k=2)})[0]
    assert draft.tokens == [3, 4] and draft.parents is None
    d.on_verified_row(0, 2)  # both accepted: known now, before the next context shows them
    assert d.shared.docs[d._rows[0].out_doc] == [3, 4]
    d.propose_rows({0: _ctx(prompt + [3, 4, 9], k=2)})  # the bonus token arrives with the next context
    assert d.shared.docs[d._rows[0].out_doc] == [3, 4, 9]


def test_one_rejected_long_chain_counts_as_one_examined_depth() -> None:
    """q is the chance a verified depth is accepted: a 15-node chain rejected at its first node is one failed
    depth, not 15 (counting predicted nodes read a long-match bucket at 0.2 after one miss, so it stopped
    drafting through a verbatim copy), and the bucket keeps drafting long chains."""
    from specdecode.drafters.suffix import CONF_PRIOR, CONF_WEIGHT, _bucket

    d = SuffixDrafter(costs=Costs(c=0.0, v=tuple(1.0 + 0.1 * k for k in range(64))))
    body = list(range(100, 120))
    seq = body + [7] + body[:18]  # an 18-token match: the copy goes on with body[18:]
    b = _bucket(18)
    before = d.conf(18)
    assert before == pytest.approx(CONF_PRIOR[b])
    first = d.propose_rows({0: _ctx(seq, k=15)})[0]
    assert len(first.tokens) >= 2 and first.tokens[:2] == body[18:20]
    d.on_verified_row(0, 0)
    assert d.conf(18) == pytest.approx(CONF_PRIOR[b] * CONF_WEIGHT / (CONF_WEIGHT + 1.0))
    assert len(d.propose_rows({0: _ctx(seq, k=15)})[0].tokens) >= 2  # still drafts
    d.on_verified_row(0, 2)  # two accepted, the third depth rejected: 2 of 3 examined depths
    assert d.conf(18) == pytest.approx((CONF_PRIOR[b] * CONF_WEIGHT + 2.0) / (CONF_WEIGHT + 4.0))
