"""FastAPI app: OpenAI-compatible endpoints, SSE streaming, /metrics, /health and the web page.

The routes only check who may ask, then hand over: translate.py turns OpenAI requests into
core requests (and every user error into a 4xx naming the field), relay.py turns the core's
events into answers and server-sent events, state.py builds what is served. Decoding happens
on the scheduler's thread.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import math
from contextlib import asynccontextmanager
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, AsyncIterator, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..rows import StepEvent
from .choices import chat_logprobs, completion_logprobs, merge_completion_logprobs
from .guard import BodyLimit, SecurityHeaders, shown
from .hosts import HostCheck
from .protocol import ChatCompletionRequest, CompletionRequest, chat_chunk, completion_chunk, error_body, new_id, now
from .relay import collect, json_answer, sse_response
from .state import ServerState, make_state
from .translate import (COMPLETIONS_DEFAULT_MAX_TOKENS, RETRY_AFTER_DRAIN_S, ApiError, ClientGone, build_specs,
                        check_model, compile_constraint, parse_request, render_and_tokenize, submit_choices,
                        summaries, token_bytes_fn, token_text, tokenize_prompt, usage_all, validation_error)

__all__ = ["ServerState", "create_app", "make_state"]

log = logging.getLogger("specdecode.server")


STATIC_DIR = Path(__file__).parent / "static"


def finite(obj: Any) -> Any:
    """``obj`` with NaN and infinities as None: strict JSON, which a health check must never fail to write."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def kernel_status() -> dict[str, Any]:
    """Whether every compiled kernel this process asked for runs; the names of those that do not, each with
    a reason name ("build_failed", "no_avx2", "disabled"): the details, which name local paths, stay in the
    log, as /health needs no key."""
    from ..kernels.build import extension_reasons

    reasons = extension_reasons()
    return {"fast_path": not reasons, "failed": sorted(reasons), "reasons": dict(sorted(reasons.items()))}


def create_app(state: ServerState) -> FastAPI:
    """Build the app; the scheduler thread starts and stops with the app's lifespan."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # the loaded model, tokenizer and drafters live as long as the server: out of the cyclic collector's
        # reach, a full collection (which an answer's ~10^5 logprob dicts trigger) no longer walks them all and
        # holds every thread, the event loop's included, for 130-160 ms on SmolLM2 (no collection first: in a
        # test process that serves many times it costs ~0.3 s a start, and startup leaves little cyclic garbage)
        gc.freeze()
        state.scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.scheduler.stop, state.config.drain_timeout)
            gc.unfreeze()  # a process that serves again (tests) can collect this server's objects

    app = FastAPI(title="specdecode", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json" if state.config.openapi else None)
    app.state.specdecode = state
    app.add_middleware(BodyLimit, limit=state.config.max_body_bytes)
    if state.config.api_key is None:  # a foreign Host is refused before anything else runs
        app.add_middleware(HostCheck, bound_host=state.config.host, allowed=state.config.allowed_hosts)
    app.add_middleware(SecurityHeaders)  # outermost: on every answer, refusals included

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(ClientGone)
    async def _gone(_: Request, e: ClientGone) -> Response:
        log.info("client disconnected before its answer: %s", e)
        return Response(status_code=499)  # nobody reads it; nginx's code for "client closed request"

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        return validation_error(e.errors()).response()

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
    async def health() -> JSONResponse:
        """200 while serving ("warming" while a drafter is being prepared, its costs measured: ``preparing``
        names it, and requests queue or run meanwhile); 503 "draining" once SIGTERM came, so a load balancer
        stops sending. ``kernels.fast_path`` is false when a compiled kernel is off (failed, no AVX2, switched
        off) and eager PyTorch runs instead (about half the speed). ``chat_template``: whether the model has its
        own (else chat messages are rendered as plain lines); ``speculation_mode``: what a request without
        ``gamma`` gets, "adaptive" (0..``default_cap`` per step) or "fixed" (``default_cap`` every step)."""
        s = state.scheduler
        preparing = s.preparing
        status = "draining" if s.draining else "warming" if preparing is not None else "ok"
        body = {"status": status, "preparing": preparing, "model": state.model_name,
                "active_rows": s.active_rows, "queue_depth": s.queue_depth, "max_batch_size": s.max_batch_size,
                "forward_passes": s.forward_passes, "drafters": sorted(s.drafters),
                "default_drafter": state.default_drafter, "default_gamma": state.default_gamma,
                "default_cap": state.default_cap, "speculation_mode": state.speculation_mode,
                "chat_template": state.chat_has_model_template,
                "context_length": s.context_len, "speculation": finite(s.policy.snapshot()), "kernels": kernel_status()}
        if s.draining:
            return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_DRAIN_S)})
        return JSONResponse(body)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def model_card(name: str) -> dict[str, Any]:
        """OpenAI's model object, plus whether chat requests get the model's own template."""
        return {"id": name, "object": "model", "created": state.created, "owned_by": "specdecode",
                "chat_template": state.chat_has_model_template}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        """Every name a request's ``model`` may give, the served name first (one model behind them all)."""
        check_auth(request)
        return {"object": "list", "data": [model_card(n) for n in state.model_names]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        check_auth(request)
        if model_id not in state.model_names:
            raise ApiError(404, f"model {shown(model_id)} is not served here; this server serves "
                                f"{' or '.join(map(repr, state.model_names))}", "not_found_error", param="model",
                           code="model_not_found")
        return model_card(model_id)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Union[Response, StreamingResponse]:
        check_auth(request)
        req = await parse_request(state, request, CompletionRequest)
        check_model(state, req.model)
        prompt: Union[str, list[int]]
        prompt = req.prompt[0] if req.prompt and isinstance(req.prompt, list) and isinstance(req.prompt[0], str) \
            else req.prompt
        ids = await asyncio.to_thread(tokenize_prompt, state, prompt, "prompt", True)
        constraint = await asyncio.to_thread(compile_constraint, state, req)
        specs = build_specs(state, req, ids, req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS, "prompt", constraint,
                             req.logprobs)
        group = submit_choices(state, specs)
        rid, created = new_id("cmpl"), now()
        text_of = lru_cache(maxsize=None)(partial(token_text, state))  # top_logprobs repeat tokens a lot
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
            return sse_response(group, chunk, lp, None, bool(opts and opts.include_usage), rid, created,
                                state.model_name, "text_completion", text_of)
        results = await collect(group, request, lp)
        body = chunk(0, "", None, None)
        body["choices"] = [chunk(i, r.fin.text, r.fin.reason, None,
                                 merge_completion_logprobs(r.logprobs) if req.logprobs is not None else None
                                 )["choices"][0] for i, r in enumerate(results)]
        body["usage"] = usage_all([r.fin for r in results])
        body["specdecode"] = summaries(results)
        return await json_answer(body)  # in slices: with logprobs it is megabytes

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Union[Response, StreamingResponse]:
        check_auth(request)
        req = await parse_request(state, request, ChatCompletionRequest)
        check_model(state, req.model)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        ids = await asyncio.to_thread(render_and_tokenize, state, messages)
        if req.top_logprobs and not req.logprobs:
            raise ApiError(400, "top_logprobs: needs logprobs: true (top_logprobs counts the alternatives reported "
                                "beside each token's logprob)", param="top_logprobs", code="invalid_value")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        constraint = await asyncio.to_thread(compile_constraint, state, req)
        specs = build_specs(state, req, ids, max_tokens, None, "messages", constraint,
                             (req.top_logprobs or 0) if req.logprobs else None)
        group = submit_choices(state, specs)
        rid, created = new_id("chatcmpl"), now()
        text_of = lru_cache(maxsize=None)(partial(token_text, state))  # top_logprobs repeat tokens a lot
        bytes_of = lru_cache(maxsize=None)(await asyncio.to_thread(token_bytes_fn, state)) if req.logprobs \
            else (lambda t: None)

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
            return sse_response(group, chunk, lp, first, bool(opts and opts.include_usage), rid, created,
                                state.model_name, "chat.completion.chunk", text_of)
        results = await collect(group, request, lp)
        body = {
            "id": rid, "object": "chat.completion", "created": created, "model": state.model_name,
            "choices": [{"index": i, "message": {"role": "assistant", "content": r.fin.text},
                         "logprobs": ({"content": [c for p in r.logprobs for c in p["content"]]} if req.logprobs
                                      else None),
                         "finish_reason": r.fin.reason} for i, r in enumerate(results)],
            "usage": usage_all([r.fin for r in results]), "specdecode": summaries(results),
        }
        return await json_answer(body)  # in slices: with logprobs it is megabytes

    return app

