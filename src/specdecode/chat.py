"""Chat messages -> one prompt string: the checkpoint's own template when it has one.

The template is the model directory's ``chat_template.jinja`` (the current
Hugging Face layout, which wins), else ``chat_template`` from its
``tokenizer_config.json`` (a string, or a list of named templates where the one
named "default" wins), rendered with jinja2 the way transformers renders it
(``messages``, ``add_generation_prompt=True``, ``bos_token``/``eos_token``,
``raise_exception``). A checkpoint without one gets ``PLAIN_TEMPLATE``:

    System: {system text}
    User: {user text}
    Assistant: {assistant text}
    ...
    Assistant:

one line per message (role capitalised, then ": ", then the text), ending with
``Assistant:`` so the model writes the reply.

``encode_chats`` turns (role, content) turns into a model's token ids through its template: what
``generate --chat``, ``chat``, the bench's real workload and calibration all feed the target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import AbstractSet, Any, Optional, Protocol, Sequence

PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template refused the conversation (e.g. roles out of the order it expects)."""


class ChatFormatter:
    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        import jinja2.sandbox  # lazy: jinja2 (~13 ms) loads when a template is first rendered, not at start-up

        def raise_exception(message: str) -> None:
            raise ChatTemplateError(message)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           undefined=jinja2.StrictUndefined)
        env.globals["raise_exception"] = raise_exception
        self._jinja_error = jinja2.TemplateError
        self.template = env.from_string(template)
        self.source = template
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def for_model(cls, model: Any) -> "ChatFormatter":
        """The formatter of a loaded model (its ``chat_template``, which a GGUF carries in its metadata),
        or of a Hugging Face model directory given by path."""
        if not isinstance(model, (str, Path)):
            if model.chat_template is None:
                return cls(PLAIN_TEMPLATE)
            return cls(model.chat_template, model.bos_token, model.eos_token)
        template, bos, eos = read_chat_template(Path(model))
        return cls(PLAIN_TEMPLATE) if template is None else cls(template, bos, eos)

    def render(self, messages: list[dict[str, str]]) -> str:
        try:
            return self.template.render(messages=messages, add_generation_prompt=True,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except ChatTemplateError:
            raise
        except self._jinja_error as e:
            raise ChatTemplateError(f"the model's chat template failed on these messages: {e}") from e


def read_chat_template(model_dir: Path) -> tuple[Optional[str], str, str]:
    """(template or None, bos text, eos text) of a Hugging Face model directory."""
    cfg_file = model_dir / "tokenizer_config.json"
    cfg: dict[str, Any] = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    jinja_file = model_dir / "chat_template.jinja"
    template = (_pick_template(jinja_file.read_text(encoding="utf-8")) if jinja_file.is_file() else None) \
        or _pick_template(cfg.get("chat_template"))
    return template, _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))


def _pick_template(value: Any) -> Optional[str]:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next((t for t in named.values() if t), None)
    return None


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older configs
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


class TemplatedModel(Protocol):
    """What the chat helpers read of a loaded model (``models.Model`` has it all); a Protocol, so that this
    module stays below ``models`` (whose loader reads templates from here)."""

    @property
    def path(self) -> str: ...

    @property
    def max_seq_len(self) -> int: ...

    @property
    def eos_token_ids(self) -> AbstractSet[int]: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


def chat_formatter(model: TemplatedModel) -> tuple[ChatFormatter, bool]:
    """The model's chat template (GGUF metadata or HF files) and whether it is the model's own.

    ``Model.chat_template`` (set by the GGUF and HF loaders) wins; a model directory without
    that attribute is read as the server reads it; otherwise the plain template.
    """
    template: Optional[str] = getattr(model, "chat_template", None)
    if template:
        fmt = ChatFormatter(template, getattr(model, "bos_token", None) or "", getattr(model, "eos_token", None) or "")
    elif Path(str(model.path)).is_dir():
        fmt = ChatFormatter.for_model(str(model.path))
    else:
        fmt = ChatFormatter(PLAIN_TEMPLATE)
    return fmt, fmt.source != PLAIN_TEMPLATE


class TemplateTokens:
    """The model as a prompt encoder sees it, encoding without special tokens: a model's template
    writes its own BOS where it wants one (transformers' apply_chat_template does the same)."""

    def __init__(self, model: TemplatedModel) -> None:
        self.model = model
        self.max_seq_len, self.eos_token_ids = model.max_seq_len, model.eos_token_ids

    def encode(self, text: str) -> list[int]:
        return self.model.encode(text, add_special_tokens=False)


def encode_chats(model: TemplatedModel, chats: Sequence[Sequence[tuple[str, str]]]) -> list[list[int]]:
    """Token ids of each chat (role, content turns) through the model's template, encoded as the bench's
    real workload encodes them (``bench/real.py``)."""
    if not chats:
        return []
    fmt, own = chat_formatter(model)
    encode = TemplateTokens(model).encode if own else model.encode
    return [encode(fmt.render([{"role": r, "content": c} for r, c in m])) for m in chats]
