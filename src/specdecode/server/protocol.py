"""OpenAI-compatible request and response shapes (the subset we honour), plus our extensions.

Requests are validated strictly: a wrong type is a 400 that names the field,
never a silent coercion. Parameters we cannot honour (n > 1, logprobs, echo,
penalties) are refused with a clear message instead of being ignored.
Extensions a stock OpenAI client never sends: ``drafter``, ``gamma``,
``chain_rule``, ``top_k``, ``min_p``, ``ignore_eos`` in requests, and a top-level
``specdecode`` object in responses (per-token origin for the web page, α̂, τ).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingParams(_Strict):
    """Fields shared by completions and chat completions."""

    model: str
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=1)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    n: Optional[int] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    user: Optional[str] = None
    # extensions
    drafter: Optional[str] = None  # a registered drafter's name (drafters/registry.py)
    gamma: Optional[int] = Field(default=None, ge=1, le=32)
    chain_rule: Optional[str] = None  # sampled chain verification: block (default) or token (config.VerifyConfig)
    ignore_eos: Optional[bool] = False

    @field_validator("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _int_is_a_float(cls, v: Any) -> Any:
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("n")
    @classmethod
    def _only_one(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v != 1:
            raise ValueError(f"only n=1 is supported (got n={v}); send separate requests for more choices")
        return v

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, v: Optional[float]) -> Optional[float]:
        if v:
            raise ValueError("presence/frequency penalties are not supported (they would break exact speculation)")
        return v

    @field_validator("drafter")
    @classmethod
    def _known_drafter(cls, v: Optional[str]) -> Optional[str]:
        from ..drafters.registry import REGISTRY

        if v is not None and v not in REGISTRY:
            raise ValueError(f"unknown drafter {v!r}; use one of: {', '.join(REGISTRY)}")
        return v

    @field_validator("chain_rule")
    @classmethod
    def _known_chain_rule(cls, v: Optional[str]) -> Optional[str]:
        from ..config import CHAIN_RULES

        if v is not None and v not in CHAIN_RULES:
            raise ValueError(f"unknown chain_rule {v!r}; use one of: {', '.join(CHAIN_RULES)} (default: block)")
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
    logprobs: Optional[int] = None
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    @model_validator(mode="after")
    def _supported(self) -> "CompletionRequest":
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise ValueError("batched prompts are not supported: send one prompt string per request")
        if self.echo:
            raise ValueError("echo is not supported")
        if self.logprobs is not None:
            raise ValueError("logprobs are not supported")
        if self.suffix:
            raise ValueError("suffix (insertion) is not supported")
        if self.best_of not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return self


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
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
    tools: Optional[list[Any]] = None

    @model_validator(mode="after")
    def _supported(self) -> "ChatCompletionRequest":
        if self.logprobs:
            raise ValueError("logprobs are not supported")
        if self.tools:
            raise ValueError("tools are not supported")
        return self


# -- responses -------------------------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def error_body(message: str, type_: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict[str, Any]:
    """OpenAI's error shape, which its clients turn into typed exceptions."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int, target_passes: int, drafted: int, accepted: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "speculative": {"target_passes": target_passes, "drafted": drafted, "accepted": accepted},
    }


def completion_chunk(rid: str, created: int, model: str, text: str, finish_reason: Optional[str],
                     extra: Optional[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }
    if extra is not None:
        body["specdecode"] = extra
    return body


def chat_chunk(rid: str, created: int, model: str, delta: dict[str, str], finish_reason: Optional[str],
               extra: Optional[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    if extra is not None:
        body["specdecode"] = extra
    return body
