"""The options and hook payloads of a fallback chain: ``Cooldown`` and ``StreamRestart``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from llm_resilience.checks import OptionTypeError, seconds, whole
from llm_resilience.fallback._circuit_store import RedisCircuitStore

__all__ = [
    "MID_STREAM_POLICIES",
    "Classifier",
    "Cooldown",
    "MemberKeys",
    "RestartHook",
    "RestartPayload",
    "StreamRestart",
]

Classifier = Callable[[BaseException], bool]


_OptionTypeError = OptionTypeError

#: What a chain does when a stream fails after it delivered content: ``"restart"`` the
#: request on the next client (the default; ``on_restart`` hooks are told),
#: ``"continue"`` it on the next client from the text already delivered, sent as an
#: assistant prefill where that client accepts one (else restart, with the hooks told),
#: or ``"raise"`` [`StreamInterruptedError`][].
MID_STREAM_POLICIES: tuple[str, ...] = ("restart", "continue", "raise")


def checked_mid_stream(value: object, option: str = "mid_stream") -> str:
    """``value`` if it is one of `MID_STREAM_POLICIES`, else a ``ValueError`` naming them."""
    if not isinstance(value, str) or value not in MID_STREAM_POLICIES:
        allowed = ", ".join(repr(policy) for policy in MID_STREAM_POLICIES)
        raise ValueError(f"{option} must be one of {allowed}; got {value!r}")
    return value


_seconds = seconds

#: How a shared circuit names the members across processes: one key per client, in chain
#: order, or a function of a client.
MemberKeys = Sequence[str] | Callable[[Any], str]


@dataclass(frozen=True, slots=True)
class Cooldown:
    """Opt-in circuit breaker for a fallback chain.

    A client that failed transiently ``failures`` times within ``window`` seconds is
    skipped for ``duration`` seconds, so a dead primary stops costing every request its
    full timeout. With ``honor_retry_after`` a 429/503 that carries ``retry-after-ms``
    or ``Retry-After`` (seconds or an HTTP date) skips that client for the time asked,
    capped at ``max_retry_after``. A success clears the client's failure count. If every
    client is cooling down, the one whose cooldown ends first is tried anyway: the chain
    never refuses a call without trying a provider.

    ``shared`` (a [`RedisCircuitStore`][]) keeps the circuits in Redis for a whole fleet
    of workers: failures counted across the fleet, a member opened for all at once, one
    worker at a time owning the trial call, a success closing it for all; when Redis is
    away each worker uses its own breaker (docs/fallback.md, "Sharing circuit state
    across workers"). Workers recognise a member by its key: by default
    ``"<class>:<model>@<base URL>"`` read from the client's attributes (``model_name``,
    ``model`` or ``model_id``; ``base_url``, ``openai_api_base``, ``anthropic_api_url``,
    ``api_base`` or ``azure_endpoint``), or ``keys``: one string per client in chain
    order, or a function of a client returning its key. A chain whose keys cannot be
    derived, or repeat, is refused at construction with a ``ValueError`` naming
    ``Cooldown.keys``.

    Examples:
        >>> Cooldown(failures=3, window=60, duration=30)  # doctest: +NORMALIZE_WHITESPACE
        Cooldown(failures=3, window=60.0, duration=30.0, honor_retry_after=True,
                 max_retry_after=300.0)
    """

    #: Transient failures within ``window`` that open the breaker (>= 1).
    failures: int = 3
    #: Seconds over which failures are counted.
    window: float = 60.0
    #: Seconds a client is skipped once the breaker opens.
    duration: float = 30.0
    #: Whether a provider's ``Retry-After`` sets the client's cooldown.
    honor_retry_after: bool = True
    #: Upper bound, in seconds, on a cooldown taken from ``Retry-After``.
    max_retry_after: float = 300.0
    #: Where the fleet keeps its circuits, or None (each process keeps its own).
    shared: RedisCircuitStore | None = None
    #: Each member's key in the shared store (a tuple of strings, one per client, or a
    #: function of a client); None derives them from the clients.
    keys: MemberKeys | None = None

    def __repr__(self) -> str:
        text = (
            f"Cooldown(failures={self.failures}, window={self.window}, "
            f"duration={self.duration}, honor_retry_after={self.honor_retry_after}, "
            f"max_retry_after={self.max_retry_after}"
        )
        if self.shared is not None:
            text += f", shared={self.shared!r}"
        if self.keys is not None:
            text += f", keys={self.keys!r}"
        return text + ")"

    def __post_init__(self) -> None:
        whole("Cooldown.failures", self.failures, minimum=1)
        for name in ("window", "duration", "max_retry_after"):
            seconds = _seconds(f"Cooldown.{name}", getattr(self, name), allow_none=False)
            object.__setattr__(self, name, seconds)
        if not isinstance(self.honor_retry_after, bool):
            raise _OptionTypeError(
                f"Cooldown.honor_retry_after must be True or False; got {self.honor_retry_after!r}"
            )
        if self.shared is not None and not isinstance(self.shared, RedisCircuitStore):
            raise _OptionTypeError(
                f"Cooldown.shared must be None or a RedisCircuitStore(...); got "
                f"{type(self.shared).__name__}"
            )
        keys = self.keys
        if keys is None:
            return
        if self.shared is None:
            raise ValueError("Cooldown.keys names members in a shared store: give shared= too")
        if callable(keys):
            return
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
            raise _OptionTypeError(
                f"Cooldown.keys must be a list of strings (one per client) or a function "
                f"of a client; got {type(keys).__name__}"
            )
        keys = tuple(keys)
        for key in keys:
            if not isinstance(key, str) or not key.strip():
                raise ValueError(f"Cooldown.keys must hold non-empty strings; got {key!r}")
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        if repeated:
            raise ValueError(f"Cooldown.keys must name each member once; repeated: {repeated}")
        object.__setattr__(self, "keys", keys)


class RestartPayload(TypedDict):
    """What a restart event carries ([`StreamRestart.payload`][]): no text, ever."""

    failed_client: int
    next_client: int
    chunks: int
    #: The failure's class name, never its message (which may quote provider output).
    error_type: str
    continued: bool


@dataclass(frozen=True, slots=True)
class StreamRestart:
    """What an ``on_restart`` hook is told when a stream goes on after a failure mid-way.

    ``continued`` tells the two cases apart: False, the next client streams the answer
    again from the beginning and the consumer should discard the ``chunks`` it holds;
    True (``mid_stream="continue"``), the next client carries on from the text
    delivered, so the consumer keeps it. After a client rejected a prefill it gets the
    request again as a restart: ``failed_client == next_client``, ``continued=False``.
    """

    #: Index of the client that failed mid-stream (or rejected the prefill).
    failed_client: int
    #: Index of the client that streams next.
    next_client: int
    #: Content chunks the consumer holds of the answer since it last started from the
    #: beginning: to be discarded on a restart, kept on a continuation.
    chunks: int
    #: The failure (a ``TimeoutError`` when a time limit of the chain fired).
    error: BaseException
    #: True when the next client continues from the delivered text; False on a restart.
    continued: bool = False

    def payload(self) -> RestartPayload:
        """The fields a restart event carries to a consumer: indexes, counts and the
        failure's class name, never its message (which may quote provider output).

        Examples:
            >>> StreamRestart(0, 1, chunks=3, error=TimeoutError("slow")).payload()
            {'failed_client': 0, 'next_client': 1, 'chunks': 3, 'error_type': 'TimeoutError', \
'continued': False}
        """
        return {
            "failed_client": self.failed_client,
            "next_client": self.next_client,
            "chunks": self.chunks,
            "error_type": type(self.error).__name__,
            "continued": self.continued,
        }


RestartHook = Callable[[StreamRestart], object]
