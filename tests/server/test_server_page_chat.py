"""The web page's chat mode in headless Chromium: the conversation goes to /v1/chat/completions (the server
applies the model's chat template), each turn resends the history, and a server that says its model has a
chat template gets chat mode first (issue 49 item 5)."""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest

from server_helpers import MODEL_NAME, RunningServer
from test_server_page import open_browser, open_page

pytestmark = pytest.mark.slow  # full tier: make test-full

DONE = "document.getElementById('status').textContent.startsWith('done')"
REPLY = "() => [...document.querySelectorAll('#output .tok-draft, #output .tok-target')].map(e => e.textContent)" \
        ".join('')"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from open_browser()


def _api_reply(server: RunningServer, messages: list[dict[str, str]]) -> str:
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 12, "temperature": 0, "drafter": "model"}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def _send(page: Any, text: str) -> dict[str, Any]:
    """Type a message, send it, wait for the answer; the request body the page sent."""
    page.fill("#prompt", text)
    with page.expect_request("**/v1/chat/completions") as sent:
        page.click("#generate")
    page.wait_for_function(DONE, timeout=30000)
    body: dict[str, Any] = sent.value.post_data_json
    return body


def test_chat_mode_answers_from_chat_completions(server: RunningServer, browser: Any) -> None:
    page = open_page(browser, server)
    assert page.input_value("#mode") == "completion"  # /health: the tiny model has no chat template
    assert page.is_hidden("#new-chat") and page.is_hidden("#system-box")
    page.select_option("#mode", "chat")
    assert page.is_visible("#new-chat") and page.is_visible("#system-box")
    page.select_option("#drafter", "model")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "12")

    first = _send(page, "Say hi")
    assert first["messages"] == [{"role": "user", "content": "Say hi"}]
    assert "prompt" not in first and "gamma" not in first and first["stream"] is True
    reply = page.evaluate(REPLY)
    assert reply == _api_reply(server, first["messages"])  # the page streamed the chat endpoint's answer
    assert page.text_content("#output").startswith("You: Say hi\nModel: ")
    assert page.input_value("#prompt") == ""  # sent: the box is free for the next message
    assert float(page.text_content("#alpha")) == 1.0  # self-speculation: the card works for chat too

    second = _send(page, "And again")  # the history goes with it: the server keeps none
    assert second["messages"] == [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": reply},
                                  {"role": "user", "content": "And again"}]
    assert page.evaluate(REPLY) == _api_reply(server, second["messages"])
    assert page.text_content("#output").startswith(f"You: Say hi\nModel: {reply}\nYou: And again\nModel: ")

    page.click("#new-chat")
    assert page.text_content("#output") == "" and page.text_content("#passes") == ""
    page.fill("#system", "Be brief.")
    third = _send(page, "Hello")
    assert third["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    page.close()


def test_failed_chat_turn_is_not_kept(server: RunningServer, browser: Any) -> None:
    """A turn the server refused stays in the box to retry and is not sent again as history."""
    page = open_page(browser, server)
    page.select_option("#mode", "chat")
    page.fill("#max_tokens", "1000000")  # more than the context window: a 400 naming max_tokens
    page.fill("#prompt", "Too long")
    page.click("#generate")
    page.wait_for_selector("#status.error", timeout=30000)
    assert "max_tokens" in page.text_content("#status")
    assert page.input_value("#prompt") == "Too long"
    page.fill("#max_tokens", "4")
    body = _send(page, "Short")
    assert body["messages"] == [{"role": "user", "content": "Short"}]
    page.close()


@pytest.mark.parametrize("has_template", [True, False])
def test_chat_template_field_picks_the_mode(server: RunningServer, browser: Any, has_template: bool) -> None:
    """A server whose /health says ``chat_template`` (true: the model has its own) opens in chat mode."""
    page = browser.new_page()

    def health(route: Any) -> None:
        body = route.fetch().json()
        route.fulfill(status=200, content_type="application/json",
                      body=json.dumps({**body, "chat_template": has_template}))

    page.route("**/health", health)
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model').textContent.includes('tiny-llama')")
    assert page.input_value("#mode") == ("chat" if has_template else "completion")
    assert page.is_visible("#new-chat") == has_template
    options = page.eval_on_selector_all("#mode option", "els => els.map(e => e.textContent)")
    assert len(options) == 2 and ("no template" in options[1]) == (not has_template)
    page.close()
