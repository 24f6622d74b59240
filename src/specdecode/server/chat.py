"""The server's chat formatting is the library's (``specdecode.chat``); kept for imports of this path."""

from ..chat import PLAIN_TEMPLATE, ChatFormatter, ChatTemplateError

__all__ = ["PLAIN_TEMPLATE", "ChatFormatter", "ChatTemplateError"]
