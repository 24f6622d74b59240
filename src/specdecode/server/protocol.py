"""OpenAI-compatible request and response shapes (the subset we honour), plus our extensions.

Requests are validated strictly: a wrong type is a 400 that names the field,
never a silent coercion, and an unknown field is refused (a typo such as
``max_token`` must not be ignored silently). Parameters we do not honour are
refused by name from two tables: ``NOT_SUPPORTED_YET`` (features the core may
gain: delete an entry and add the field to the model once it is honoured; empty
now that ``n``, ``logprobs``/``top_logprobs``, ``logit_bias`` and
``response_format`` are honoured, see choices.py and app.py) and
``NOT_HONOURED`` (tools, penalties: never, they would break exact speculation).
Extensions a stock OpenAI client never sends: ``drafter``, ``gamma``,
``chain_rule``, ``accept_rule``, ``top_k``, ``min_p``, ``ignore_eos`` in requests, and a top-level
``specdecode`` object in responses (per-token origin for the web page, α̂, τ).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..config import ACCEPT_RULES, CHAIN_RULES
from ..drafters.registry import REGISTRY
from ..logprobs import MAX_TOP_LOGPROBS
from .guard import shown

INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts
INT32_MAX = 2**31 - 1
MAX_N = 8  # choices per request (each one a batch row); more would crowd out other clients

# field -> (values that mean "off", why it is refused otherwise). A value is "off" only when it has
# the same type as one listed (so n=true is not n=1).
NOT_SUPPORTED_YET: dict[str, tuple[tuple[Any, ...], str]] = {}  # n, logprobs, logit_bias, response_format: honoured
NOT_HONOURED: dict[str, tuple[tuple[Any, ...], str]] = {
    "tools": ((None, []), "tools (function calling) are not supported by this server"),
    "tool_choice": ((None, "none"), "tool_choice is not supported: this server does no function calling"),
    "functions": ((None, []), "functions (function calling) are not supported by this server"),
    "function_call": ((None, "none"), "function_call is not supported: this server does no function calling"),
    "presence_penalty": ((None, 0, 0.0), "presence penalties are not supported (they would break exact speculation)"),
    "frequency_penalty": ((None, 0, 0.0),
                          "frequency penalties are not supported (they would break exact speculation)"),
    "echo": ((None, False), "echo is not supported"),
    "suffix": ((None, ""), "suffix (insertion) is not supported"),
    "best_of": ((None, 1), "only best_of=1 is supported"),
    "audio": ((None,), "audio output is not supported"),
    "modalities": ((None, ["text"]), "only the text modality is supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "reasoning_effort": ((None,), "reasoning_effort is not supported"),
    "web_search_options": ((None,), "web search is not supported"),
}


def _is_off(value: Any, offs: tuple[Any, ...]) -> bool:
    return any(value is None if o is None else (type(value) is type(o) and value == o) for o in offs)


def refused_parameter(body: dict[str, Any]) -> Optional[tuple[str, str]]:
    """The first parameter this server refuses, as (field, message); None if every one is honoured."""
    for table in (NOT_SUPPORTED_YET, NOT_HONOURED):
        for name, (offs, why) in table.items():
            if name in body and not _is_off(body[name], offs):
                return name, why
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingParams(_Strict):
    """Fields shared by completions and chat completions (neutral values of the refused ones pass)."""

    model: str
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=1, le=INT32_MAX)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = Field(default=None, ge=INT64_MIN, le=UINT64_MAX)
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    # accepted and ignored: they change nothing about the output
    user: Optional[str] = None
    metadata: Optional[dict[str, str]] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None
    parallel_tool_calls: Optional[bool] = None
    # honoured: n choices as batch rows (choice i's seed is seed + i), a logit bias and a response
    # format (checked against the vocabulary / compiled in app.py, which names the field on a 400)
    n: Optional[int] = Field(default=None, ge=1, le=MAX_N)
    logit_bias: Optional[dict[str, Any]] = None
    response_format: Optional[dict[str, Any]] = None
    # refused unless neutral (NOT_HONOURED); declared so the neutral value passes
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    # extensions
    drafter: Optional[str] = None  # a registered drafter's name (drafters/registry.py)
    gamma: Optional[int] = Field(default=None, ge=1, le=32)
    chain_rule: Optional[str] = None  # sampled chain verification: block (default) or token (config.VerifyConfig)
    accept_rule: Optional[str] = None  # auto (coupled when seeded), coupled or rejection (config.VerifyConfig)
    ignore_eos: Optional[bool] = False

    @field_validator("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _int_is_a_float(cls, v: Any) -> Any:
        return float(v) if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**53 else v

    @field_validator("drafter")
    @classmethod
    def _known_drafter(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in REGISTRY:
            raise ValueError(f"unknown drafter {shown(v)}; use one of: {', '.join(REGISTRY)}")
        return v

    @field_validator("chain_rule")
    @classmethod
    def _known_chain_rule(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in CHAIN_RULES:
            raise ValueError(f"unknown chain_rule {shown(v)}; use one of: {', '.join(CHAIN_RULES)} (default: block)")
        return v

    @field_validator("accept_rule")
    @classmethod
    def _known_accept_rule(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in ACCEPT_RULES:
            raise ValueError(f"unknown accept_rule {shown(v)}; use one of: {', '.join(ACCEPT_RULES)} (default: auto, "
                             "the seed-reproducible coupled rule for seeded requests)")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Optional[Union[str, list[str]]]) -> Optional[Union[str, list[str]]]:
        items = [v] if isinstance(v, str) else (v or [])
        if len(items) > 16 or any(not s for s in items):
            raise ValueError("stop must be a non-empty string or a list of at most 16 non-empty strings")
        return v

    def stop_list(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class CompletionRequest(_SamplingParams):
    prompt: Union[str, list[str], list[int]]
    echo: Optional[bool] = False
    logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # top alternatives per token
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    @model_validator(mode="after")
    def _supported(self) -> "CompletionRequest":
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise ValueError("batched prompts are not supported: send one prompt string per request")
        return self


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    # History from other clients carries fields such as "refusal": null or "tool_call_id"; they do
    # not change the rendered prompt, so unknown keys inside a message are ignored.
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingParams):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Any] = None
    functions: Optional[list[Any]] = None
    function_call: Optional[Any] = None
    modalities: Optional[list[str]] = None


# -- responses -------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def error_body(message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict[str, Any]:
    """OpenAI's error shape, which its clients turn into typed exceptions."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int, target_passes: int, drafted: int, accepted: int,
          drafted_by: Optional[dict[str, int]] = None, accepted_by: Optional[dict[str, int]] = None,
          chooser: Optional[str] = None) -> dict[str, Any]:
    """OpenAI's usage plus ``speculative``: passes, drafted and accepted tokens, and both per source, which
    sum to them: the drafter, or for ``auto`` the members it chose (``chooser``: "auto", null otherwise), and
    ``grammar`` for the tokens a response_format forced."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "speculative": {"target_passes": target_passes, "drafted": drafted, "accepted": accepted,
                        "drafted_by": dict(drafted_by or {}), "accepted_by": dict(accepted_by or {}),
                        "chooser": chooser},
    }


def completion_chunk(rid: str, created: int, model: str, text: str, finish_reason: Optional[str],
                     extra: Optional[dict[str, Any]], index: int = 0,
                     logprobs: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if extra is not None:
        body["specdecode"] = extra
    return body


def chat_chunk(rid: str, created: int, model: str, delta: dict[str, str], finish_reason: Optional[str],
               extra: Optional[dict[str, Any]], index: int = 0,
               logprobs: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
    }
    if extra is not None:
        body["specdecode"] = extra
    return body
