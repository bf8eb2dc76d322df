"""Option checks shared by every part of the core: durations, scopes, counts and money.

The bottom layer: it imports nothing of ours, and the adapters use it to check their own
options the way the core does (see ``docs/architecture.md``).

Each check names the option it was given and the values it allows, and bounds what it
accepts to what every backend can hold, so a value that passes here can always be
stored, waited for and added up. The bounds are documented in ``docs/operations.md``.

Examples:
    >>> seconds("per_client_timeout", 30)
    30.0
    >>> seconds("per_client_timeout", 1e10)
    Traceback (most recent call last):
    ...
    ValueError: per_client_timeout must be at most 31536000 seconds (365 days); got 10000000000.0
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import typing
import unicodedata
from collections.abc import Iterable
from datetime import timedelta
from decimal import Decimal
from typing import Any, ClassVar, Self

__all__ = [
    "MAX_COST",
    "MAX_COST_PLACES",
    "MAX_COUNT",
    "MAX_DURATION",
    "MAX_MONEY",
    "MAX_MONEY_PLACES",
    "MAX_OPERATION_TIMEOUT",
    "MAX_SCOPE_LENGTH",
    "KnownKeywords",
    "OptionTypeError",
    "cost_in_range",
    "count",
    "duration",
    "keywords_taken",
    "known_keywords",
    "money_in_range",
    "scope",
    "seconds",
    "whole",
]

#: The longest duration any option accepts (timeouts, TTLs, cooldowns): 365 days. Longer
#: values overflow thread waits (``threading.TIMEOUT_MAX``) and date arithmetic.
MAX_DURATION = timedelta(days=365)
#: The longest bound on one call to a database or Redis (``operation_timeout``,
#: ``connect_timeout``): a day. Anything longer is not a bound.
MAX_OPERATION_TIMEOUT = timedelta(days=1)
#: The longest scope, in characters: 4 bytes each at most in UTF-8, far below the
#: 2,704-byte limit of a PostgreSQL index entry.
MAX_SCOPE_LENGTH = 256
#: The largest token or page count one entry may carry (a PostgreSQL ``INTEGER``).
MAX_COUNT = 2**31 - 1
#: Money (a price, a limit, a cost) must be below this, in any currency.
MAX_MONEY = Decimal(10) ** 15
#: Money may have at most this many decimal places (a cost adds 6 to a price's).
MAX_MONEY_PLACES = 18
#: A recorded cost (tokens x a price per million, summed) must be below this.
MAX_COST = Decimal(10) ** 30
#: A cost may have this many decimal places: a price's, plus 6 for the per-million division.
MAX_COST_PLACES = MAX_MONEY_PLACES + 6


class OptionTypeError(TypeError, ValueError):
    """An option of the wrong type: a ``TypeError`` by Python custom, and a ``ValueError``
    because construction promises ``ValueError`` for any bad option."""


def seconds(
    option: str,
    value: object,
    *,
    allow_none: bool = False,
    zero: str | None = None,
    maximum: timedelta = MAX_DURATION,
) -> float | None:
    """A duration option as seconds: None (when allowed), an int or float, or a timedelta,
    greater than 0 (or 0 itself, when ``zero`` says what 0 means) and at most ``maximum``.

    Examples:
        >>> seconds("RetryPolicy.base_delay", 0, zero="no wait")
        0.0
        >>> seconds("RetryPolicy.base_delay", -1, zero="no wait")
        Traceback (most recent call last):
        ...
        ValueError: RetryPolicy.base_delay must be 0 (no wait) or more seconds; got -1
    """
    if value is None and allow_none:
        return None
    if isinstance(value, timedelta):
        amount = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            amount = float(value)
        except OverflowError:
            amount = math.inf
    else:
        allowed = "None, " if allow_none else ""
        raise OptionTypeError(
            f"{option} must be {allowed}a number of seconds (int or float) or a "
            f"datetime.timedelta; got {value!r} ({type(value).__name__})"
        )
    if math.isnan(amount) or amount < 0 or (amount == 0 and zero is None):
        least = "greater than 0 seconds" if zero is None else f"0 ({zero}) or more seconds"
        raise ValueError(f"{option} must be {least}; got {value!r}")
    limit = maximum.total_seconds()
    if amount > limit:
        days = f"{maximum.days} day" + ("" if maximum.days == 1 else "s")
        raise ValueError(f"{option} must be at most {limit:.0f} seconds ({days}); got {value!r}")
    return amount


def duration(option: str, value: object, *, maximum: timedelta = MAX_DURATION) -> timedelta:
    """[`seconds`][], as a ``timedelta`` (None is not allowed)."""
    amount = seconds(option, value, maximum=maximum)
    assert amount is not None
    return value if isinstance(value, timedelta) else timedelta(seconds=amount)


def scope(option: str, value: object) -> str | None:
    """A budget scope: None, or text every ledger can store and index.

    Non-empty, at most `MAX_SCOPE_LENGTH` characters, and no control characters
    (NUL included) or lone surrogates. A scope is often a user id or an API key: pass a
    stable hash of a key (``hashlib.sha256(key.encode()).hexdigest()[:16]``), never the
    key itself.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise OptionTypeError(f"{option} must be text or None; got {type(value).__name__}")
    if not value:
        raise ValueError(f"{option} must be non-empty text or None; got ''")
    if len(value) > MAX_SCOPE_LENGTH:
        raise ValueError(
            f"{option} must be at most {MAX_SCOPE_LENGTH} characters; got {len(value)}"
        )
    if value.isprintable():  # C-speed: no Cc or Cs (nor other unprintables) at all
        return value
    for character in value:
        category = unicodedata.category(character)
        if category in ("Cc", "Cs"):
            kind = "a control character" if category == "Cc" else "a lone surrogate"
            raise ValueError(
                f"{option} must be printable text: it holds {kind} (U+{ord(character):04X}), "
                f"which not every ledger can store"
            )
    return value


def whole(option: str, value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer option (a bool is not one) from ``minimum`` to ``maximum`` (if any): a
    budget per minute, a queue bound, a number of attempts, a token weight.

    Examples:
        >>> whole("requests_per_minute", 0, minimum=1)
        Traceback (most recent call last):
        ...
        ValueError: requests_per_minute must be an integer >= 1, got 0
    """
    allowed = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionTypeError(f"{option} must be an integer {allowed}, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{option} must be an integer {allowed}, got {value!r}")
    return value


def count(option: str, value: object) -> int:
    """A token or page count: an int from 0 to `MAX_COUNT`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionTypeError(f"{option} must be an integer >= 0, got {value!r}")
    if not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{option} must be an integer from 0 to {MAX_COUNT}, got {value!r}")
    return value


def money_in_range(
    option: str, value: Decimal, *, maximum: Decimal = MAX_MONEY, places: int = MAX_MONEY_PLACES
) -> Decimal:
    """``value`` (finite, >= 0) if every ledger can store it and the costs made from it.

    Below `MAX_MONEY` and with at most `MAX_MONEY_PLACES` decimal places.
    """
    if value >= maximum:
        raise ValueError(f"{option} must be below {maximum:,}; got {value}")
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite: checked by the caller
    if exponent >= -places:
        return value
    trailing_zeros = len(digits) - len("".join(map(str, digits)).rstrip("0"))
    if digits != (0,) and exponent + trailing_zeros < -places:
        raise ValueError(f"{option} must have at most {places} decimal places; got {value}")
    return value


def cost_in_range(option: str, value: Decimal) -> Decimal:
    """A recorded cost: below `MAX_COST`, at most `MAX_COST_PLACES` places.

    Any cost made from prices that passed [`money_in_range`][] and counts that passed
    [`count`][] fits.
    """
    return money_in_range(option, value, maximum=MAX_COST, places=MAX_COST_PLACES)


def known_keywords(owner: str, given: Iterable[str], allowed: Iterable[str]) -> None:
    """Raise `TypeError` for the first of `given` not in `allowed`, naming the closest.

    For a wrapper whose framework would drop an unknown keyword without a word (so a
    misspelled `max_queue_requests` would leave the queue unbounded).

    Examples:
        >>> known_keywords("limiter_for", ["limitr"], ["limiter", "tokens_per_minute"])
        Traceback (most recent call last):
        ...
        TypeError: limiter_for takes no keyword 'limitr'; did you mean 'limiter'?
    """
    names = tuple(allowed)
    for name in given:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (it takes {', '.join(names)})"
            raise TypeError(f"{owner} takes no keyword {name!r}{hint}")


class KnownKeywords:
    """A mixin whose class refuses, before anything is built, a keyword it does not take.

    Pydantic models (LangChain's and LlamaIndex's) drop an unknown keyword without a
    word, and Python names no close option, so ``per_client_timout=5`` would leave a
    chain unbounded. With this mixin a constructor raises [`known_keywords`][]'s
    ``TypeError`` (naming the keyword and the closest one it takes) before its own
    ``__init__`` runs, so a misspelled required option is named too.

    A class takes: the keyword parameters of every ``__init__`` in its MRO (and the keys
    of a ``**options: Unpack[SomeTypedDict]``), its pydantic fields and their aliases,
    and `accepted_keywords`.

    Examples:
        >>> class Layer(KnownKeywords):
        ...     def __init__(self, *, inner, policy=None): ...
        >>> Layer(inner=1, polcy=None)
        Traceback (most recent call last):
        ...
        TypeError: Layer takes no keyword 'polcy'; did you mean 'policy'?
    """

    __slots__ = ()

    #: Keywords taken besides the constructor's own and the fields (LangChain's standard
    #: chat-model parameters, say, which configure a provider and not a layer).
    accepted_keywords: ClassVar[tuple[str, ...]] = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        if kwargs:
            known_keywords(cls.__name__, kwargs, keywords_taken(typing.cast(type, cls)))
        return super().__new__(cls)


@functools.cache
def keywords_taken(cls: type) -> tuple[str, ...]:
    """The keywords a [`KnownKeywords`][] class takes, computed once per class."""
    names: dict[str, None] = {}
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if inspect.isfunction(init):
            names.update(dict.fromkeys(_init_keywords(init)))
    fields: Any = getattr(cls, "__pydantic_fields__", None) or {}
    for name, field in fields.items():
        names[name] = None
        for alias in (getattr(field, "alias", None), getattr(field, "validation_alias", None)):
            if isinstance(alias, str):
                names[alias] = None
    names.update(dict.fromkeys(getattr(cls, "accepted_keywords", ())))
    return tuple(names)


def _init_keywords(init: Any) -> list[str]:
    """The keyword parameters of ``init``, a ``**options: Unpack[TypedDict]``'s keys included."""
    keywords: list[str] = []
    for parameter in inspect.signature(init).parameters.values():
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            keywords.append(parameter.name)
        elif parameter.kind is parameter.VAR_KEYWORD and "Unpack" in str(parameter.annotation):
            try:
                hint = typing.get_type_hints(init, include_extras=True)[parameter.name]
            except Exception:  # an annotation that does not resolve at run time
                continue
            for options in typing.get_args(hint):
                keywords.extend(getattr(options, "__annotations__", {}))
    return [name for name in keywords if name != "self"]
