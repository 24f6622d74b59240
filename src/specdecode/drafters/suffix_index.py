"""The structure behind suffix drafting (``suffix.py``): a bounded suffix index over token documents, and the
frequency-ranked continuation trees read from it.

``SuffixIndex`` is a hashed suffix index, not a suffix tree: documents of token ids and, for a few key lengths,
key n-gram -> the most recent positions it ended at. A lookup takes the longest key that hits, extends each hit
backwards to its full match length and keeps the hits of the longest match. Memory is bounded by ``max_tokens``
stored tokens (whole documents are evicted oldest first, with their index entries), and by ``MAX_OCCURRENCES``
per key. ``continuation_tree`` merges the continuations of a match's hits into a tree whose nodes carry the share
of hits that continue along their path.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..config import ConfigError

KEY_LENGTHS = (4, 2, 1)  # n-gram keys indexed, longest first
MAX_OCCURRENCES = 64  # most recent positions kept per key
MAX_MATCH = 32  # match lengths are counted up to this
DEFAULT_MAX_TOKENS = 1 << 18  # tokens the shared index holds before evicting old outputs (~ 30 MB)


class SuffixIndex:
    """Token documents and an n-gram -> positions index over them, bounded by ``max_tokens``.

    A document grows by ``append``; ``lookup`` returns the hits of the longest match of a pattern's
    suffix. When the stored tokens pass ``max_tokens`` the oldest documents go, index entries and all."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS, key_lengths: Sequence[int] = KEY_LENGTHS,
                 max_occurrences: int = MAX_OCCURRENCES) -> None:
        if max_tokens < 1 or not key_lengths or min(key_lengths) < 1 or max_occurrences < 1:
            raise ConfigError("the suffix index needs max_tokens >= 1, key lengths >= 1 and max_occurrences >= 1")
        self.max_tokens = max_tokens
        self.key_lengths = tuple(sorted(set(key_lengths), reverse=True))
        self.max_occurrences = max_occurrences
        self.docs: OrderedDict[int, list[int]] = OrderedDict()  # oldest first
        self.index: dict[tuple[int, ...], deque[tuple[int, int]]] = {}  # key -> (doc, end position)s, oldest first
        self.n_tokens = 0
        self._next_id = 0

    def new_doc(self) -> int:
        d = self._next_id
        self._next_id += 1
        self.docs[d] = []
        return d

    def __contains__(self, doc: int) -> bool:
        return doc in self.docs

    def append(self, doc: int, tokens: Sequence[int]) -> None:
        """Add tokens to the end of ``doc`` (ignored if it was evicted) and index the n-grams they end."""
        seq = self.docs.get(doc)
        if seq is None:
            return
        index, cap = self.index, self.max_occurrences
        for t in tokens:
            seq.append(int(t))
            n = len(seq)
            for k in self.key_lengths:
                if n >= k:
                    key = tuple(seq[n - k:])
                    occ = index.get(key)
                    if occ is None:
                        occ = index[key] = deque(maxlen=cap)  # the oldest position drops out by itself
                    occ.append((doc, n))
        self.n_tokens += len(tokens)
        while self.n_tokens > self.max_tokens and len(self.docs) > 1:
            self.evict_oldest()
        if self.n_tokens > self.max_tokens:  # one document alone is over the bound: drop it too
            self.evict_oldest()

    def evict_oldest(self) -> None:
        doc, seq = self.docs.popitem(last=False)
        self.n_tokens -= len(seq)
        for k in self.key_lengths:
            for n in range(k, len(seq) + 1):
                key = tuple(seq[n - k:n])
                occ = self.index.get(key)
                if occ is not None:
                    kept = [e for e in occ if e[0] != doc]
                    if kept:
                        self.index[key] = deque(kept, maxlen=self.max_occurrences)
                    else:
                        del self.index[key]

    def clear(self) -> None:
        self.docs.clear()
        self.index.clear()
        self.n_tokens = 0

    def lookup(self, pattern: Sequence[int], exclude: int | None = None, limit: int = 32
               ) -> tuple[int, list[tuple[int, int]]]:
        """(match length, [(doc, position after the match)]) of the longest suffix of ``pattern``
        found (most recent first, at most ``limit`` hits, only hits with a continuation); (0, [])
        when nothing matches. ``exclude``: a document to ignore (the row's own output)."""
        n = len(pattern)
        for k in self.key_lengths:
            if n < k:
                continue
            occ = self.index.get(tuple(pattern[n - k:]))
            if not occ:
                continue
            best, hits = longest_hits(pattern, k, ((d, e) for d, e in reversed(occ) if d != exclude), self.docs, limit)
            if hits:
                return best, hits
        return 0, []

    def continuation(self, doc: int, end: int, depth: int) -> list[int]:
        return self.docs[doc][end:end + depth]


def longest_hits(pattern: Sequence[int], k: int, occurrences: Iterable[tuple[int, int]],
                 docs: Mapping[int, Sequence[int]] | Sequence[Sequence[int]], limit: int
                 ) -> tuple[int, list[tuple[int, int]]]:
    """Of a key's occurrences (doc, end), most recent first, each matching ``pattern``'s last ``k`` tokens: the
    longest match found by extending backwards (up to ``MAX_MATCH``) and its hits (at most ``limit``), skipping
    those that end their document (nothing to continue with)."""
    n = len(pattern)
    best, hits = 0, []
    for doc, end in occurrences:
        seq = docs[doc]
        if end >= len(seq):
            continue
        m = k
        while m < MAX_MATCH and m < end and m < n and seq[end - 1 - m] == pattern[n - 1 - m]:
            m += 1
        if m > best:
            best, hits = m, [(doc, end)]
        elif m == best and len(hits) < limit:
            hits.append((doc, end))
    return best, hits


# -- the tree ------------------------------------------------------------------------------------
@dataclass
class SuffixTree:
    """A proposal: nodes best-first (parents before children) with their frequencies."""

    tokens: list[int]
    parents: list[int]
    freqs: list[float]
    match_len: int
    stored: bool = False  # the match is in the datastore (``suffix_store``), calibrated apart

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def depths(self) -> list[int]:
        """Each node's depth (1: a child of the pending token)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out


def continuation_tree(continuations: Sequence[Sequence[int]], max_nodes: int, min_prob: float, match_len: int
                      ) -> SuffixTree:
    """The ``max_nodes`` most frequent nodes of the trie of ``continuations`` (frequency = share of
    continuations through the node; below ``min_prob`` dropped), most frequent chain first."""
    total = len(continuations)
    root: dict[int, list] = {}  # token -> [count, children]
    for cont in continuations:
        node = root
        for t in cont:
            e = node.get(t)
            if e is None:
                e = node[t] = [0, {}]
            e[0] += 1
            node = e[1]
    tie = itertools.count()
    heap = [(-e[0], 1, next(tie), t, e, -1) for t, e in root.items()]
    heapq.heapify(heap)
    chosen: list[tuple[int, int, int]] = []  # (token, parent index, count), best-first
    floor = min_prob * total
    while heap and len(chosen) < max_nodes:
        neg, depth, _, t, e, parent = heapq.heappop(heap)
        if -neg < floor:
            break
        i = len(chosen)
        chosen.append((t, parent, -neg))
        for t2, e2 in e[1].items():
            heapq.heappush(heap, (-e2[0], depth + 1, next(tie), t2, e2, i))
    # the most frequent chain first: the path most often accepted is then a prefix of the pass
    kids: dict[int, list[int]] = {}
    for i, (_, parent, _) in enumerate(chosen):
        kids.setdefault(parent, []).append(i)
    chain: list[int] = []
    node_i = -1
    while node_i in kids:
        node_i = max(kids[node_i], key=lambda k: (chosen[k][2], -k))
        chain.append(node_i)
    on_chain = set(chain)
    order = chain + [i for i in range(len(chosen)) if i not in on_chain]
    where = {old: new for new, old in enumerate(order)}
    return SuffixTree([chosen[i][0] for i in order], [where[chosen[i][1]] if chosen[i][1] >= 0 else -1 for i in order],
                      [chosen[i][2] / total for i in order], match_len)


def top_chain(conts: Sequence[Sequence[int]], cap: int, min_prob: float, match_len: int) -> SuffixTree:
    """Chain mode: the most frequent path only."""
    tree = continuation_tree(conts, cap * 8, min_prob, match_len)
    n = 0
    while n < len(tree.parents) and tree.parents[n] == n - 1 and n < cap:
        n += 1
    return SuffixTree(tree.tokens[:n], tree.parents[:n], tree.freqs[:n], match_len)
