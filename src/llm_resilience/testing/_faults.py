"""Scripted faults for the fake provider server, and its record of each request served."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Fault", "FaultKind", "Provider", "ServedRequest"]

FaultKind = Literal["ok", "status", "hang", "drop_mid_stream", "refuse", "slow"]
Provider = Literal["openai", "anthropic"]


_FAULT_OPTIONS = (
    "status_code",
    "retry_after",
    "retry_after_ms",
    "body",
    "seconds",
    "after_chunks",
    "delay_per_chunk",
)


@dataclass(frozen=True, slots=True)
class Fault:
    """How the server answers one request. Build them with the class methods.

    >>> Fault.status(429, retry_after=2)
    Fault(kind='status', status_code=429, retry_after=2)
    """

    kind: FaultKind
    status_code: int | None = None
    retry_after: float | None = None
    retry_after_ms: float | None = None
    body: Mapping[str, Any] | str | None = field(default=None, compare=False)
    seconds: float | None = None
    after_chunks: int | None = None
    delay_per_chunk: float | None = None

    def __repr__(self) -> str:
        # Only the options that are set, so a script reads like the calls that built it.
        shown = "".join(
            f", {name}={getattr(self, name)!r}"
            for name in _FAULT_OPTIONS
            if getattr(self, name) is not None
        )
        return f"Fault(kind={self.kind!r}{shown})"

    @classmethod
    def ok(cls) -> Fault:
        """Answer normally."""
        return cls("ok")

    @classmethod
    def status(
        cls,
        code: int,
        retry_after: float | None = None,
        retry_after_ms: float | None = None,
        body: Mapping[str, Any] | str | None = None,
    ) -> Fault:
        """Answer with HTTP ``code`` (400-599) and the provider's JSON error body.

        ``retry_after`` (seconds) and ``retry_after_ms`` become the ``retry-after`` and
        ``retry-after-ms`` headers. ``body`` replaces the error body: a mapping is sent as
        JSON, a string verbatim as ``text/plain`` (a proxy's error page, say).
        """
        if isinstance(code, bool) or not isinstance(code, int) or not 400 <= code <= 599:
            raise ValueError(f"code must be an HTTP error status between 400 and 599; got {code!r}")
        for option, value in (("retry_after", retry_after), ("retry_after_ms", retry_after_ms)):
            if value is not None and not value >= 0:
                raise ValueError(f"{option} must be >= 0 or None; got {value!r}")
        return cls(
            "status",
            status_code=code,
            retry_after=retry_after,
            retry_after_ms=retry_after_ms,
            body=body,
        )

    @classmethod
    def hang(cls, seconds: float | None = None) -> Fault:
        """Accept the request and send nothing for ``seconds`` (None: until the server stops).

        If the wait ends before the server stops, the normal answer follows.
        """
        if seconds is not None and not seconds >= 0:
            raise ValueError(f"seconds must be >= 0 or None; got {seconds!r}")
        return cls("hang", seconds=seconds)

    @classmethod
    def drop_mid_stream(cls, after_chunks: int = 1) -> Fault:
        """Stream ``after_chunks`` content chunks, then close the socket mid-body.

        The chunked encoding is never terminated, so the client's HTTP library raises a
        transport error (httpx: ``RemoteProtocolError``) while reading the body. A
        non-streaming request sees the connection closed before any response.
        """
        if isinstance(after_chunks, bool) or not isinstance(after_chunks, int) or after_chunks < 0:
            raise ValueError(f"after_chunks must be an integer >= 0; got {after_chunks!r}")
        return cls("drop_mid_stream", after_chunks=after_chunks)

    @classmethod
    def refuse(cls) -> Fault:
        """Close the connection at once, without a response."""
        return cls("refuse")

    @classmethod
    def slow(cls, delay_per_chunk: float = 0.05) -> Fault:
        """Answer normally, waiting ``delay_per_chunk`` seconds before each content chunk.

        A non-streaming request waits that long per chunk of the reply before the answer.
        """
        if not delay_per_chunk >= 0:
            raise ValueError(f"delay_per_chunk must be >= 0; got {delay_per_chunk!r}")
        return cls("slow", delay_per_chunk=delay_per_chunk)


@dataclass(frozen=True, slots=True)
class ServedRequest:
    """What the server saw of one request. Never the prompt or the reply text."""

    #: The request path, e.g. ``/v1/chat/completions``.
    path: str
    #: Which API the path belongs to.
    provider: Provider
    #: The ``model`` of the request body ("" when absent).
    model: str
    #: Whether the request asked for a stream.
    stream: bool
    #: The fault applied (``Fault.ok()`` for a normal answer).
    fault: Fault
    #: Whether the answer was (or would have been) a tool call.
    tool_call: bool
    #: ``time.monotonic()`` when the request was read.
    at: float
