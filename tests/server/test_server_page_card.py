"""The seed's card on the web page, in headless Chromium: one row per target pass (accepted prefix, first
rejected proposal struck through, the target's token, a bonus only when every proposal was accepted) and a
per-position acceptance bar chart, checked against the same greedy request's SSE events. Tree drafts (Medusa,
EAGLE) are read along the verified path: the accepted nodes, the first rejected candidate where the path
stops, a bonus only at a leaf, and bars that count only the path's positions (issue 30 item 6)."""

from __future__ import annotations

import json
import os
from typing import Any, Iterator, Optional

import httpx
import pytest

from specdecode.server.app import make_state
from specdecode.server.config import ServerConfig

from eagle_util import make_eagle
from medusa_util import make_heads
from pricing import FREE
from server_helpers import MODEL_NAME, Models, RunningServer, serve, start_server
from test_server_page import ARGS, CHROMIUM

pytestmark = pytest.mark.slow  # full tier: make test-full

PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def mixed_server(models: Models) -> Iterator[RunningServer]:
    """A different random draft with the full γ every step: most proposals are rejected."""
    yield from serve(models, models.draft, ServerConfig(max_batch_size=2, speculation="always"), gamma=4)


@pytest.fixture(scope="module")
def tree_server(models: Models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Random Medusa heads and a random EAGLE-3 draft near the target (some nodes accepted, most not), with free
    tree nodes (flat costs) so every pass verifies a tree of several nodes and depths."""
    root = tmp_path_factory.mktemp("card-trees")
    heads = make_heads(root / "heads", models.target.config.dim, models.target.vocab_size)
    eagle_dir = make_eagle(root / "eagle", models.target)
    state = make_state(models.target, None, ServerConfig(max_batch_size=2, request_timeout=60, speculation="always"),
                       default_drafter="medusa", default_gamma=6, model_name=MODEL_NAME,
                       artifacts={"medusa": str(heads), "eagle": str(eagle_dir)}, pricer=FREE)
    running = start_server(state)
    try:
        yield running
    finally:
        running.stop()


def _events(server: RunningServer, max_tokens: int, drafter: str = "model", gamma: int = 4,
            prompt: str = PROMPT) -> list[dict[str, Any]]:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "drafter": drafter, "gamma": gamma}
    out = []
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                sd = json.loads(line[6:]).get("specdecode", {})
                if sd.get("drafted"):
                    out.append(sd)
    return out


def _expected_rows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for sd in events:
        n = sum(sd["from_draft"])
        rows.append({"accepted": sd["pieces"][:n], "rejected": sd["rejected"], "bonus": sd["bonus"],
                     "also": len(sd.get("rejected_also", [])),
                     "own": sd["pieces"][n] if len(sd["pieces"]) > n else None})
    return rows


READ_CARD = """() => {
    const text = (el) => el ? el.textContent : null;
    const rows = [...document.querySelectorAll('#passes .pass-row')].map((row) => ({
        accepted: [...row.querySelectorAll('.pass-acc')].map((e) => e.textContent),
        rejected: text(row.querySelector('.pass-rej')),
        fix: text(row.querySelector('.pass-fix')),
        bonus: text(row.querySelector('.pass-bonus')),
        also: text(row.querySelector('.pass-alt')),
        tree: row.dataset.tree, title: row.title,
        struck: row.querySelector('.pass-rej') ?
            getComputedStyle(row.querySelector('.pass-rej')).textDecorationLine : null,
    }));
    const bars = [...document.querySelectorAll('#bars .bar')].map((b) => ({
        rate: parseFloat(b.dataset.rate), height: b.getBoundingClientRect().height}));
    const chart = document.getElementById('bars').getBoundingClientRect().height;
    return {rows, bars, chart};
}"""

# the page's own chunk handler fed the given stream chunks, as its reader would
FEED = """(chunks) => {
    const st = freshRun();
    for (const c of chunks) handleChunk(c, st, $("output"));
}"""


# the stream chunks the page itself read (its handler wrapped): a tree drafter sizes its trees from its own
# history, so a second request would not draft the same passes
RECORD = """() => {
    window.__chunks = [];
    const handle = handleChunk;
    window.handleChunk = (c, st, out) => { window.__chunks.push(c); handle(c, st, out); };
}"""


def _browser() -> Any:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright)")
    return sync_playwright()


def _page_card(server: RunningServer, max_tokens: int, drafter: str = "model", gamma: int = 4,
               prompt: str = PROMPT, feed: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    """The card after the page generated from ``prompt`` (or, with ``feed``, after its chunk handler read
    those chunks)."""
    with _browser() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.wait_for_function("document.getElementById('model').textContent.includes('tiny-llama')")
            if feed is not None:
                page.evaluate(FEED, feed)
                return page.evaluate(READ_CARD)
            page.fill("#prompt", prompt)
            page.select_option("#drafter", drafter)
            page.fill("#gamma", str(gamma))
            page.fill("#temperature", "0")
            page.fill("#max_tokens", str(max_tokens))
            page.evaluate(RECORD)
            page.click("#generate")
            page.wait_for_function("document.getElementById('status').textContent.startsWith('done')", timeout=30000)
            return {**page.evaluate(READ_CARD), "chunks": page.evaluate("() => window.__chunks")}
        finally:
            browser.close()


def _visible(text: str) -> str:
    return text.replace("\n", "⏎").replace("\t", "⇥")


def _check_card(card: dict[str, Any], events: list[dict[str, Any]]) -> None:
    expected = _expected_rows(events)
    assert len(card["rows"]) == len(expected) > 0
    for got, want in zip(card["rows"], expected):
        assert got["accepted"] == [_visible(p) for p in want["accepted"]]
        own = None if want["own"] is None else _visible(want["own"])
        if want["rejected"] is not None:
            assert got["rejected"] == _visible(want["rejected"]) and got["struck"] == "line-through"
            assert got["fix"] == own and got["bonus"] is None
            assert got["also"] == (f"+{want['also']}" if want["also"] else None)
        elif want["bonus"]:  # every proposal accepted: the target's token is a bonus
            assert got["rejected"] is None and got["bonus"] == own and got["fix"] is None
        else:  # cut short (EOS / stop) inside the draft: nothing of the target's own
            assert got["rejected"] is None and got["bonus"] is None and got["fix"] == own
    n = max(len(sd["verified"]) for sd in events)
    pos = [[0, 0] for _ in range(n)]
    for sd in events:  # each position of the pass's verified path
        for i, ok in enumerate(sd["verified"]):
            pos[i][0] += 1
            pos[i][1] += int(ok)
    assert [round(b["rate"], 4) for b in card["bars"]] == [round(a / d, 4) for d, a in pos]
    for b in card["bars"]:  # bar heights follow the rates
        assert abs(b["height"] - b["rate"] * card["chart"]) <= 2 + 0.02 * card["chart"]


def test_card_shows_rejections_struck_through(mixed_server: RunningServer) -> None:
    events = _events(mixed_server, 24)
    assert any(sd["rejected"] is not None for sd in events)  # a random draft: the target rejects proposals
    card = _page_card(mixed_server, 24)
    _check_card(card, events)
    assert any(r["struck"] == "line-through" for r in card["rows"])


def test_card_under_self_speculation_accepts_every_proposal(server: RunningServer) -> None:
    events = _events(server, 24)
    assert events and all(sd["rejected"] is None for sd in events)
    card = _page_card(server, 24)
    _check_card(card, events)
    assert all(r["rejected"] is None for r in card["rows"]) and all(b["rate"] == 1.0 for b in card["bars"])


def _check_tree_events(events: list[dict[str, Any]]) -> None:
    """The stream's card fields for tree passes, read along the verified path."""
    trees = [sd for sd in events if sd["tree"]]
    assert len(trees) >= len(events) - 2  # a draft of one node (room for one token at the end) is a chain
    for sd in trees:
        n = sum(sd["from_draft"])
        own = len(sd["token_ids"]) == n + 1
        rejected = sd["rejected"] is not None
        assert not (rejected and sd["bonus"])  # a bonus only when nothing on the path was rejected
        assert sd["bonus"] or rejected or not own  # the target's token follows a rejection or is a bonus
        assert sd["verified"] == [True] * n + ([False] if rejected else [])  # only the path's positions
        assert len(sd["verified"]) <= sd["drafted"]
    assert any(len(sd["verified"]) < sd["drafted"] for sd in trees)  # nodes off the path: counted nowhere


@pytest.mark.parametrize("drafter", ["medusa", "eagle"])
def test_card_reads_tree_passes_along_the_verified_path(drafter: str, tree_server: RunningServer) -> None:
    card = _page_card(tree_server, 32, drafter, gamma=6)
    events = [c["specdecode"] for c in card["chunks"] if c.get("specdecode", {}).get("drafted")]
    _check_tree_events(events)
    assert any(sd["rejected"] is not None for sd in events)  # random heads: the target disagrees somewhere
    _check_card(card, events)
    for r, sd in zip(card["rows"], events):
        assert r["tree"] == str(sd["tree"]).lower() and r["title"].startswith("tree of ") == sd["tree"]
    # no row with a rejection also shows a bonus; a bonus row is one whose whole path was accepted
    for r, sd in zip(card["rows"], events):
        assert (r["bonus"] is not None) == bool(sd["bonus"] and len(sd["pieces"]) > sum(sd["from_draft"]))


def _synthetic_tree_chunks() -> list[dict[str, Any]]:
    """Tree passes of every kind, as the server streams them (card fields from ``server/card.py``): the
    tree of test_server_card_fields (6 nodes, depth 3), read at a leaf, mid-path, at the root, cut by EOS."""
    from specdecode.rows import StepEvent
    from specdecode.server.card import card_fields

    from test_server_card_fields import PARENTS, TOKENS

    def chunk(path: list[int], own: Optional[int]) -> dict[str, Any]:
        ids = [TOKENS[k] for k in path] + ([] if own is None else [own])
        flags = [True] * len(path) + ([] if own is None else [False])
        ev = StepEvent(ids, flags, [f"t{t}" for t in ids], drafted=len(TOKENS), proposed=list(TOKENS),
                       parents=list(PARENTS), path=list(path))
        sd = {"pieces": ev.pieces, "from_draft": flags, "token_ids": ids, "drafted": ev.drafted,
              **card_fields(ev, lambda t: f"t{t}")}
        return {"choices": [{"index": 0, "text": ev.text, "finish_reason": None}], "specdecode": sd}

    return [chunk([0, 2, 4], 99), chunk([0, 2], 98), chunk([0], 97), chunk([], 96), chunk([1, 5], 95),
            chunk([1], 94), chunk([0, 2], None)]


def test_card_draws_every_kind_of_tree_pass(server: RunningServer) -> None:
    """The page's drawing of tree passes, deterministic: bonus only at a leaf, the rejected candidate (with
    its rejected siblings counted) where the path stops, bars over the path's positions only."""
    chunks = _synthetic_tree_chunks()
    events = [c["specdecode"] for c in chunks]
    card = _page_card(server, 0, feed=chunks)
    _check_card(card, events)
    rows = card["rows"]
    assert [r["bonus"] for r in rows] == ["t99", None, None, None, "t95", None, None]
    assert [r["rejected"] for r in rows] == [None, "t14", "t12", "t10", None, "t15", None]
    assert [r["fix"] for r in rows] == [None, "t98", "t97", "t96", None, "t94", None]
    assert [r["also"] for r in rows] == [None, None, "+1", "+1", None, None, None]
    tail = "off the path (never reached)"
    assert rows[0]["title"] == f"tree of 6 nodes: 3 accepted along the path, 0 rejected where it stops, 3 {tail}"
    assert rows[2]["title"] == f"tree of 6 nodes: 1 accepted along the path, 2 rejected where it stops, 3 {tail}"
    # position 1: all 7 passes reached it, 6 accepted (all but the rejection at the root); position 2: the 6
    # others reached it, 4 accepted; position 3: reached by the leaf 0-2-4 and the rejection of 4 after 0-2
    assert [b["rate"] for b in card["bars"]] == [round(6 / 7, 4), round(4 / 6, 4), 0.5]
