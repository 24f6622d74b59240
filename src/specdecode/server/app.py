"""FastAPI app: OpenAI-compatible endpoints, SSE streaming, /metrics, /health and the web page.

Every user error becomes a 4xx with OpenAI's error body, so the official
clients raise their typed exceptions (BadRequestError, AuthenticationError,
RateLimitError) with our message. The handlers only validate, tokenise and
relay events; decoding happens on the scheduler's thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from ..constraints import Constraint, constraint_from_response_format, parse_logit_bias
from .chat import PLAIN_TEMPLATE, ChatFormatter, ChatTemplateError
from .choices import ChoiceGroup, chat_logprobs, choice_seed, completion_logprobs, merge_completion_logprobs
from .config import ServerConfig
from .guard import BadBody, BodyLimit, check_content_type, parse_json_object
from .metrics import ServerMetrics
from .protocol import (NOT_HONOURED, NOT_SUPPORTED_YET, ChatCompletionRequest, CompletionRequest, chat_chunk,
                       completion_chunk, error_body, new_id, now, refused_parameter, usage)
from .scheduler import Event, Failure, QueueFullError, RequestHandle, Scheduler, SchedulerClosedError
from .scheduler import Request as DecodeRequest

if TYPE_CHECKING:
    from ..drafters.vocab import VocabSpec
    from ..models import Model

log = logging.getLogger("specdecode.server")

STATIC_DIR = Path(__file__).parent / "static"
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
RETRY_AFTER_BUSY_S = 1  # 429: a row frees up as soon as any request ends
RETRY_AFTER_DRAIN_S = 5  # 503: this process is going away; a restarted one needs a few seconds
PARSE_IN_THREAD_BYTES = 64 * 1024  # bigger bodies are decoded and validated off the event loop


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None, retry_after: Optional[int] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.retry_after = retry_after

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return JSONResponse(error_body(self.message, self.type, self.param, self.code), status_code=self.status,
                            headers=headers)


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
    max_token_chars: int = 0  # longest vocabulary entry, for the early context-length check


def create_app(state: ServerState) -> FastAPI:
    """Build the app; the scheduler thread starts and stops with the app's lifespan."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.scheduler.stop, state.config.drain_timeout)

    app = FastAPI(title="specdecode", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json" if state.config.openapi else None)
    app.state.specdecode = state
    app.add_middleware(BodyLimit, limit=state.config.max_body_bytes)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(ClientGone)
    async def _gone(_: Request, e: ClientGone) -> Response:
        log.info("client disconnected before its answer: %s", e)
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
        ref = new_id("err")
        log.exception("unhandled error %s", ref)  # the details stay in the log; the client gets a reference
        return JSONResponse(error_body(f"internal server error (reference {ref} in the server log)", "server_error"),
                            status_code=500)

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

    def model_card() -> dict[str, Any]:
        return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "specdecode"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_auth(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        check_auth(request)
        if model_id != state.model_name:
            raise ApiError(404, f"model {model_id!r} is not served here; this server serves {state.model_name!r}",
                           "not_found_error", param="model", code="model_not_found")
        return model_card()

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Union[JSONResponse, StreamingResponse]:
        check_auth(request)
        req = await _parse(request, CompletionRequest)
        _check_model(state, req.model)
        prompt: Union[str, list[int]]
        prompt = req.prompt[0] if req.prompt and isinstance(req.prompt, list) and isinstance(req.prompt[0], str) \
            else req.prompt  # type: ignore[assignment]
        ids = await asyncio.to_thread(_tokenize, state, prompt, "prompt", True)
        constraint = await asyncio.to_thread(_constraint, state, req)
        specs = _build_specs(state, req, ids, req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS, "prompt", constraint,
                             req.logprobs)
        group = _submit(state, specs)
        rid, created = new_id("cmpl"), now()
        text_of = lambda t: _token_text(state, t)  # noqa: E731
        offsets = [0] * len(specs)

        def lp(i: int, ev: StepEvent) -> Optional[dict[str, Any]]:
            if ev.logprobs is None:
                return None
            out = completion_logprobs(ev.logprobs, ev.pieces, offsets[i], text_of)
            offsets[i] += len(ev.text)
            return out

        def chunk(i: int, text: str, reason: Optional[str], extra: Optional[dict[str, Any]],
                  logprobs: Optional[dict[str, Any]] = None) -> dict[str, Any]:
            return completion_chunk(rid, created, state.model_name, text, reason, extra, i, logprobs)

        if req.stream:
            opts = req.stream_options
            return _sse(group, chunk, lp, None, bool(opts and opts.include_usage), rid, created, state.model_name,
                        "text_completion", text_of)
        results = await _collect(group, request, lp)
        body = chunk(0, "", None, None)
        body["choices"] = [chunk(i, r.fin.text, r.fin.reason, None,
                                 merge_completion_logprobs(r.logprobs) if req.logprobs is not None else None
                                 )["choices"][0] for i, r in enumerate(results)]
        body["usage"] = _usage_all([r.fin for r in results])
        body["specdecode"] = _summaries(results)
        return JSONResponse(body)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Union[JSONResponse, StreamingResponse]:
        check_auth(request)
        req = await _parse(request, ChatCompletionRequest)
        _check_model(state, req.model)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        ids = await asyncio.to_thread(_render_and_tokenize, state, messages)
        if req.top_logprobs and not req.logprobs:
            raise ApiError(400, "top_logprobs: needs logprobs: true (top_logprobs counts the alternatives reported "
                                "beside each token's logprob)", param="top_logprobs", code="invalid_value")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        constraint = await asyncio.to_thread(_constraint, state, req)
        specs = _build_specs(state, req, ids, max_tokens, None, "messages", constraint,
                             (req.top_logprobs or 0) if req.logprobs else None)
        group = _submit(state, specs)
        rid, created = new_id("chatcmpl"), now()
        text_of = lambda t: _token_text(state, t)  # noqa: E731
        bytes_of = await asyncio.to_thread(_token_bytes_fn, state) if req.logprobs else (lambda t: None)

        def lp(i: int, ev: StepEvent) -> Optional[dict[str, Any]]:
            return None if ev.logprobs is None else {"content": chat_logprobs(ev.logprobs, text_of, bytes_of)}

        def chunk(i: int, text: str, reason: Optional[str], extra: Optional[dict[str, Any]],
                  logprobs: Optional[dict[str, Any]] = None) -> dict[str, Any]:
            return chat_chunk(rid, created, state.model_name, {"content": text} if text or reason is None else {},
                              reason, extra, i, logprobs)

        if req.stream:
            opts = req.stream_options
            first = [chat_chunk(rid, created, state.model_name, {"role": "assistant", "content": ""}, None, None, i)
                     for i in range(len(specs))]
            return _sse(group, chunk, lp, first, bool(opts and opts.include_usage), rid, created, state.model_name,
                        "chat.completion.chunk", text_of)
        results = await _collect(group, request, lp)
        body = {
            "id": rid, "object": "chat.completion", "created": created, "model": state.model_name,
            "choices": [{"index": i, "message": {"role": "assistant", "content": r.fin.text},
                         "logprobs": ({"content": [c for p in r.logprobs for c in p["content"]]} if req.logprobs
                                      else None),
                         "finish_reason": r.fin.reason} for i, r in enumerate(results)],
            "usage": _usage_all([r.fin for r in results]), "specdecode": _summaries(results),
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
    if err.get("type") == "extra_forbidden":  # OpenAI's wording for a field it does not know
        param = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        return ApiError(400, f"{param}: unrecognized request argument supplied", param=param,
                        code="unknown_parameter")
    loc = [str(p) for p in err.get("loc", ()) if p != "body" and not (isinstance(p, str) and _TYPE_TAG.match(p))]
    param = ".".join(loc) or None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if len(errs) > 1 and param == "prompt":
        msg = "must be a string, a list with one string, or a list of token ids"
    return ApiError(400, f"{param}: {msg}" if param else msg, param=param, code="invalid_value")


def _validate(raw: bytes, cls: type[BaseModel]) -> Any:
    """Bytes -> request model, or an ApiError naming the field (guard.py refuses what JSON alone allows)."""
    try:
        obj = parse_json_object(raw)
    except BadBody as e:
        raise ApiError(e.status, e.message, param=e.param, code=e.code) from e
    refused = refused_parameter(obj)
    if refused is not None:
        name, why = refused
        raise ApiError(400, f"{name}: {why}", param=name, code="unsupported_parameter")
    for name in (*NOT_SUPPORTED_YET, *NOT_HONOURED):  # neutral values of fields this endpoint lacks
        if name in obj and name not in cls.model_fields:
            del obj[name]
    try:
        return cls.model_validate(obj)
    except ValidationError as e:
        raise _validation_error(e.errors()) from e
    except (RecursionError, OverflowError) as e:  # belt and braces: never a 500 for a body
        raise ApiError(400, "request body could not be read as a request", code="invalid_value") from e


async def _parse(request: Request, cls: type[BaseModel]) -> Any:
    try:
        check_content_type(request.headers.get("content-type"))
    except BadBody as e:
        raise ApiError(e.status, e.message, code=e.code) from e
    raw = await request.body()  # BodyLimit has already refused bodies over the limit
    if len(raw) > PARSE_IN_THREAD_BYTES:
        return await asyncio.to_thread(_validate, raw, cls)
    return _validate(raw, cls)


def _check_model(state: ServerState, name: str) -> None:
    if name != state.model_name:
        raise ApiError(400, f"model {name!r} is not served here; this server serves {state.model_name!r} "
                            "(see GET /v1/models)", param="model", code="model_not_found")


def _render_and_tokenize(state: ServerState, messages: list[dict[str, str]]) -> list[int]:
    """Chat template, then tokens (runs in a worker thread: both can take a while on a long chat)."""
    try:
        text = state.chat.render(messages)
    except ChatTemplateError as e:
        raise ApiError(400, str(e), param="messages") from e
    except RecursionError as e:
        raise ApiError(400, "the chat template could not render these messages", param="messages") from e
    return _tokenize(state, text, "messages", not state.chat_has_model_template)


def _tokenize(state: ServerState, prompt: Union[str, list[int]], param: str, add_special_tokens: bool) -> list[int]:
    """Prompt -> ids, refusing a prompt that cannot fit before spending time on it (runs in a worker thread)."""
    target = state.scheduler.target
    ctx = state.scheduler.context_len
    # no token is longer than max_token_chars, so this many characters need at least ctx tokens
    if isinstance(prompt, str) and state.max_token_chars and len(prompt) >= ctx * state.max_token_chars:
        at_least = len(prompt) // state.max_token_chars
        raise ApiError(400, f"the {param} has {len(prompt)} characters, at least {at_least} "
                            f"tokens, more than this model's context window of {ctx} tokens; shorten it",
                       param=param, code="context_length_exceeded")
    if isinstance(prompt, list) and len(prompt) >= ctx:
        raise ApiError(400, f"the {param} has {len(prompt)} tokens but this model's context window is {ctx} "
                            "tokens; shorten it so at least one token can be generated",
                       param=param, code="context_length_exceeded")
    try:
        if isinstance(prompt, str) and prompt and target.tokenizer is not None:
            # Model.encode's pipeline, but encode_batch releases the GIL (encode holds it): a long prompt
            # tokenised in a worker thread then never stalls the event loop
            ids = target.tokenizer.encode_batch([prompt], add_special_tokens=add_special_tokens)[0].ids
        else:
            ids = prompt_ids(target, prompt)
    except ContextLengthError as e:
        raise ApiError(400, str(e), param=param, code="context_length_exceeded") from e
    except (ConfigError, ValueError) as e:
        raise ApiError(400, str(e), param=param, code="invalid_value") from e
    except (TypeError, OverflowError) as e:  # the tokeniser refused the text: say so without its internals
        raise ApiError(400, f"the {param} could not be tokenised; send plain Unicode text", param=param,
                       code="invalid_value") from e
    if not ids:
        raise ApiError(400, "the prompt is empty; give at least one token of text", param=param, code="invalid_value")
    if len(ids) >= ctx:
        raise ApiError(400, f"the prompt has {len(ids)} tokens but this model's maximum context length is {ctx} "
                            "tokens; shorten it so at least one token can be generated",
                       param=param, code="context_length_exceeded")
    return ids


def _constraint(state: ServerState, req: Any) -> Optional[Constraint]:
    """``response_format`` compiled for the target (runs in a worker thread: a schema can take a while)."""
    try:
        constraint = constraint_from_response_format(state.scheduler.target, req.response_format)
    except ConfigError as e:
        raise ApiError(400, str(e) if str(e).startswith("response_format") else f"response_format: {e}",
                       param="response_format", code="invalid_value") from e
    except (ValueError, TypeError, OverflowError, RecursionError) as e:  # the compiler's own words stay in the log
        log.info("response_format refused by the grammar compiler: %s", e)
        raise ApiError(400, "response_format: the JSON schema could not be compiled; send a valid JSON schema "
                            "object of plain Unicode text", param="response_format", code="invalid_value") from e
    if constraint is not None and req.ignore_eos:
        raise ApiError(400, "ignore_eos cannot be combined with response_format: the format ends the output with "
                            "the end-of-sequence token; drop ignore_eos", param="ignore_eos", code="invalid_value")
    return constraint


def _build_specs(state: ServerState, req: Any, ids: list[int], max_tokens: Optional[int],
                 default_max: Optional[int], prompt_param: str, constraint: Optional[Constraint],
                 logprobs: Optional[int]) -> list[DecodeRequest]:
    """The core requests for ``req``: one per choice (``n``); choice i's seed is seed + i (choices.py)."""
    n = req.n or 1
    if n > state.scheduler.max_batch_size:
        raise ApiError(400, f"n={n} choices need {n} batch rows but this server runs at most "
                            f"{state.scheduler.max_batch_size}; ask for fewer", param="n", code="invalid_value")
    try:
        bias = parse_logit_bias(req.logit_bias, state.scheduler.target.vocab_size)
    except ConfigError as e:
        raise ApiError(400, f"logit_bias: {e}" if not str(e).startswith("logit_bias") else str(e),
                       param="logit_bias", code="invalid_value") from e
    except (ValueError, TypeError, OverflowError) as e:  # e.g. an integer too large for a float
        raise ApiError(400, "logit_bias values must be numbers in [-100, 100]", param="logit_bias",
                       code="invalid_value") from e
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
        verify = VerifyConfig(chain_rule=req.chain_rule or VerifyConfig.chain_rule,
                              accept_rule=req.accept_rule or VerifyConfig.accept_rule)
    except ConfigError as e:
        raise ApiError(400, str(e), code="invalid_value") from e
    return [DecodeRequest(ids, dataclasses.replace(sampling, seed=choice_seed(req.seed, i)), generation,
                          None if drafter == "none" else drafter, gamma=req.gamma or state.default_gamma,
                          adaptive=state.config.speculation == "auto", verify=verify, constraint=constraint,
                          logit_bias=bias, logprobs=logprobs) for i in range(n)]


def _submit(state: ServerState, specs: list[DecodeRequest]) -> ChoiceGroup:
    """Queue every choice's row, or none of them (a refusal cancels the ones already queued)."""
    loop = asyncio.get_running_loop()
    group = ChoiceGroup([RequestHandle(spec, loop, state.config.request_timeout) for spec in specs])
    try:
        for h in group.handles:
            state.scheduler.submit(h)
    except QueueFullError as e:
        group.cancel()
        state.metrics.observe_refused("queue_full")
        raise ApiError(429, str(e), "rate_limit_error", code="queue_full", retry_after=RETRY_AFTER_BUSY_S) from e
    except SchedulerClosedError as e:
        group.cancel()
        state.metrics.observe_refused("shutting_down")
        raise ApiError(503, str(e), "server_error", code="shutting_down", retry_after=RETRY_AFTER_DRAIN_S) from e
    except ValueError as e:
        group.cancel()
        raise ApiError(400, str(e), param="drafter", code="invalid_value") from e
    return group


def _usage(fin: FinishEvent) -> dict[str, Any]:
    return _usage_all([fin])


def _usage_all(fins: list[FinishEvent]) -> dict[str, Any]:
    """One prompt (counted once, as OpenAI does), the choices' completions and passes summed."""
    st = [f.stats for f in fins]

    def per_drafter(field: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in st:
            for name, n in getattr(s, field).items():
                out[name] = out.get(name, 0) + n
        return out

    return usage(st[0].prompt_tokens, sum(len(f.token_ids) for f in fins), sum(s.target_passes for s in st),
                 sum(s.drafted for s in st), sum(s.accepted for s in st), per_drafter("drafted_by"),
                 per_drafter("accepted_by"))


def _summary(fin: FinishEvent, from_draft: list[bool]) -> dict[str, Any]:
    s = fin.stats
    return {"from_draft": from_draft, "alpha": s.alpha, "tau": s.tau, "tokens_per_s": s.tokens_per_s,
            "decode_tokens_per_s": s.decode_tokens_per_s}


def _summaries(results: list["_Choice"]) -> dict[str, Any]:
    """Choice 0's summary at the top level (the web page reads it); with n > 1 every choice's in ``choices``."""
    out = _summary(results[0].fin, results[0].flags)
    if len(results) > 1:
        out["choices"] = [_summary(r.fin, r.flags) for r in results]
    return out


def _failure_error(f: Failure) -> ApiError:
    if f.kind == "timeout":
        return ApiError(504, f.message, "timeout_error", code="request_timeout")
    if f.kind == "shutdown":
        return ApiError(503, f.message, "server_error", code="shutting_down", retry_after=RETRY_AFTER_DRAIN_S)
    return ApiError(500, f.message, "server_error", code="internal_error")


@dataclass
class _Choice:
    fin: FinishEvent
    flags: list[bool]
    logprobs: list[dict[str, Any]]  # formatted per step event


LogprobFormat = Callable[[int, StepEvent], Optional[dict[str, Any]]]


async def _collect(group: ChoiceGroup, request: Request, lp: LogprobFormat) -> list[_Choice]:
    """Wait for every choice of a non-streaming request, cancelling them all if the client goes away."""
    n = len(group.handles)
    flags: list[list[bool]] = [[] for _ in range(n)]
    lps: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    fins: dict[int, FinishEvent] = {}
    tokens = 0
    next_check = time.monotonic() + 0.25
    try:
        while len(fins) < n:
            got = await group.next_event(0.25)
            if time.monotonic() >= next_check:  # events may never pause, so check on a clock
                next_check = time.monotonic() + 0.25
                if await request.is_disconnected():
                    raise ClientGone(f"request {group.handles[0].id} cancelled after {tokens} tokens")
            if got is None:
                continue
            i, ev = got
            if isinstance(ev, StepEvent):
                flags[i].extend(ev.from_draft)
                tokens += len(ev.token_ids)
                formatted = lp(i, ev)
                if formatted is not None:
                    lps[i].append(formatted)
            elif isinstance(ev, FinishEvent):
                fins[i] = ev
                group.close(i)
            else:
                raise _failure_error(ev)
        return [_Choice(fins[i], flags[i], lps[i]) for i in range(n)]
    except BaseException:
        group.cancel()
        raise


ChunkFn = Callable[[int, str, Optional[str], Optional[dict[str, Any]], Optional[dict[str, Any]]], dict[str, Any]]


def _sse(group: ChoiceGroup, chunk: ChunkFn, lp: LogprobFormat, first: Optional[list[dict[str, Any]]],
         include_usage: bool, rid: str, created: int, model: str, obj: str,
         token_text: Callable[[int], str]) -> StreamingResponse:
    """Server-sent events: one chunk per target pass and choice (``index``), carrying per-token origin in
    ``specdecode`` (and, for a drafted chain, the first proposal the target rejected: the page's per-pass card)."""

    def line(payload: Any) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    async def events() -> AsyncIterator[bytes]:
        done = False
        n = len(group.handles)
        fins: dict[int, FinishEvent] = {}
        sent = 0
        try:
            for c in first or []:
                yield line(c)
            while True:
                got = await group.next_event(1.0)
                if got is None:
                    continue
                i, ev = got
                if isinstance(ev, StepEvent):
                    from_draft = ev.from_draft + [False] * (len(ev.pieces) - len(ev.from_draft))
                    sent += len(ev.token_ids)
                    n_acc = sum(ev.from_draft)
                    rejected = (token_text(ev.proposed[n_acc]) if ev.proposed is not None and n_acc < len(ev.proposed)
                                and len(ev.token_ids) == n_acc + 1 else None)
                    yield line(chunk(i, ev.text, None, {"pieces": ev.pieces, "from_draft": from_draft,
                                                        "token_ids": ev.token_ids,
                                                        "drafted": ev.drafted, "rejected": rejected}, lp(i, ev)))
                elif isinstance(ev, FinishEvent):
                    fins[i] = ev
                    group.close(i)
                    yield line(chunk(i, "", ev.reason, {**_summary(ev, []), "usage": _usage(ev)}, None))
                    if len(fins) < n:
                        continue
                    if include_usage:
                        yield line({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                                    "usage": _usage_all([fins[k] for k in range(n)])})
                    done = True
                    yield b"data: [DONE]\n\n"
                    return
                else:
                    e = _failure_error(ev)
                    done = True
                    group.cancel()
                    yield line(error_body(e.message, e.type, e.param, e.code))
                    yield b"data: [DONE]\n\n"
                    return
        finally:
            if not done:  # the client went away: free the rows now
                group.cancel()
                log.info("client disconnected from stream %d after %d tokens; cancelled", group.handles[0].id, sent)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def make_state(target: "Model", draft_model: Optional["Model"], config: ServerConfig, default_drafter: str = "model",
               default_gamma: int = 4, ngram_max: int = 3, ngram_min: int = 1,
               model_name: Optional[str] = None, draft_vocab: "VocabSpec" = "auto",
               exit_layer: Optional[int] = None, skip_layers: Optional[tuple[int, ...]] = None,
               heads: Optional[str] = None, eagle: Optional[str] = None) -> ServerState:
    """Everything the app needs, from loaded models and the serving flags: every registered drafter
    that can run with what is loaded (a draft model's only when one is given)."""
    from dataclasses import replace

    from ..drafters.crosstok import shares_vocabulary
    from ..drafters.registry import REGISTRY, DrafterOptions, get_spec

    options = DrafterOptions(draft=draft_model, gamma="auto", vocab=draft_vocab, ngram_max=ngram_max,
                             ngram_min=ngram_min, exit_layer=exit_layer, skip_layers=skip_layers, heads=heads,
                             eagle=eagle)
    if get_spec(default_drafter).needs_draft_model and draft_model is None:
        raise ConfigError(f"default drafter {default_drafter!r} needs a draft model; pass one or choose one of: "
                          f"{', '.join(n for n, sp in REGISTRY.items() if not sp.needs_draft_model)}")
    if get_spec(default_drafter).needs_eagle and eagle is None:
        raise ConfigError(f"default drafter {default_drafter!r} needs an EAGLE-3 draft (--heads DIR); train one with "
                          "`specdecode distill --method eagle --target TARGET --out DIR`")
    if get_spec(default_drafter).needs_heads and heads is None:
        raise ConfigError(f"default drafter {default_drafter!r} needs Medusa heads (--heads DIR); train them with "
                          "`specdecode distill --method medusa --target TARGET --out DIR`")
    # a draft with another tokenizer serves only the drafters that re-tokenize (crosstok); the rest run without it
    other_vocab = draft_model is not None and not shares_vocabulary(draft_model, target)
    if other_vocab and get_spec(default_drafter).needs_draft_model and not get_spec(default_drafter).own_tokenizer:
        raise ConfigError(f"the draft {draft_model.path} has another tokenizer than the target, so default drafter "
                          f"{default_drafter!r} cannot use it; serve it with --drafter crosstok")
    drafters = {}
    for name, spec in REGISTRY.items():
        opts = replace(options, draft=None) if other_vocab and not spec.own_tokenizer else options
        if spec.needs_draft_model and opts.draft is None:
            continue
        built = spec.build(opts)
        if built is not None:
            drafters[name] = built
    metrics = ServerMetrics()
    scheduler = Scheduler(target, drafters, max_batch_size=config.max_batch_size, max_queue=config.max_queue,
                          max_context=config.max_context, metrics=metrics,
                          prepare=[default_drafter] if default_drafter in drafters else [])
    chat = ChatFormatter.for_model(target.path)
    return ServerState(scheduler, metrics, config, model_name or target.name, chat, chat.source != PLAIN_TEMPLATE,
                       default_drafter, default_gamma, now(), _max_token_chars(target))


def _token_text(state: ServerState, token: int) -> str:
    """One token's text for display (a lone byte of a multi-byte character shows as U+FFFD)."""
    try:
        return state.scheduler.target.decode([token])
    except (ValueError, TypeError, OverflowError):
        return ""


def _token_bytes_fn(state: ServerState) -> Callable[[int], Optional[bytes]]:
    """A token's raw bytes from llguidance's view of the tokenizer (built once per model; runs in a
    worker thread); a function giving None when that is not available (no tokenizer.json or extra)."""
    from ..constraints import grammar_tokenizer

    try:
        tok = grammar_tokenizer(state.scheduler.target)
    except (ConfigError, ImportError, ValueError):
        return lambda t: None

    def raw(t: int) -> Optional[bytes]:
        try:
            return bytes(tok.decode_bytes([t]))
        except (ValueError, TypeError, OverflowError):
            return None

    return raw


def _max_token_chars(target: "Model") -> int:
    """Characters in the longest vocabulary entry (0 without a tokenizer): bounds tokens from below by length."""
    tok = target.tokenizer
    if tok is None:
        return 0
    return max((len(t) for t in tok.get_vocab(with_added_tokens=True)), default=0)
