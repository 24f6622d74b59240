"""The web page in headless Chromium: type a prompt, click, watch coloured tokens stream in."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

import specdecode

from server_helpers import Models, RunningServer

pytestmark = pytest.mark.slow  # full tier: make test-full

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def open_browser() -> Iterator[Any]:
    """A headless Chromium for a module's page tests (skipped where Chromium or playwright is missing)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Any, server: RunningServer) -> Any:
    """The page, loaded and past its /health call (model named, drafters listed)."""
    page = browser.new_page()
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent.includes('tiny-llama')")
    return page


def test_index_is_served(server: RunningServer) -> None:
    r = server.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "tok-draft" in r.text and "/v1/completions" in r.text


def test_page_streams_coloured_tokens(server: RunningServer, models: Models, tmp_path: Path) -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright)")
    prompt = "def fib(n):"
    ref = specdecode.generate(models.target, prompt, max_new_tokens=40)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.wait_for_function("document.getElementById('model').textContent.includes('tiny-llama')")
            page.fill("#prompt", prompt)
            page.select_option("#drafter", "model")
            page.fill("#gamma", "4")
            page.fill("#temperature", "0")
            page.fill("#max_tokens", "40")
            page.click("#generate")
            page.wait_for_function("document.getElementById('status').textContent.startsWith('done')", timeout=30000)
            page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
            drafted = page.locator("#output span.tok-draft").all_text_contents()
            target = page.locator("#output span.tok-target").all_text_contents()
            generated = page.eval_on_selector_all("#output span.tok-draft, #output span.tok-target",
                                                  "els => els.map(e => e.textContent).join('')")
            tps = page.text_content("#tps") or ""
            alpha = page.text_content("#alpha") or ""
            tau = page.text_content("#tau") or ""
        finally:
            browser.close()
    assert (tmp_path / "page.png").stat().st_size > 0
    assert generated == ref.text  # streamed pieces, in order, are exactly the generated text
    assert drafted and target  # self-speculation: both origins appear, each with its own class
    assert float(tps) > 0 and float(alpha) == 1.0 and float(tau) > 1.0
