"""FastAPI app: OpenAI-compatible endpoints, SSE streaming, /metrics, /health and the web page.

Every user error becomes a 4xx with OpenAI's error body, so the official
clients raise their typed exceptions (BadRequestError, AuthenticationError,
RateLimitError) with our message. The handlers only validate, tokenise and
relay events; decoding happens on the scheduler's thread.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..cache import ContextLengthError
from ..config import ConfigError, GenerationConfig, SamplingConfig, VerifyConfig
from ..engine import FinishEvent, StepEvent, prompt_ids
from .chat import PLAIN_TEMPLATE, ChatFormatter, ChatTemplateError
from .config import ServerConfig
from .metrics import ServerMetrics
from .protocol import (ChatCompletionRequest, CompletionRequest, chat_chunk, completion_chunk, error_body, new_id,
                       now, usage)
from .scheduler import Event, Failure, QueueFullError, RequestHandle, Scheduler, SchedulerClosedError
from .scheduler import Request as DecodeRequest

if TYPE_CHECKING:
    from ..drafters.vocab import VocabSpec
    from ..models import Model

log = logging.getLogger("specdecode.server")

STATIC_DIR = Path(__file__).parent / "static"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.type, self.param, self.code), status_code=self.status)


class ClientGone(Exception):
    """The client disconnected before its (non-streaming) answer was ready."""


@dataclass
class ServerState:
    scheduler: Scheduler
    metrics: ServerMetrics
    config: ServerConfig
    model_name: str
    chat: ChatFormatter
    chat_has_model_template: bool
    default_drafter: str
    default_gamma: int
    created: int


def create_app(state: ServerState) -> FastAPI:
    """Build the app; the scheduler thread starts and stops with the app's lifespan."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.scheduler.stop, min(30.0, state.config.request_timeout))

    app = FastAPI(title="specdecode", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.specdecode = state

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(ClientGone)
    async def _gone(_: Request, e: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it; nginx's code for "client closed request"

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        return _validation_error(e.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(e.detail), kind), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(error_body(f"internal server error: {e}", "server_error"), status_code=500)

    def check_auth(request: Request) -> None:
        key = state.config.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        if not header:
            raise ApiError(401, "missing API key: send 'Authorization: Bearer YOUR_KEY'", "authentication_error",
                           code="invalid_api_key")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise ApiError(401, "incorrect API key provided", "authentication_error", code="invalid_api_key")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        s = state.scheduler
        return {"status": "ok", "model": state.model_name, "active_rows": s.active_rows,
                "queue_depth": s.queue_depth, "max_batch_size": s.max_batch_size,
                "forward_passes": s.forward_passes, "drafters": sorted(s.drafters),
                "default_drafter": state.default_drafter, "default_gamma": state.default_gamma,
                "context_length": s.context_len, "speculation": s.policy.snapshot()}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_auth(request)
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": state.created,
                                            "owned_by": "specdecode"}]}

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Union[JSONResponse, StreamingResponse]:
        check_auth(request)
        req = await _parse(request, CompletionRequest)
        _check_model(state, req.model)
        prompt: Union[str, list[int]]
        prompt = req.prompt[0] if req.prompt and isinstance(req.prompt, list) and isinstance(req.prompt[0], str) \
            else req.prompt  # type: ignore[assignment]
        ids = _tokenize(state, prompt, "prompt", add_special_tokens=True)
        spec = _build_spec(state, req, ids, req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS, "prompt")
        handle = _submit(state, spec)
        rid, created = new_id("cmpl"), now()

        def chunk(text: str, reason: Optional[str], extra: Optional[dict[str, Any]]) -> dict[str, Any]:
            return completion_chunk(rid, created, state.model_name, text, reason, extra)

        if req.stream:
            opts = req.stream_options
            return _sse(handle, chunk, None, bool(opts and opts.include_usage), rid, created, state.model_name,
                        "text_completion")
        fin, flags = await _collect(handle, request)
        body = chunk(fin.text, fin.reason, _summary(fin, flags))
        body["usage"] = _usage(fin)
        return JSONResponse(body)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Union[JSONResponse, StreamingResponse]:
        check_auth(request)
        req = await _parse(request, ChatCompletionRequest)
        _check_model(state, req.model)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            text = state.chat.render(messages)
        except ChatTemplateError as e:
            raise ApiError(400, str(e), param="messages") from e
        ids = _tokenize(state, text, "messages", add_special_tokens=not state.chat_has_model_template)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        spec = _build_spec(state, req, ids, max_tokens, None, "messages")
        handle = _submit(state, spec)
        rid, created = new_id("chatcmpl"), now()

        def chunk(text: str, reason: Optional[str], extra: Optional[dict[str, Any]]) -> dict[str, Any]:
            return chat_chunk(rid, created, state.model_name, {"content": text} if text or reason is None else {},
                              reason, extra)

        if req.stream:
            opts = req.stream_options
            first = chat_chunk(rid, created, state.model_name, {"role": "assistant", "content": ""}, None, None)
            return _sse(handle, chunk, first, bool(opts and opts.include_usage), rid, created, state.model_name,
                        "chat.completion.chunk")
        fin, flags = await _collect(handle, request)
        body = {
            "id": rid, "object": "chat.completion", "created": created, "model": state.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": fin.text}, "logprobs": None,
                         "finish_reason": fin.reason}],
            "usage": _usage(fin), "specdecode": _summary(fin, flags),
        }
        return JSONResponse(body)

    return app


# -- helpers ---------------------------------------------------------------------------------------

_TYPE_TAG = re.compile(r"^(str|int|float|bool|list|dict|none|literal|function-\w+|[A-Z]\w*)(\[.*\])?$")


def _validation_error(errors: Any) -> ApiError:
    """The first problem pydantic found, as a 400 naming the field (union member tags dropped)."""
    errs = list(errors) or [{"loc": (), "msg": "invalid request"}]
    err = errs[0]
    if err.get("type") == "json_invalid":
        return ApiError(400, f"request body is not valid JSON: {err.get('msg')}", code="invalid_json")
    loc = [str(p) for p in err.get("loc", ()) if p != "body" and not (isinstance(p, str) and _TYPE_TAG.match(p))]
    param = ".".join(loc) or None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if len(errs) > 1 and param == "prompt":
        msg = "must be a string, a list with one string, or a list of token ids"
    return ApiError(400, f"{param}: {msg}" if param else msg, param=param, code="invalid_value")


async def _parse(request: Request, cls: type[BaseModel]) -> Any:
    raw = await request.body()
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(obj, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    try:
        return cls.model_validate(obj)
    except ValidationError as e:
        raise _validation_error(e.errors()) from e


def _check_model(state: ServerState, name: str) -> None:
    if name != state.model_name:
        raise ApiError(400, f"model {name!r} is not served here; this server serves {state.model_name!r} "
                            "(see GET /v1/models)", param="model", code="model_not_found")


def _tokenize(state: ServerState, prompt: Union[str, list[int]], param: str, add_special_tokens: bool) -> list[int]:
    target = state.scheduler.target
    try:
        if isinstance(prompt, str) and not add_special_tokens and prompt:
            ids = target.encode(prompt, add_special_tokens=False)
        else:
            ids = prompt_ids(target, prompt)
    except ContextLengthError as e:
        raise ApiError(400, str(e), param=param, code="context_length_exceeded") from e
    except (ConfigError, ValueError) as e:
        raise ApiError(400, str(e), param=param, code="invalid_value") from e
    if not ids:
        raise ApiError(400, "the prompt is empty; give at least one token of text", param=param, code="invalid_value")
    ctx = state.scheduler.context_len
    if len(ids) >= ctx:
        raise ApiError(400, f"the prompt has {len(ids)} tokens but this model's maximum context length is {ctx} "
                            "tokens; shorten it so at least one token can be generated",
                       param=param, code="context_length_exceeded")
    return ids


def _build_spec(state: ServerState, req: Any, ids: list[int], max_tokens: Optional[int],
                default_max: Optional[int], prompt_param: str) -> DecodeRequest:
    ctx = state.scheduler.context_len
    room = ctx - len(ids)
    if max_tokens is None:
        max_new = min(default_max or room, room)
    elif max_tokens > room:
        raise ApiError(400, f"this model's maximum context length is {ctx} tokens, but {len(ids) + max_tokens} were "
                            f"requested ({len(ids)} in the {prompt_param}, {max_tokens} for max_tokens); "
                            "reduce the prompt or max_tokens", param="max_tokens", code="context_length_exceeded")
    else:
        max_new = max_tokens
    drafter = req.drafter or state.default_drafter
    loaded = state.scheduler.drafters
    if drafter != "none" and drafter not in loaded:
        raise ApiError(400, f"drafter {drafter!r} is not loaded on this server; use one of: "
                            f"{', '.join(sorted(loaded) + ['none'])}", param="drafter", code="invalid_value")
    try:
        sampling = SamplingConfig(temperature=1.0 if req.temperature is None else req.temperature, top_k=req.top_k,
                                  top_p=req.top_p, min_p=req.min_p, seed=req.seed)
        generation = GenerationConfig(max_new_tokens=max_new, ignore_eos=bool(req.ignore_eos), stop=req.stop_list())
        verify = VerifyConfig(chain_rule=req.chain_rule or VerifyConfig.chain_rule)
    except ConfigError as e:
        raise ApiError(400, str(e), code="invalid_value") from e
    return DecodeRequest(ids, sampling, generation, None if drafter == "none" else drafter,
                   gamma=req.gamma or state.default_gamma, adaptive=state.config.speculation == "auto",
                   verify=verify)


def _submit(state: ServerState, spec: DecodeRequest) -> RequestHandle:
    handle = RequestHandle(spec, asyncio.get_running_loop(), state.config.request_timeout)
    try:
        state.scheduler.submit(handle)
    except QueueFullError as e:
        raise ApiError(429, str(e), "rate_limit_error", code="queue_full") from e
    except SchedulerClosedError as e:
        raise ApiError(503, str(e), "server_error", code="shutting_down") from e
    except ValueError as e:
        raise ApiError(400, str(e), param="drafter", code="invalid_value") from e
    return handle


def _usage(fin: FinishEvent) -> dict[str, Any]:
    s = fin.stats
    return usage(s.prompt_tokens, len(fin.token_ids), s.target_passes, s.drafted, s.accepted)


def _summary(fin: FinishEvent, from_draft: list[bool]) -> dict[str, Any]:
    s = fin.stats
    return {"from_draft": from_draft, "alpha": s.alpha, "tau": s.tau, "tokens_per_s": s.tokens_per_s,
            "decode_tokens_per_s": s.decode_tokens_per_s}


def _failure_error(f: Failure) -> ApiError:
    if f.kind == "timeout":
        return ApiError(504, f.message, "timeout_error", code="request_timeout")
    if f.kind == "shutdown":
        return ApiError(503, f.message, "server_error", code="shutting_down")
    return ApiError(500, f.message, "server_error", code="internal_error")


async def _next_event(handle: RequestHandle, wait: float) -> Optional[Event]:
    try:
        return await asyncio.wait_for(handle.queue.get(), timeout=wait)
    except asyncio.TimeoutError:
        if time.monotonic() > handle.deadline + 5.0:  # the engine missed the deadline itself: give up here
            handle.cancel()
            return Failure("timeout", "the request timed out")
        return None


async def _collect(handle: RequestHandle, request: Request) -> tuple[FinishEvent, list[bool]]:
    """Wait for a non-streaming request to finish, cancelling it if the client goes away."""
    flags: list[bool] = []
    next_check = time.monotonic() + 0.25
    try:
        while True:
            ev = await _next_event(handle, 0.25)
            if time.monotonic() >= next_check:  # events may never pause, so check on a clock
                next_check = time.monotonic() + 0.25
                if await request.is_disconnected():
                    raise ClientGone()
            if ev is None:
                continue
            if isinstance(ev, StepEvent):
                flags.extend(ev.from_draft)
            elif isinstance(ev, FinishEvent):
                return ev, flags
            else:
                raise _failure_error(ev)
    except BaseException:
        handle.cancel()
        raise


def _sse(handle: RequestHandle, chunk: Callable[[str, Optional[str], Optional[dict[str, Any]]], dict[str, Any]],
         first: Optional[dict[str, Any]], include_usage: bool, rid: str, created: int, model: str,
         obj: str) -> StreamingResponse:
    """Server-sent events: one chunk per target pass, carrying per-token origin in ``specdecode``."""

    def line(payload: Any) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    async def events() -> AsyncIterator[bytes]:
        done = False
        flags: list[bool] = []
        try:
            if first is not None:
                yield line(first)
            while True:
                ev = await _next_event(handle, 1.0)
                if ev is None:
                    continue
                if isinstance(ev, StepEvent):
                    from_draft = ev.from_draft + [False] * (len(ev.pieces) - len(ev.from_draft))
                    flags.extend(ev.from_draft)
                    yield line(chunk(ev.text, None, {"pieces": ev.pieces, "from_draft": from_draft,
                                                     "token_ids": ev.token_ids,
                                                     "drafted": ev.drafted}))
                elif isinstance(ev, FinishEvent):
                    yield line(chunk("", ev.reason, {**_summary(ev, []), "usage": _usage(ev)}))
                    if include_usage:
                        yield line({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                                    "usage": _usage(ev)})
                    done = True
                    yield b"data: [DONE]\n\n"
                    return
                else:
                    e = _failure_error(ev)
                    done = True
                    yield line(error_body(e.message, e.type, e.param, e.code))
                    yield b"data: [DONE]\n\n"
                    return
        finally:
            if not done:  # client went away (or the server is closing): free the row now
                handle.cancel()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def make_state(target: "Model", draft_model: Optional["Model"], config: ServerConfig, default_drafter: str = "model",
               default_gamma: int = 4, ngram_max: int = 3, ngram_min: int = 1,
               model_name: Optional[str] = None, draft_vocab: "VocabSpec" = "auto",
               exit_layer: Optional[int] = None, skip_layers: Optional[tuple[int, ...]] = None,
               heads: Optional[str] = None) -> ServerState:
    """Everything the app needs, from loaded models and the serving flags: every registered drafter
    that can run with what is loaded (a draft model's only when one is given)."""
    from ..drafters.registry import REGISTRY, DrafterOptions, get_spec

    options = DrafterOptions(draft=draft_model, gamma="auto", vocab=draft_vocab, ngram_max=ngram_max,
                             ngram_min=ngram_min, exit_layer=exit_layer, skip_layers=skip_layers, heads=heads)
    if get_spec(default_drafter).needs_draft_model and draft_model is None:
        raise ConfigError(f"default drafter {default_drafter!r} needs a draft model; pass one or choose one of: "
                          f"{', '.join(n for n, sp in REGISTRY.items() if not sp.needs_draft_model)}")
    if get_spec(default_drafter).needs_heads and heads is None:
        raise ConfigError(f"default drafter {default_drafter!r} needs Medusa heads (--heads DIR); train them with "
                          "`specdecode distill --method medusa --target TARGET --out DIR`")
    drafters = {}
    for name, spec in REGISTRY.items():
        if spec.needs_draft_model and draft_model is None:
            continue
        built = spec.build(options)
        if built is not None:
            drafters[name] = built
    metrics = ServerMetrics()
    scheduler = Scheduler(target, drafters, max_batch_size=config.max_batch_size, max_queue=config.max_queue,
                          max_context=config.max_context, metrics=metrics)
    chat = ChatFormatter.for_model(target.path)
    return ServerState(scheduler, metrics, config, model_name or target.name, chat, chat.source != PLAIN_TEMPLATE,
                       default_drafter, default_gamma, now())
