"""The seed's card on the web page, in headless Chromium: one row per target pass (accepted prefix, first
rejected proposal struck through, the target's token) and a per-position acceptance bar chart, checked
against the same greedy request's SSE events."""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import httpx
import pytest

from specdecode.server.config import ServerConfig

from server_helpers import MODEL_NAME, Models, RunningServer, serve
from test_server_page import ARGS, CHROMIUM

pytestmark = pytest.mark.slow  # full tier: make test-full

PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def mixed_server(models: Models) -> Iterator[RunningServer]:
    """A different random draft with the full γ every step: most proposals are rejected."""
    yield from serve(models, models.draft, ServerConfig(max_batch_size=2, speculation="always"), gamma=4)


def _events(server: RunningServer, max_tokens: int) -> list[dict[str, Any]]:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "drafter": "model", "gamma": 4}
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
        rows.append({"accepted": sd["pieces"][:n], "rejected": sd["rejected"],
                     "own": sd["pieces"][n] if len(sd["pieces"]) > n else None})
    return rows


def _page_card(server: RunningServer, max_tokens: int) -> dict[str, Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.wait_for_function("document.getElementById('model').textContent.includes('tiny-llama')")
            page.fill("#prompt", PROMPT)
            page.select_option("#drafter", "model")
            page.fill("#gamma", "4")
            page.fill("#temperature", "0")
            page.fill("#max_tokens", str(max_tokens))
            page.click("#generate")
            page.wait_for_function("document.getElementById('status').textContent.startsWith('done')", timeout=30000)
            return page.evaluate("""() => {
                const text = (el) => el ? el.textContent : null;
                const rows = [...document.querySelectorAll('#passes .pass-row')].map((row) => ({
                    accepted: [...row.querySelectorAll('.pass-acc')].map((e) => e.textContent),
                    rejected: text(row.querySelector('.pass-rej')),
                    fix: text(row.querySelector('.pass-fix')),
                    bonus: text(row.querySelector('.pass-bonus')),
                    struck: row.querySelector('.pass-rej') ?
                        getComputedStyle(row.querySelector('.pass-rej')).textDecorationLine : null,
                }));
                const bars = [...document.querySelectorAll('#bars .bar')].map((b) => ({
                    rate: parseFloat(b.dataset.rate), height: b.getBoundingClientRect().height}));
                const chart = document.getElementById('bars').getBoundingClientRect().height;
                return {rows, bars, chart};
            }""")
        finally:
            browser.close()


def _visible(text: str) -> str:
    return text.replace("\n", "⏎").replace("\t", "⇥")


def _check_card(card: dict[str, Any], events: list[dict[str, Any]]) -> None:
    expected = _expected_rows(events)
    assert len(card["rows"]) == len(expected) > 0
    for got, want in zip(card["rows"], expected):
        assert got["accepted"] == [_visible(p) for p in want["accepted"]]
        if want["rejected"] is not None:
            assert got["rejected"] == _visible(want["rejected"]) and got["struck"] == "line-through"
            assert got["fix"] == (None if want["own"] is None else _visible(want["own"]))
        else:
            assert got["rejected"] is None and got["bonus"] == (None if want["own"] is None else _visible(want["own"]))
    drafted = max(sd["drafted"] for sd in events)
    pos = [[0, 0] for _ in range(drafted)]
    for sd in events:
        for i in range(sd["drafted"]):
            pos[i][0] += 1
            pos[i][1] += int(i < sum(sd["from_draft"]))
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
