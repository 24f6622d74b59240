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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template refused the conversation (e.g. roles out of the order it expects)."""


class ChatFormatter:
    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ChatTemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
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
