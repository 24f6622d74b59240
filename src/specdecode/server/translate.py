"""OpenAI requests -> core requests, and core results -> OpenAI's usage and errors.

Every user error becomes an ``ApiError``: a 4xx with OpenAI's error body that names the
field and the fix, so the official clients raise their typed exceptions (BadRequestError,
AuthenticationError, RateLimitError) with our message. Costly steps (JSON parsing of big
bodies, tokenising, compiling a response format) run in worker threads, after cheap bounds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from typing import Any, Callable, Optional, Union

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from ..cache import ContextLengthError
from ..chat import ChatTemplateError
from ..config import ConfigError, GenerationConfig, SamplingConfig, VerifyConfig
from ..constraints import Constraint, constraint_from_response_format, grammar_tokenizer, parse_logit_bias
from ..rows import FinishEvent
from ..text import prompt_ids
from .choices import Choice, ChoiceGroup, choice_seed
from .guard import ECHO_CHARS, BadBody, check_content_type, check_item_count, parse_json_object, shown
from .protocol import NOT_HONOURED, NOT_SUPPORTED_YET, error_body, refused_parameter, usage
from .scheduler import Failure, QueueFullError, RequestHandle, SchedulerClosedError
from .scheduler import Request as DecodeRequest
from .state import ServerState

log = logging.getLogger("specdecode.server")

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
RETRY_AFTER_BUSY_S = 1  # 429: a row frees up as soon as any request ends
RETRY_AFTER_DRAIN_S = 5  # 503: this process is going away; a restarted one needs a few seconds
PARSE_IN_THREAD_BYTES = 64 * 1024  # bigger bodies are decoded and validated off the event loop
# JSON items a body may hold: a message is ~4 (an element and its members), a token id 1, and a
# response_format schema, logit_bias and the rest fit in the base
ITEMS_BASE, ITEMS_PER_TOKEN = 65536, 8
# a response_format this big already takes seconds to compile, and llguidance's parser fails on some
# (1000 object properties) mid-decode; OpenAI's own limits are 5000 properties and 1000 enum values
MAX_SCHEMA_ITEMS = 4096


MAX_MESSAGE_CHARS = 2000  # a net under the per-value cut (guard.shown): no message quotes a body back whole


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None, retry_after: Optional[int] = None) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + "..."
        if param is not None and len(param) > 4 * ECHO_CHARS:
            param = param[:4 * ECHO_CHARS] + "..."
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.retry_after = retry_after

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return JSONResponse(error_body(self.message, self.type, self.param, self.code), status_code=self.status,
                            headers=headers)


class ClientGone(Exception):
    """The client disconnected before its (non-streaming) answer was ready."""


_TYPE_TAG = re.compile(r"^(str|int|float|bool|list|dict|none|literal|function-\w+|[A-Z]\w*)(\[.*\])?$")


def validation_error(errors: Any) -> ApiError:
    """The first problem pydantic found, as a 400 naming the field (union member tags dropped)."""
    errs = list(errors) or [{"loc": (), "msg": "invalid request"}]
    err = errs[0]
    if err.get("type") == "json_invalid":
        return ApiError(400, f"request body is not valid JSON: {err.get('msg')}", code="invalid_json")
    if err.get("type") == "extra_forbidden":  # OpenAI's wording for a field it does not know
        field = ".".join(str(p)[:ECHO_CHARS] for p in err.get("loc", ()) if p != "body")
        return ApiError(400, f"{field}: unrecognized request argument supplied", param=field,
                        code="unknown_parameter")
    loc = [str(p)[:ECHO_CHARS] for p in err.get("loc", ())
           if p != "body" and not (isinstance(p, str) and _TYPE_TAG.match(p))]
    param = ".".join(loc) or None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if len(errs) > 1 and param == "prompt":
        msg = "must be a string, a list with one string, or a list of token ids"
    return ApiError(400, f"{param}: {msg}" if param else msg, param=param, code="invalid_value")


def validate_body(raw: bytes, cls: type[BaseModel], context_len: int) -> Any:
    """Bytes -> request model, or an ApiError naming the field (guard.py refuses what JSON alone allows).

    The costly steps come after cheap bounds from the context window: a body of more JSON items than
    any request to this model needs is refused before parsing, a prompt or a conversation longer than
    the window before validation (pydantic holds the GIL while it walks a list)."""
    try:
        check_item_count(raw, ITEMS_BASE + ITEMS_PER_TOKEN * context_len,
                         f"a request to this model needs far fewer (its context window is {context_len} tokens); "
                         "shorten the prompt or send fewer messages")
        obj = parse_json_object(raw)
    except BadBody as e:
        raise ApiError(e.status, e.message, param=e.param, code=e.code) from e
    check_lengths(obj, context_len)
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
        raise validation_error(e.errors()) from e
    except (RecursionError, OverflowError) as e:  # belt and braces: never a 500 for a body
        raise ApiError(400, "request body could not be read as a request", code="invalid_value") from e


def check_lengths(obj: dict[str, Any], context_len: int) -> None:
    """Token ids or messages that cannot fit the context window, refused before they are validated."""
    prompt, messages = obj.get("prompt"), obj.get("messages")
    if isinstance(prompt, list) and len(prompt) >= context_len and type(prompt[0]) is int:
        raise ApiError(400, f"the prompt has {len(prompt)} tokens but this model's context window is {context_len} "
                            "tokens; shorten it so at least one token can be generated",
                       param="prompt", code="context_length_exceeded")
    if isinstance(messages, list) and len(messages) >= context_len:
        raise ApiError(400, f"messages: {len(messages)} messages cannot fit this model's context window of "
                            f"{context_len} tokens (each takes at least one token); send fewer",
                       param="messages", code="context_length_exceeded")


async def parse_request(state: ServerState, request: Request, cls: type[BaseModel]) -> Any:
    try:
        check_content_type(request.headers.get("content-type"))
    except BadBody as e:
        raise ApiError(e.status, e.message, code=e.code) from e
    raw = await request.body()  # BodyLimit has already refused bodies over the limit
    ctx = state.scheduler.context_len
    if len(raw) > PARSE_IN_THREAD_BYTES:
        return await asyncio.to_thread(validate_body, raw, cls, ctx)
    return validate_body(raw, cls, ctx)


def check_model(state: ServerState, name: str) -> None:
    if name not in state.model_names:
        raise ApiError(400, f"model {shown(name)} is not served here; this server serves "
                            f"{' or '.join(map(repr, state.model_names))} (see GET /v1/models)", param="model",
                       code="model_not_found")


def render_and_tokenize(state: ServerState, messages: list[dict[str, str]]) -> list[int]:
    """Chat template, then tokens (runs in a worker thread: both can take a while on a long chat)."""
    try:
        text = state.chat.render(messages)
    except ChatTemplateError as e:
        raise ApiError(400, str(e), param="messages") from e
    except RecursionError as e:
        raise ApiError(400, "the chat template could not render these messages", param="messages") from e
    return tokenize_prompt(state, text, "messages", not state.chat_has_model_template)


def tokenize_prompt(state: ServerState, prompt: Union[str, list[int]], param: str,
                    add_special_tokens: bool) -> list[int]:
    """Prompt -> ids, refusing a prompt that cannot fit before spending time on it (runs in a worker thread)."""
    target = state.scheduler.target
    ctx = state.scheduler.context_len
    what = "the prompt" if param == "prompt" else f"the conversation in {param}"  # a subject that takes "has"
    # no token is longer than max_token_chars, so this many characters need at least ctx tokens
    if isinstance(prompt, str) and state.max_token_chars and len(prompt) >= ctx * state.max_token_chars:
        at_least = len(prompt) // state.max_token_chars
        raise ApiError(400, f"{what} has {len(prompt)} characters, at least {at_least} "
                            f"tokens, more than this model's context window of {ctx} tokens; shorten it",
                       param=param, code="context_length_exceeded")
    if isinstance(prompt, list) and len(prompt) >= ctx:
        raise ApiError(400, f"{what} has {len(prompt)} tokens but this model's context window is {ctx} "
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
        raise ApiError(400, f"{what} could not be tokenised; send plain Unicode text", param=param,
                       code="invalid_value") from e
    if not ids:
        raise ApiError(400, f"{what} is empty; give at least one token of text", param=param, code="invalid_value")
    if len(ids) >= ctx:
        raise ApiError(400, f"{what} has {len(ids)} tokens but this model's maximum context length is {ctx} "
                            "tokens; shorten it so at least one token can be generated",
                       param=param, code="context_length_exceeded")
    return ids


def compile_constraint(state: ServerState, req: Any) -> Optional[Constraint]:
    """``response_format`` compiled for the target (runs in a worker thread: a schema can take a while;
    compiling, and the grammar's masks while decoding, grow with its size, hence the bound first)."""
    if req.response_format is not None and count_items(req.response_format, MAX_SCHEMA_ITEMS) > MAX_SCHEMA_ITEMS:
        raise ApiError(400, f"response_format: the schema holds more than {MAX_SCHEMA_ITEMS} items (object members, "
                            "array elements, enum values); this server compiles schemas up to that size; simplify it",
                       param="response_format", code="invalid_value")
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


def count_items(obj: Any, limit: int) -> int:
    """Object members and array elements in a parsed JSON value, counted until past ``limit``."""
    n, stack = 0, [obj]
    while stack and n <= limit:
        node = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            n += 1
            if isinstance(child, (dict, list)):
                stack.append(child)
    return n


def build_specs(state: ServerState, req: Any, ids: list[int], max_tokens: Optional[int],
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
                          adaptive=state.config.speculation == "auto" and req.gamma is None,  # a client's γ is honoured
                          verify=verify, constraint=constraint,
                          logit_bias=bias, logprobs=logprobs) for i in range(n)]


def submit_choices(state: ServerState, specs: list[DecodeRequest]) -> ChoiceGroup:
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


def usage_one(fin: FinishEvent) -> dict[str, Any]:
    return usage_all([fin])


def usage_all(fins: list[FinishEvent]) -> dict[str, Any]:
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
                 per_drafter("accepted_by"), chooser=next((s.chooser for s in st if s.chooser is not None), None))


def summary(fin: FinishEvent, from_draft: list[bool]) -> dict[str, Any]:
    s = fin.stats
    return {"from_draft": from_draft, "alpha": s.alpha, "tau": s.tau, "tokens_per_s": s.tokens_per_s,
            "decode_tokens_per_s": s.decode_tokens_per_s}


def summaries(results: list[Choice]) -> dict[str, Any]:
    """Choice 0's summary at the top level (the web page reads it); with n > 1 every choice's in ``choices``."""
    out = summary(results[0].fin, results[0].flags)
    if len(results) > 1:
        out["choices"] = [summary(r.fin, r.flags) for r in results]
    return out


def failure_error(f: Failure) -> ApiError:
    if f.kind == "timeout":
        return ApiError(504, f.message, "timeout_error", code="request_timeout")
    if f.kind == "shutdown":
        return ApiError(503, f.message, "server_error", code="shutting_down", retry_after=RETRY_AFTER_DRAIN_S)
    if f.kind == "constraint":  # the grammar engine gave up on this request's response_format partway
        return ApiError(400, f"response_format: {f.message}", param="response_format", code="invalid_value")
    return ApiError(500, f.message, "server_error", code="internal_error")


def token_text(state: ServerState, token: int) -> str:
    """One token's text for display (a lone byte of a multi-byte character shows as U+FFFD)."""
    try:
        return state.scheduler.target.decode([token])
    except (ValueError, TypeError, OverflowError):
        return ""


def token_bytes_fn(state: ServerState) -> Callable[[int], Optional[bytes]]:
    """A token's raw bytes from llguidance's view of the tokenizer (built once per model; runs in a
    worker thread); a function giving None when that is not available (no tokenizer.json or extra)."""
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

