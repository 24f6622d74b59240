"""What stands between raw HTTP bytes and the request models: size, media type, JSON shape.

A hostile or careless client must never reach code that can raise an internal
error: bodies over the limit are refused before they are buffered (413), POSTs
must say ``Content-Type: application/json`` (415; a cross-site form or
``text/plain`` post cannot trigger a completion without a CORS preflight),
NaN/Infinity, absurdly long numbers, deep nesting and lone surrogates (which
the tokeniser cannot take) are 400s that name where they are.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, MutableMapping, Optional

MAX_JSON_DEPTH = 32
DRAIN_CAP_FACTOR = 16  # read (and drop) at most this many times the limit before answering 413

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BadBody(ValueError):
    """The body is not a request we can read; ``param`` names where, when there is a where."""

    def __init__(self, message: str, code: str, status: int = 400, param: Optional[str] = None) -> None:
        super().__init__(message)
        self.message, self.code, self.status, self.param = message, code, status, param


def error_json(message: str, code: str, type_: str = "invalid_request_error") -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()


class BodyLimit:
    """ASGI middleware: a POST body over ``limit`` bytes gets a 413 without being buffered.

    The rest of the body is read and dropped (up to a cap) before answering, so a client that
    writes its whole body before reading, as most do, sees the 413 instead of a reset connection.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        chunks: list[bytes] = []
        size = 0
        more = True
        too_big = declared is not None and declared > self.limit
        while more and not too_big:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            chunks.append(body)
            more = msg.get("more_body", False)
            too_big = size > self.limit
        if too_big:
            while more and size <= self.limit * DRAIN_CAP_FACTOR:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                size += len(msg.get("body", b""))
                more = msg.get("more_body", False)
            await _send_json(send, 413, error_json(
                f"request body is larger than this server's limit of {self.limit} bytes "
                "(raise it with `specdecode serve --max-body-bytes N`)", "body_too_large"),
                close=more)
            return
        whole = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would say it

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> Optional[int]:
    for k, v in scope.get("headers", []):
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None


async def _send_json(send: Send, status: int, body: bytes, close: bool) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def check_content_type(value: Optional[str]) -> None:
    """POST bodies must be declared JSON: browsers cannot send that cross-site without a preflight."""
    media = (value or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        got = f"got {media!r}" if media else "none was sent"
        raise BadBody(f"send the request body as JSON with 'Content-Type: application/json' ({got})",
                      "unsupported_media_type", status=415)


def _no_constants(name: str) -> Any:
    raise BadBody(f"request body is not valid JSON: {name} is not a JSON number", "invalid_json")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode a body into a dict, refusing what Python's json would accept but a request cannot hold."""
    try:
        obj = json.loads(raw, parse_constant=_no_constants)
    except BadBody:
        raise
    except RecursionError as e:
        raise BadBody(f"request body is nested too deeply (at most {MAX_JSON_DEPTH} levels)", "invalid_json") from e
    except json.JSONDecodeError as e:
        raise BadBody(f"request body is not valid JSON: {e}", "invalid_json") from e
    except UnicodeDecodeError as e:
        raise BadBody("request body is not valid UTF-8 JSON", "invalid_json") from e
    except ValueError as e:  # e.g. an integer literal with thousands of digits
        raise BadBody("request body is not valid JSON: a number in it is too long", "invalid_json") from e
    if not isinstance(obj, dict):
        raise BadBody("request body must be a JSON object", "invalid_json")
    check_tree(obj)
    return obj


def check_tree(obj: Any) -> None:
    """Bounded depth, and only strings UTF-8 can encode (JSON's \\ud800 escapes make lone surrogates)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(obj, ())]
    while stack:
        node, path = stack.pop()
        if len(path) > MAX_JSON_DEPTH:
            top = path[0].encode("utf-8", "replace").decode()
            raise BadBody(f"{top}: nested too deeply (a request has at most {MAX_JSON_DEPTH} levels)",
                          "invalid_value", param=top)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            if isinstance(k, str) and not _encodable(k):
                _surrogate(k, path + (k,))
            if isinstance(v, str):
                if not _encodable(v):
                    _surrogate(v, path + (str(k),))
            elif isinstance(v, (dict, list)):
                stack.append((v, path + (str(k),)))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _surrogate(text: str, path: tuple[str, ...]) -> None:
    where = ".".join(p.encode("utf-8", "replace").decode() for p in path) or None
    bad = next(c for c in text if 0xD800 <= ord(c) <= 0xDFFF)
    raise BadBody(f"{where}: contains an unpaired UTF-16 surrogate (\\u{ord(bad):04x}); send valid Unicode text",
                  "invalid_value", param=where)
