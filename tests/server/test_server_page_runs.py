"""A run on the web page, in headless Chromium: a blank γ leaves the field out (the server's adaptive default,
as for any API client), an error leaves no figures behind, passes without a draft are noted so the numbering
never skips, and the bar chart's labels keep clear of its heading and of each other (issue 49 item 5)."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import httpx
import pytest

from server_helpers import MODEL_NAME, RunningServer
from test_server_page import open_browser, open_page

pytestmark = pytest.mark.slow  # full tier: make test-full

DONE = "document.getElementById('status').textContent.startsWith('done')"

FIGURES = """() => ({
    tps: $('tps').textContent, alpha: $('alpha').textContent, tau: $('tau').textContent,
    ntok: $('ntok').textContent, rows: $('passes').childElementCount, summary: $('pass-summary').textContent,
    bars: $('bars').childElementCount, labels: $('bar-labels').childElementCount,
    status: $('status').textContent, error: $('status').className === 'error',
})"""

NUMBERS = "() => [...document.querySelectorAll('#passes > div')].map((r) => r.querySelector('.pass-n').textContent)"

FEED = """(chunks) => {
    const st = freshRun();
    for (const c of chunks) handleChunk(c, st, $("output"));
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from open_browser()


def _run(page: Any, max_tokens: int, gamma: str = "", drafter: str = "model") -> dict[str, Any]:
    """Generate from the page's settings; the body it sent to /v1/completions."""
    page.select_option("#drafter", drafter)
    page.fill("#gamma", gamma)
    page.fill("#temperature", "0")
    page.fill("#max_tokens", str(max_tokens))
    with page.expect_request("**/v1/completions") as sent:
        page.click("#generate")
    page.wait_for_function(DONE, timeout=30000)
    body: dict[str, Any] = sent.value.post_data_json
    return body


def _pass_numbers(labels: list[str]) -> list[int]:
    """'#3' -> [3]; '#4–7' (a note for plain steps) -> [4, 5, 6, 7]."""
    out: list[int] = []
    for label in labels:
        m = re.fullmatch(r"#(\d+)(?:–(\d+))?", label)
        assert m, label
        lo, hi = int(m[1]), int(m[2] or m[1])
        out.extend(range(lo, hi + 1))
    return out


def _shown(figures: dict[str, Any]) -> bool:
    return figures["tps"] != "–" and figures["ntok"] != "0" and figures["rows"] > 0 and figures["bars"] > 0


def _cleared(figures: dict[str, Any]) -> bool:
    return (figures["tps"], figures["alpha"], figures["tau"], figures["ntok"]) == ("–", "–", "–", "0") and \
        figures["rows"] == figures["bars"] == figures["labels"] == 0 and figures["summary"] == ""


def test_blank_gamma_sends_no_gamma_field(server: RunningServer, browser: Any) -> None:
    page = open_page(browser, server)
    assert page.input_value("#gamma") == ""  # blank by default: the server's own choice
    assert "gamma" not in _run(page, 8)
    assert _run(page, 8, gamma="6")["gamma"] == 6  # a number fixes γ for the request
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "POST" else None)
    for bad in ("40", "0", "2.5"):
        page.fill("#gamma", bad)
        page.click("#generate")
        page.wait_for_selector("#status.error")
        status = page.text_content("#status")
        assert status.startswith("γ:") and "1 to 32" in status and "blank" in status
        assert _cleared(page.evaluate(FIGURES))
    assert sent == []  # refused on the page: nothing reached the server
    page.close()


def test_an_error_clears_the_previous_figures(server: RunningServer, browser: Any) -> None:
    page = open_page(browser, server)
    _run(page, 24, gamma="4")
    assert _shown(page.evaluate(FIGURES))
    page.fill("#max_tokens", "1000000")  # more than the context window: the server answers 400
    page.click("#generate")
    page.wait_for_selector("#status.error", timeout=30000)
    after = page.evaluate(FIGURES)
    assert after["status"].startswith("400: ") and "max_tokens" in after["status"]
    assert _cleared(after)
    page.close()


def test_an_error_mid_stream_clears_the_run_figures(server: RunningServer, browser: Any) -> None:
    """The stream of a real run cut by an error event (as a timeout sends): the status says so, no figures."""
    body = {"model": MODEL_NAME, "prompt": "def fib(n):", "max_tokens": 24, "temperature": 0, "stream": True,
            "drafter": "model", "gamma": 4}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    error = {"error": {"message": "request timed out after 1 s", "type": "timeout_error", "param": None,
                       "code": "request_timeout"}}
    stream = "".join(f"{line}\n\n" for line in lines[:2]) + f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n"
    page = open_page(browser, server)
    _run(page, 24, gamma="4")
    page.route("**/v1/completions", lambda route: route.fulfill(status=200, content_type="text/event-stream",
                                                                  body=stream))
    page.click("#generate")
    page.wait_for_selector("#status.error", timeout=30000)
    after = page.evaluate(FIGURES)
    assert after["status"] == "request timed out after 1 s" and _cleared(after)
    page.close()


def test_plain_decoding_is_noted_not_skipped(server: RunningServer, browser: Any) -> None:
    page = open_page(browser, server)
    _run(page, 16, drafter="none")
    figures = page.evaluate(FIGURES)
    n = int(figures["ntok"])  # one token per plain pass
    assert n == 16 and page.locator("#passes .pass-row").count() == 0
    assert page.evaluate(NUMBERS) == [f"#1–{n}"]  # one note for the whole run of plain steps
    assert page.text_content("#passes .pass-note .pass-plain") == f"no draft: {n} plain steps"
    assert figures["summary"] == f"{n} target passes: 0 judged a draft, {n} drafted nothing (plain steps)"
    page.close()


def test_pass_numbering_never_skips_under_the_policy(auto_server: RunningServer, browser: Any) -> None:
    """A random draft under the cost-based policy: whichever passes it drafts, every pass has a row or a note."""
    page = open_page(browser, auto_server)
    _run(page, 40)
    numbers = _pass_numbers(page.evaluate(NUMBERS))
    summary = page.text_content("#pass-summary")
    passes = int(summary.split(" target passes")[0])
    assert numbers == list(range(1, passes + 1))
    drafted = page.locator("#passes .pass-row").count()
    assert summary == f"{passes} target passes: {drafted} judged a draft, {passes - drafted} drafted nothing " \
                      "(plain steps)"
    page.close()


def _chunk(drafted: int, accepted: int) -> dict[str, Any]:
    """A chain pass as the server streams it: ``accepted`` of ``drafted`` proposals kept, then the target's
    token; ``drafted`` 0: a plain step."""
    pieces = ["a"] * accepted + ["b"]
    sd: dict[str, Any] = {"pieces": pieces, "from_draft": [True] * accepted + [False],
                          "token_ids": list(range(accepted + 1)), "drafted": drafted, "rejected": None}
    if drafted:
        rejected = "x" if accepted < drafted else None
        sd.update(rejected=rejected, bonus=rejected is None, tree=False,
                  verified=[True] * accepted + [False] * (drafted - accepted))
    return {"choices": [{"index": 0, "text": "".join(pieces), "finish_reason": None}], "specdecode": sd}


def test_plain_steps_between_drafted_passes(server: RunningServer, browser: Any) -> None:
    page = open_page(browser, server)
    page.evaluate(FEED, [_chunk(4, 4), _chunk(0, 0), _chunk(0, 0), _chunk(4, 1), _chunk(0, 0), _chunk(4, 2)])
    assert page.evaluate(NUMBERS) == ["#1", "#2–3", "#4", "#5", "#6"]
    assert page.eval_on_selector_all("#passes > div", "els => els.map(e => e.className)") == \
        ["pass-row", "pass-note", "pass-row", "pass-note", "pass-row"]
    assert page.locator("#passes .pass-note .pass-plain").all_text_contents() == \
        ["no draft: 2 plain steps", "no draft (plain step)"]
    assert page.text_content("#pass-summary") == "6 target passes: 3 judged a draft, 3 drafted nothing (plain steps)"
    page.close()


LABELS = """() => {
    const box = (e) => e.getBoundingClientRect();
    const heading = box(document.querySelector('#bars-box h2'));
    const values = [...document.querySelectorAll('#bars .bar span')].map(box);
    const numbers = [...document.querySelectorAll('#bar-labels span')].map((e) => ({...box(e).toJSON(),
        text: e.textContent}));
    const bars = [...document.querySelectorAll('#bars .bar')].map((e) => box(e).toJSON());
    return {heading: heading.toJSON(), values: values.map((v) => v.toJSON()), numbers, bars};
}"""


def _disjoint(boxes: list[dict[str, float]]) -> bool:
    spans = sorted((b["left"], b["right"]) for b in boxes)
    return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


@pytest.mark.parametrize("gamma", [4, 8, 32])
def test_bar_labels_clear_the_heading_and_each_other(server: RunningServer, browser: Any, gamma: int) -> None:
    page = open_page(browser, server)
    page.evaluate(FEED, [_chunk(gamma, gamma)] * 3)  # every position accepted: full bars, labels at the top
    got = page.evaluate(LABELS)
    assert len(got["bars"]) == gamma
    for v in got["values"]:
        assert v["top"] >= got["heading"]["bottom"]  # above the bar, below the heading
    assert _disjoint(got["values"]) and _disjoint(got["numbers"])
    if gamma <= 8:  # room for every value and every position number
        assert len(got["values"]) == gamma and [n["text"] for n in got["numbers"]] == [str(i + 1) for i in range(gamma)]
    else:  # narrow bars: values in the tooltips, every k-th position numbered from the first
        numbers = [int(n["text"]) for n in got["numbers"]]
        assert numbers[0] == 1 and len(numbers) >= 4 and len(set(b - a for a, b in zip(numbers, numbers[1:]))) == 1
    page.close()
