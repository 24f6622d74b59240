"""/health and /v1/models say whether the model has its own chat template (the page opens in chat mode then),
and /health and serve's start line say what a request without ``gamma`` gets (issue 49): "adaptive, at most
γ" under ``--speculation auto`` (unset: with ``--gamma auto``), a fixed γ under ``always`` (unset: with a number)."""

from __future__ import annotations

import copy
from typing import Iterator, Optional

import pytest

from specdecode.cli import build_parser
from specdecode.sizing.gamma import Gamma
from specdecode.kernels import build
from specdecode.server import cli, runner
from specdecode.server.app import ServerState, make_state
from specdecode.server.config import ServerConfig

from server_helpers import MODEL_NAME, Models, RunningServer, start_server

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"


def _state(models: Models, speculation: Optional[str], template: bool, gamma: Gamma = 8) -> ServerState:
    target = models.target
    if template:  # a copy: the session's model is shared by every server test
        target = copy.copy(target)
        target.chat_template = TEMPLATE
    return make_state(target, None, ServerConfig(speculation=speculation), default_drafter="ngram",
                      default_gamma=gamma, model_name=MODEL_NAME)


@pytest.fixture(scope="module")
def templated(models: Models) -> Iterator[RunningServer]:
    running = start_server(_state(models, "auto", template=True))
    yield running
    running.stop()


def test_health_says_adaptive_gamma_and_the_models_template(templated: RunningServer) -> None:
    h = templated.get("/health").json()
    assert h["speculation_mode"] == "adaptive" and h["default_gamma"] == 8
    assert h["chat_template"] is True
    cards = templated.get("/v1/models").json()["data"]
    assert cards and all(card["chat_template"] is True for card in cards)
    assert templated.get(f"/v1/models/{MODEL_NAME}").json()["chat_template"] is True


def test_a_chat_request_is_rendered_with_the_template_health_announces(templated: RunningServer,
                                                                        models: Models) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
    r = templated.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    rendered = "<|user|>hi\n<|assistant|>"  # a template brings its own special tokens: none are added
    assert r.json()["usage"]["prompt_tokens"] == len(models.target.encode(rendered, add_special_tokens=False))


def test_health_says_fixed_gamma_and_no_template(server: RunningServer) -> None:
    h = server.get("/health").json()  # the shared fixture: --speculation always, γ 4, no template
    assert h["speculation_mode"] == "fixed" and h["default_gamma"] == 4
    assert h["chat_template"] is False
    assert all(card["chat_template"] is False for card in server.get("/v1/models").json()["data"])


class _NoServer:
    def run(self) -> None:
        pass


@pytest.mark.parametrize("speculation,gamma,said", [("auto", 8, "gamma adaptive, at most 8,"),
                                                    ("always", 5, "gamma 5 every step,"),
                                                    (None, 5, "gamma 5 every step,"),  # --gamma N alone: fixed
                                                    (None, "auto", "gamma adaptive, at most 10,")])  # lookup's cap
def test_start_line_says_what_a_request_without_gamma_gets(models: Models, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str],
                                                           speculation: Optional[str], gamma: Gamma,
                                                           said: str) -> None:
    state = _state(models, speculation, template=False, gamma=gamma)
    monkeypatch.setattr(cli, "build_state", lambda args, engine_threads=None: state)
    monkeypatch.setattr(runner, "make_server", lambda s: _NoServer())
    monkeypatch.setattr(runner, "raise_fd_limit", lambda: 0)
    assert cli.cmd_serve(build_parser().parse_args(["serve"])) == 0  # build_state is a stand-in: flags unread
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(f"specdecode serve: {MODEL_NAME} on http://") and said in line, line


def test_start_line_names_each_kernel_that_is_off_and_why(models: Models, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    state = _state(models, "auto", template=False)
    monkeypatch.setattr(cli, "build_state", lambda args, engine_threads=None: state)
    monkeypatch.setattr(runner, "make_server", lambda s: _NoServer())
    monkeypatch.setattr(runner, "raise_fd_limit", lambda: 0)
    monkeypatch.setattr(build, "_STATUS", {})
    monkeypatch.setattr(build, "_REASONS", {})
    build.report_fallback("specdecode_decode_ops", "disabled", "SPECDECODE_FUSED_OPS=0 turns it off")
    assert cli.cmd_serve(build_parser().parse_args(["serve"])) == 0  # build_state is a stand-in: flags unread
    assert "the fast path is OFF (specdecode_decode_ops: disabled; eager PyTorch" in capsys.readouterr().out



@pytest.mark.slow  # Chromium: ~5 s
def test_the_page_opens_in_chat_mode_for_a_model_with_a_template(templated: RunningServer) -> None:
    from test_server_page import open_browser

    for browser in open_browser():
        page = browser.new_page()
        page.goto(templated.url + "/")
        page.wait_for_function(f"document.getElementById('model').textContent.includes('{MODEL_NAME}')")
        assert page.input_value("#mode") == "chat" and page.is_visible("#new-chat")
        page.close()
