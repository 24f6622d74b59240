"""What stands between raw HTTP bytes and the request models: size, media type, JSON shape.

A hostile or careless client must never reach code that can raise an internal
error: bodies over the limit are refused before they are buffered (413), POSTs
must say ``Content-Type: application/json`` (415; a cross-site form or
``text/plain`` post cannot trigger a completion without a CORS preflight),
NaN/Infinity, absurdly long numbers, deep nesting and lone surrogates (which
the tokeniser cannot take) are 400s that name where they are. A body must be
UTF-8 without a byte-order mark (RFC 8259), and a request that carries both
``Content-Length`` and ``Transfer-Encoding`` is refused (the two framings can
disagree: request smuggling behind a proxy). Parsing millions of tiny items
holds the GIL for seconds even in a worker thread, so ``check_item_count``
bounds them first, at C speed, from the raw bytes.
"""

from __future__ import annotations

import codecs
import json
from typing import Any, Awaitable, Callable, MutableMapping, Optional

from ..constraint_spec import echo

MAX_JSON_DEPTH = 32
ECHO_CHARS = 100  # at most this much of a client's value is quoted back in an error
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

    A declared ``Content-Length`` over the limit is answered at once, before the body is read. A
    chunked body is counted as it comes; past the limit the rest is read and dropped (up to a cap)
    before answering, so a client that writes its whole body before reading, as most do, sees the
    413 instead of a reset connection.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _has_both_framings(scope):
            await send_json(send, 400, error_json(
                "the request carries both Content-Length and Transfer-Encoding; send exactly one of them",
                "ambiguous_framing"), close=True)  # the body's end is unknown: the connection cannot be reused
            return
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            # answered before a byte of the body is read; up to DRAIN_CAP_FACTOR times the limit the
            # connection stays open, so the server drops the rest as it comes and a client that writes
            # its whole body before reading still reads this answer; beyond that it is closed at once
            await send_json(send, 413, self._too_big(), close=declared > self.limit * DRAIN_CAP_FACTOR)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        too_big = False
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
            await send_json(send, 413, self._too_big(), close=more)
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

    def _too_big(self) -> bytes:
        return error_json(f"request body is larger than this server's limit of {self.limit} bytes "
                          "(raise it with `specdecode serve --max-body-bytes N`)", "body_too_large")


# on every answer, the page's and the API's: no MIME sniffing of a JSON error into HTML, and no
# framing by another site (clickjacking the page's buttons)
SECURITY_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
                    (b"content-security-policy", b"frame-ancestors 'none'"), (b"referrer-policy", b"no-referrer"))


class SecurityHeaders:
    """ASGI middleware: ``SECURITY_HEADERS`` on every HTTP answer (an answer's own value wins)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                headers = list(msg.get("headers", []))
                names = {k.lower() for k, _ in headers}
                msg = {**msg, "headers": headers + [h for h in SECURITY_HEADERS if h[0] not in names]}
            await send(msg)

        await self.app(scope, receive, send_with_headers)


def _has_both_framings(scope: Scope) -> bool:
    names = {k.lower() for k, _ in scope.get("headers", [])}
    return b"content-length" in names and b"transfer-encoding" in names


def _content_length(scope: Scope) -> Optional[int]:
    for k, v in scope.get("headers", []):
        if k == b"content-length":
            try:
                return int(v)
            except ValueError:
                return None
    return None


async def send_json(send: Send, status: int, body: bytes, close: bool) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def shown(value: object) -> str:
    """``repr(value)`` for an error message, cut to ``ECHO_CHARS``: a client's 3 MB field name or value
    must not come back in a 3 MB error."""
    return echo(value, ECHO_CHARS)


def check_content_type(value: Optional[str]) -> None:
    """POST bodies must be declared JSON (browsers cannot send that cross-site without a preflight), in
    UTF-8: a body declared in another charset would otherwise be read as UTF-8 regardless."""
    media, *params = (value or "").split(";")
    media = media.strip().lower()
    if media != "application/json":
        got = f"got {shown(media)}" if media else "none was sent"
        raise BadBody(f"send the request body as JSON with 'Content-Type: application/json' ({got})",
                      "unsupported_media_type", status=415)
    for param in params:
        name, _, charset = param.partition("=")
        charset = charset.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            raise BadBody(f"Content-Type header: charset {shown(charset)} is not supported; send the JSON as "
                          "UTF-8 ('Content-Type: application/json' or 'application/json; charset=utf-8')",
                          "unsupported_media_type", status=415)


def _no_constants(name: str) -> Any:
    raise BadBody(f"request body is not valid JSON: {name} is not a JSON number", "invalid_json")


def decode_utf8(raw: bytes) -> str:
    """The body as text: UTF-8 only, no byte-order mark (json.loads would guess UTF-16/32 and skip a BOM).
    Lone surrogates pass here so that ``check_tree`` can name the field holding one."""
    if raw.startswith(codecs.BOM_UTF8):
        raise BadBody("request body starts with a byte-order mark (EF BB BF); send the JSON as UTF-8 without "
                      "a BOM", "invalid_json")
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or b"\x00" in raw[:4]:
        raise BadBody("request body is UTF-16 or UTF-32; send the JSON as UTF-8", "invalid_json")
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:
        raise BadBody(f"request body is not valid UTF-8 (bad byte at offset {e.start}); send the JSON as UTF-8",
                      "invalid_json") from e


def check_item_count(raw: bytes, limit: int, why: str) -> None:
    """Refuse a body of more than ``limit`` JSON items (array elements and object members) before parsing:
    ``json.loads`` and validation hold the GIL throughout, about a second per million tiny items, which
    would stall the event loop even from a worker thread. Costs a few milliseconds for 4 MiB."""
    if raw.count(b",") < limit:  # commas inside strings count too: an upper bound, nearly always enough
        return
    plain = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # escaped backslashes, then escaped quotes
    strings = plain.count(b'"') // 2
    # an item holds at most two strings (a key and its value); items are separated by commas outside strings
    if strings // 2 > limit or b"".join(plain.split(b'"')[::2]).count(b",") >= limit:
        raise BadBody(f"request body holds more than {limit} JSON items (array elements and object members); "
                      f"{why}", "too_many_items", status=400)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Decode a body into a dict, refusing what Python's json would accept but a request cannot hold."""
    text = decode_utf8(raw)
    try:
        obj = json.loads(text, parse_constant=_no_constants)
    except BadBody:
        raise
    except RecursionError as e:
        raise BadBody(f"request body is nested too deeply (at most {MAX_JSON_DEPTH} levels)", "invalid_json") from e
    except json.JSONDecodeError as e:
        raise BadBody(f"request body is not valid JSON: {e}", "invalid_json") from e
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
            top = path[0].encode("utf-8", "replace").decode()[:ECHO_CHARS]
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
    where = ".".join(p.encode("utf-8", "replace").decode()[:ECHO_CHARS] for p in path)[:4 * ECHO_CHARS] or None
    bad = next(c for c in text if 0xD800 <= ord(c) <= 0xDFFF)
    raise BadBody(f"{where}: contains an unpaired UTF-16 surrogate (\\u{ord(bad):04x}); send valid Unicode text",
                  "invalid_value", param=where)
