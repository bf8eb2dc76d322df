"""What counts as a secret, and how to show a value without it: the rule behind every repr.

A wrapper's ``repr()`` nests the models it wraps, and provider models keep credentials
in plain fields: LlamaIndex's ``OpenAI.api_key`` is a ``str``, and a
``default_headers={"Authorization": ...}`` or a base URL with a password is a plain value
in any of them. Every pydantic layer of both adapters (the chat/LLM layers and LlamaIndex's
embedding layers) shows its fields through `redacted_fields`, so what is masked is
decided here, once.

Examples:
    >>> is_secret_field("openai_api_key"), is_secret_field("max_tokens")
    (True, False)
    >>> redacted({"api_key": "sk-FAKE-0000000000000000", "model": "gpt-4o"})
    {'api_key': '**********', 'model': 'gpt-4o'}
    >>> redacted("https://user:hunter2@proxy.example/v1?key=abc&region=eu")
    'https://user:**********@proxy.example/v1?key=**********&region=eu'

What is masked:

* a field, mapping key, header or query parameter whose *name* says it holds a
  credential (`is_secret_field`): its value, whatever its type (None, booleans
  and ``''`` stay visible: they say whether a credential is set, not what it is); a
  mapping under such a name (``default_headers``) keeps its keys and masks every value;
* any value with a ``get_secret_value`` method (pydantic's ``SecretStr``/``SecretBytes``
  and look-alikes), shown as ``SecretStr('**********')``;
* inside any text: the userinfo of a URL (the password, or a lone user name, which is
  then the credential), URL query parameters with secret names, ``Bearer``/``Basic``
  credentials, ``name='value'`` pairs with secret names, and keys of well-known shapes
  (``sk-…``, ``AIza…``).

Pydantic models (every LangChain and LlamaIndex model) are shown field by field, as
pydantic shows them, each value redacted; other objects by their own ``repr()``, with
the text rules applied. A name-based rule cannot know every provider's field names: a
credential in a field called ``x`` with no recognisable shape is shown.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

__all__ = ["MASK", "is_secret_field", "redacted", "redacted_fields", "scrubbed"]

#: What a secret is shown as (pydantic's ``SecretStr`` shows the same ten stars).
MASK = "**********"

# Last words of a name that holds a credential ("openai_api_key" ends in "api", "key").
_SECRET_WORDS = frozenset(
    {
        "accesskey",
        "accesstoken",
        "apikey",
        "apitoken",
        "auth",
        "authorization",
        "authtoken",
        "cookie",
        "cookies",
        "credential",
        "credentials",
        "dsn",
        "header",
        "headers",
        "pass",
        "passphrase",
        "passwd",
        "password",
        "privatekey",
        "pwd",
        "secret",
        "secretkey",
        "secrets",
        "sig",
        "token",
    }
)
# "key" is a credential only after one of these ("api_key", "aws_secret_access_key"),
# or alone; "cache_key" and "partition_key" are not.
_KEY_QUALIFIERS = frozenset(
    {
        "access",
        "account",
        "admin",
        "api",
        "app",
        "auth",
        "client",
        "encryption",
        "license",
        "master",
        "private",
        "secret",
        "service",
        "session",
        "signing",
        "subscription",
    }
)
# A "token" after one of these is a tokenizer's special token ("eos_token"), not a credential.
_VOCABULARY_TOKENS = frozenset(
    {"begin", "bos", "cls", "end", "eos", "mask", "pad", "sep", "special", "start", "stop", "unk"}
)
# Two-word endings that hold credentials ("AccountKey=..." lives in connection strings).
_SECRET_PHRASES = frozenset({("connection", "string"), ("connection", "str"), ("conn", "str")})
# Trailing words that do not change what a name holds ("azure_ad_token_provider").
_NEUTRAL_SUFFIXES = frozenset({"provider", "value"})

_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_URL = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
# Greedy up to the last "@" of the authority, so an unescaped "@" in a password is masked.
_USERINFO = re.compile(r"^(?P<scheme>[^:]+://)(?P<userinfo>[^/?#]*)@")
_QUERY_PARAMETER = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&#;]+)=(?P<value>[^&#;]*)")
_SCHEME_CREDENTIAL = re.compile(r"\b(?P<scheme>[Bb]earer|BEARER|[Bb]asic|BASIC)\s+[\w.~+/=\-]{8,}")
_ASSIGNMENT = re.compile(
    r"(?<![\w.\-])(?P<name>[A-Za-z_][\w.\-]*)(?P<sep>['\"]?\s*[=:]\s*)"
    # One alternative per quote, each char class excluding the backslash: no backtracking
    # blow-up on a long run of backslashes.
    r"(?P<quoted>'(?:\\.|[^\\'\n])*'|\"(?:\\.|[^\\\"\n])*\")"
)
_KEY_SHAPES = re.compile(r"\b(?P<prefix>sk-|AIza)[A-Za-z0-9_\-]{12,}")

# Objects being shown right now, so a model that (indirectly) holds itself ends.
_showing: ContextVar[frozenset[int]] = ContextVar("redact_showing", default=frozenset())


def is_secret_field(name: str) -> bool:
    """Whether a field, key, header or parameter called ``name`` holds a credential.

    The name is split into words (``snake_case``, ``kebab-case`` and ``camelCase`` alike)
    and judged by its last one or two (a trailing ``provider``/``value`` ignored):

    * ``api_key``, ``openai_api_key``, ``x-api-key``, ``apiKey``, ``key``,
      ``subscription_key``, ``aws_secret_access_key``: a ``key`` after a qualifier such
      as ``api``, ``access``, ``secret``, ``private``, ``subscription``, or alone;
    * ``token``, ``access_token``, ``azure_ad_token_provider``, ``secret``,
      ``client_secret``, ``password``, ``passwd``, ``credentials``, ``authorization``,
      ``auth``, ``cookie``, ``dsn``, ``sig``, ``connection_string``;
    * ``headers``, ``default_headers``, ``extra_headers``: headers carry credentials
      under names no rule can list (``Helicone-Auth``, ``cf-aig-authorization``).

    Not secret: ``max_tokens``, ``token_limit``, ``eos_token``, ``cache_key``,
    ``auth_type``, ``secret_name``, ``api_base``, ``model``.

    Examples:
        >>> [is_secret_field(n) for n in ("api_key", "Authorization", "max_tokens", "cache_key")]
        [True, True, False, False]
    """
    words = [word.lower() for word in _WORD.findall(name)]
    while len(words) > 1 and words[-1] in _NEUTRAL_SUFFIXES:
        words.pop()
    if not words:
        return False
    last = words[-1]
    if last == "token" and len(words) > 1 and words[-2] in _VOCABULARY_TOKENS:
        return False
    if last in _SECRET_WORDS:
        return True
    if last in ("key", "keys"):
        return len(words) == 1 or words[-2] in _KEY_QUALIFIERS
    return len(words) > 1 and (words[-2], last) in _SECRET_PHRASES


def scrubbed(text: str) -> str:
    """``text`` with the credentials it visibly carries masked (the text rules above).

    Examples:
        >>> scrubbed("Authorization: Bearer abcdefgh12345678")
        'Authorization: Bearer **********'
        >>> scrubbed("redis://:s3cret@cache:6379/0")
        'redis://:**********@cache:6379/0'
    """
    if "://" in text:
        text = _URL.sub(_scrubbed_url, text)
    text = _SCHEME_CREDENTIAL.sub(lambda match: f"{match['scheme']} {MASK}", text)
    text = _ASSIGNMENT.sub(_scrubbed_assignment, text)
    return _KEY_SHAPES.sub(lambda match: f"{match['prefix']}{MASK}", text)


def redacted(value: object, name: str | None = None) -> object:
    """``value`` as it may be shown: its ``repr()`` carries no secret, the rest is kept.

    ``name`` is the field, key or parameter that holds ``value``, if any (see
    `is_secret_field`). Plain values come back unchanged (or a masked string);
    containers come back as containers of redacted values; models and objects whose
    text had to change come back as an object whose ``repr()`` is the safe text.

    Examples:
        >>> redacted({"Authorization": "Bearer abc"}, "default_headers")
        {'Authorization': '**********'}
        >>> redacted("sk-FAKE-anthropic-0000000", "api_key")
        '**********'
    """
    if _is_secret_like(value):
        return _Shown(f"{type(value).__name__}({MASK!r})")
    if name is not None and is_secret_field(name):
        if isinstance(value, Mapping):
            return {key: _masked(item) for key, item in value.items()}
        return _masked(value)
    if isinstance(value, _Shown | bool | int | float | complex | bytes) or value is None:
        return value
    if isinstance(value, str):
        safe = scrubbed(value)
        return value if safe == value else safe  # a str enum keeps its own repr
    if id(value) in _showing.get():
        return _Shown(f"{type(value).__name__}(...)")
    token = _showing.set(_showing.get() | {id(value)})
    try:
        return _redacted_structure(value)
    finally:
        _showing.reset(token)


def redacted_fields(fields: Iterable[tuple[str | None, Any]]) -> list[tuple[str | None, Any]]:
    """A pydantic ``__repr_args__`` with each value redacted under its field's name.

    This is how a wrapper keeps its members' credentials out of ``repr()``, ``str()``,
    rich and devtools output (all of which pydantic builds from ``__repr_args__``):

    ```python
    def __repr_args__(self):
        return redacted_fields(super().__repr_args__())
    ```
    """
    return [(name, redacted(value, name)) for name, value in fields]


# -- how values are shown ----------------------------------------------------------------


class _Shown:
    """Text that stands in for a value in a repr (already redacted)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        #: The value's safe ``repr()``.
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _is_secret_like(value: object) -> bool:
    # Looked up on the type: an attribute lookup on the object may run arbitrary code.
    return not isinstance(value, type) and callable(getattr(type(value), "get_secret_value", None))


def _masked(value: object) -> object:
    # None, a flag or an empty string says whether a credential is set, not what it is.
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not value):
        return value
    if _is_secret_like(value):
        return _Shown(f"{type(value).__name__}({MASK!r})")
    return MASK


def _redacted_structure(value: object) -> object:
    kind = type(value)
    if kind is dict or (isinstance(value, Mapping) and not _shows_fields(kind)):
        items = {
            key: redacted(item, key if isinstance(key, str) else None)
            for key, item in value.items()  # type: ignore[attr-defined]
        }
        return items if kind is dict else _Shown(f"{kind.__name__}({items!r})")
    if kind in (list, tuple, set, frozenset):
        return kind(redacted(item) for item in value)  # type: ignore[call-arg,attr-defined]
    if _shows_fields(kind):
        arguments = redacted_fields(value.__repr_args__())  # type: ignore[attr-defined]
        shown = ", ".join(repr(v) if a is None else f"{a}={v!r}" for a, v in arguments)
        return _Shown(f"{value.__repr_name__()}({shown})")  # type: ignore[attr-defined]
    # Any other object (a dataclass, a client, a function) by its own repr: the text
    # rules mask what it shows ("api_key='...'", a URL's password).
    text = repr(value)
    safe = scrubbed(text)
    return value if safe == text else _Shown(safe)


def _shows_fields(kind: type) -> bool:
    """Whether ``kind`` is shown by pydantic's field-by-field ``repr`` (not its own)."""
    if not (hasattr(kind, "__repr_args__") and hasattr(kind, "__repr_name__")):
        return False
    for klass in kind.__mro__:
        if "__repr__" in vars(klass):
            return klass.__module__.startswith("pydantic")
    return False


def _scrubbed_url(match: re.Match[str]) -> str:
    url = match[0]
    userinfo = _USERINFO.match(url)
    if userinfo is not None:
        user, colon, _ = userinfo["userinfo"].partition(":")
        shown = f"{user}:{MASK}" if colon else MASK
        url = f"{userinfo['scheme']}{shown}@{url[userinfo.end() :]}"
    return _QUERY_PARAMETER.sub(_scrubbed_parameter, url)


def _scrubbed_parameter(match: re.Match[str]) -> str:
    if not is_secret_field(match["name"]) or not match["value"]:
        return match[0]
    return f"{match['lead']}{match['name']}={MASK}"


def _scrubbed_assignment(match: re.Match[str]) -> str:
    quoted = match["quoted"]
    if not is_secret_field(match["name"]) or quoted[1:-1] in ("", MASK):
        return match[0]
    return f"{match['name']}{match['sep']}{quoted[0]}{MASK}{quoted[0]}"
