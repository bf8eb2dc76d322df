"""Scripted faults for the fake provider server, and its record of each request served."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from llm_resilience.testing._wire import WIRES
from llm_resilience.testing._wire_base import Provider

__all__ = ["Fault", "FaultKind", "Provider", "ServedRequest"]

FaultKind = Literal[
    "ok",
    "status",
    "hang",
    "drop_mid_stream",
    "refuse",
    "slow",
    "slow_first_token",
    "stall_mid_stream",
    "malformed_chunk",
    "missing_done",
    "prefill_rejected",
    "content_filtered",
    "error_event",
    "compacted",
]


_FAULT_OPTIONS = (
    "status_code",
    "retry_after",
    "retry_after_ms",
    "body",
    "seconds",
    "after_chunks",
    "delay_per_chunk",
    "compaction",
    "summary",
)


@dataclass(frozen=True, slots=True)
class Fault:
    """How the server answers one request. Build them with the class methods.

    Examples:
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
    compaction: Mapping[str, int] | None = field(default=None, compare=False)
    summary: str | None = None

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
        JSON, a string verbatim as ``text/plain`` (a proxy's error page, say). On the
        Bedrock route a mapping's ``"__type"`` is sent as the ``x-amzn-ErrorType`` header
        (AWS's error code), not in the body.
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
    def context_length_exceeded(
        cls, provider: Provider, *, tokens: int = 130_000, maximum: int = 128_000
    ) -> Fault:
        """Answer 400 with ``provider``'s own "prompt too long" error body.

        OpenAI: ``error.code`` ``"context_length_exceeded"`` and its message ("This
        model's maximum context length is {maximum} tokens. However, your messages
        resulted in {tokens} tokens..."). Anthropic: an ``invalid_request_error`` whose
        message is ``"prompt is too long: {tokens} tokens > {maximum} maximum"``. Both
        SDKs raise ``BadRequestError`` for it; LangChain re-raises it as its
        ``ContextOverflowError``. Bedrock: a ``ValidationException``, "Input is too long
        for requested model." (botocore raises ``ClientError``). Gemini: a 400
        ``INVALID_ARGUMENT``, "The input token count ({tokens}) exceeds the maximum number of
        tokens allowed ({maximum})." (google-genai raises ``ClientError``). Mistral: a 400
        "Prompt contains {tokens} tokens and 0 draft tokens, too large for model with
        {maximum} maximum context length" (mistralai raises ``SDKError``). Groq: a 400
        ``context_length_exceeded``, "Please reduce the length of the messages or
        completion." (no counts; the groq SDK raises ``BadRequestError``).
        Cohere: a 400
        "too many tokens: total number of tokens in the prompt cannot exceed {maximum} -
        received {tokens}. ..." (the cohere SDK raises ``BadRequestError``).

        Examples:
            >>> fault = Fault.context_length_exceeded("anthropic", tokens=210_000, maximum=200_000)
            >>> fault.body["error"]["message"]
            'prompt is too long: 210000 tokens > 200000 maximum'
        """
        for option, value in (("tokens", tokens), ("maximum", maximum)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{option} must be an integer >= 1; got {value!r}")
        wire = WIRES.get(provider)
        if wire is None:
            raise ValueError(
                "provider must be 'openai', 'anthropic', 'bedrock', 'gemini', 'mistral', 'groq' "
                f"or 'cohere'; got {provider!r}"
            )
        body = wire.context_overflow(tokens, maximum)
        return cls.status(400, body=body)

    @classmethod
    def budget_exhausted(cls, provider: Provider = "openai") -> Fault:
        """Answer as ``provider`` does when the account's credit or quota is spent.

        OpenAI (and Azure): 429 with ``{"error": {"code": "insufficient_quota", "type":
        "insufficient_quota", ...}}`` (the SDK raises ``RateLimitError``, like a rate
        limit). Anthropic: 402 with a ``billing_error`` (the SDK raises its
        ``APIStatusError``). Bedrock: 400 ``ServiceQuotaExceededException`` (botocore's
        ``ClientError``). Gemini, Mistral, Groq, Cohere, Ollama: 402 Payment Required with
        the provider's error body (each SDK raises its status error carrying 402). For a
        gateway's own answer (OpenRouter's 402, LiteLLM's ``budget_exceeded``) use
        [`status`][] with its body.

        Examples:
            >>> fault = Fault.budget_exhausted("openai")
            >>> fault.status_code, fault.body["error"]["code"]
            (429, 'insufficient_quota')
        """
        wire = WIRES.get(provider)
        if wire is None:
            allowed = ", ".join(sorted(WIRES))
            raise ValueError(f"provider must be one of {allowed}; got {provider!r}")
        code, body = wire.budget_exhausted()
        return cls.status(code, body=body)

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
    def slow_first_token(cls, seconds: float) -> Fault:
        """Send the headers (and a stream's opening events) at once, the first token after
        ``seconds``; the rest of the answer follows at full speed.

        What a loaded provider does: the connection is healthy and the status is 200, but
        the model has not started. A non-streaming request gets its whole answer after
        ``seconds``.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
            raise ValueError(f"seconds must be a number >= 0; got {seconds!r}")
        return cls("slow_first_token", seconds=seconds)

    @classmethod
    def stall_mid_stream(cls, after_chunks: int = 1, seconds: float | None = None) -> Fault:
        """Stream ``after_chunks`` content chunks, go silent for ``seconds`` with the
        connection open (None: until the server stops), then close the socket mid-body.

        The client sees no bytes at all during the silence, then the transport error of a
        cut stream. A non-streaming request waits ``seconds`` and is closed unanswered.
        """
        if isinstance(after_chunks, bool) or not isinstance(after_chunks, int) or after_chunks < 0:
            raise ValueError(f"after_chunks must be an integer >= 0; got {after_chunks!r}")
        if seconds is not None and not seconds >= 0:
            raise ValueError(f"seconds must be >= 0 or None; got {seconds!r}")
        return cls("stall_mid_stream", seconds=seconds, after_chunks=after_chunks)

    @classmethod
    def malformed_chunk(cls, after_chunks: int = 1) -> Fault:
        """Stream ``after_chunks`` content chunks, then one SSE event whose data is not
        JSON, then the rest of the answer.

        The SDKs decode each event as it arrives, so the client fails at the broken event
        (openai and anthropic raise ``json.JSONDecodeError``) on a response that said 200.
        A non-streaming request is answered normally. On Bedrock's event stream the
        broken event is a message whose CRC does not match (botocore raises
        ``ChecksumMismatch``).
        """
        if isinstance(after_chunks, bool) or not isinstance(after_chunks, int) or after_chunks < 0:
            raise ValueError(f"after_chunks must be an integer >= 0; got {after_chunks!r}")
        return cls("malformed_chunk", after_chunks=after_chunks)

    @classmethod
    def missing_done(cls) -> Fault:
        """Stream the whole answer, usage included, but not the end marker: no
        ``data: [DONE]`` (OpenAI), ``message_stop`` event (Anthropic) or ``messageStop``
        (Bedrock). The body itself ends cleanly. A non-streaming request is answered
        normally.
        """
        return cls("missing_done")

    @classmethod
    def prefill_rejected(cls) -> Fault:
        """Refuse an assistant prefill as a model without prefill support does.

        A request whose last message is the assistant's gets a 400 with the provider's
        error body and the message "This model does not support assistant message
        prefill. The conversation must end with a user message."; any other request is
        answered normally. As ``default_fault`` it makes the server a model that never
        takes a prefill.

        Examples:
            >>> Fault.prefill_rejected()
            Fault(kind='prefill_rejected')
        """
        return cls("prefill_rejected")

    @classmethod
    def content_filtered(cls, after_chunks: int = 1, *, prompt: bool = False) -> Fault:
        """The provider's content filter stops the answer.

        By default the answer stops after ``after_chunks`` content chunks with OpenAI's
        ``finish_reason: "content_filter"`` (Anthropic: ``stop_reason: "refusal"``), in
        a stream and in a call alike: a 200 whose answer is cut short. With
        ``prompt=True`` the prompt itself is refused: a 400 whose error ``code`` is
        ``"content_filter"`` (the body Azure OpenAI sends; Anthropic's route says the
        same in an ``invalid_request_error``).

        Examples:
            >>> Fault.content_filtered(after_chunks=2)
            Fault(kind='content_filtered', after_chunks=2)
            >>> Fault.content_filtered(prompt=True).status_code
            400
        """
        if isinstance(after_chunks, bool) or not isinstance(after_chunks, int) or after_chunks < 0:
            raise ValueError(f"after_chunks must be an integer >= 0; got {after_chunks!r}")
        if not isinstance(prompt, bool):
            raise TypeError(f"prompt must be True or False; got {prompt!r}")
        if prompt:
            return cls("content_filtered", status_code=400)
        return cls("content_filtered", after_chunks=after_chunks)

    @classmethod
    def error_event(cls, code: int = 529, after_chunks: int = 1) -> Fault:
        """Stream ``after_chunks`` content chunks, then the provider's own SSE error event
        for status ``code``, and end the stream there.

        What a provider does when it fails after the stream started: the response already
        said 200, so the failure travels in the body. Anthropic sends ``event: error``
        with its error body (``overloaded_error`` for 529, ``api_error`` for 500,
        ``rate_limit_error`` for 429); OpenAI a ``data:`` event whose object holds
        ``error`` (``type`` ``"server_error"`` for a 5xx); Bedrock an event-stream message
        of ``:message-type`` ``exception`` (``throttlingException`` for 429,
        ``serviceUnavailableException`` 503, ``modelStreamErrorException`` 424,
        ``validationException`` 400 and any other 4xx, ``internalServerException`` 500
        and any other 5xx). A non-streaming request gets the plain ``code`` answer, as
        [`status`][] sends it.

        Examples:
            >>> Fault.error_event(529, after_chunks=2)
            Fault(kind='error_event', status_code=529, after_chunks=2)
        """
        if isinstance(code, bool) or not isinstance(code, int) or not 400 <= code <= 599:
            raise ValueError(f"code must be an HTTP error status between 400 and 599; got {code!r}")
        if isinstance(after_chunks, bool) or not isinstance(after_chunks, int) or after_chunks < 0:
            raise ValueError(f"after_chunks must be an integer >= 0; got {after_chunks!r}")
        return cls("error_event", status_code=code, after_chunks=after_chunks)

    @classmethod
    def compacted(
        cls,
        *,
        input_tokens: int,
        output_tokens: int,
        cache_read: int = 0,
        cache_write_5m: int = 0,
        cache_write_1h: int = 0,
        summary: str | None = "Summary of the earlier conversation.",
    ) -> Fault:
        """Answer normally after Anthropic's server-side compaction summarised the
        conversation first (on the Anthropic route; every other route answers normally).

        The summarising step is billed apart: the answer's ``usage.iterations`` lists it
        as an entry of ``type: "compaction"`` with these counts (``cache_read``, and the
        cache writes split by lifetime, each an int >= 0), followed by the ``"message"``
        entry of the answer itself, whose counts the top-level usage repeats and which
        leave the compaction out. The iterations come in the body and, for a stream, in
        the final ``message_delta`` (its ``message_start`` reports the summarising step's
        input, as the API's does). The answer's content opens with the ``compaction``
        block the API sends, whose text is ``summary`` (a stream: ``content_block_start``
        and one ``compaction_delta`` at index 0, the answer's text at index 1);
        ``summary=None`` leaves the block out and keeps the usage, for clients that
        cannot parse the block.

        Examples:
            >>> Fault.compacted(input_tokens=100, output_tokens=131, cache_write_5m=55_096)
            Fault(kind='compacted', compaction={'input_tokens': 100, 'output_tokens': 131, \
'cache_read': 0, 'cache_write_5m': 55096, 'cache_write_1h': 0}, \
summary='Summary of the earlier conversation.')
        """
        counts = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_read": cache_read,
            "cache_write_5m": cache_write_5m,
            "cache_write_1h": cache_write_1h,
        }
        for option, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{option} must be an integer >= 0; got {value!r}")
        if summary is not None and not isinstance(summary, str):
            raise TypeError(f"summary must be a string or None; got {summary!r}")
        return cls("compacted", compaction=counts, summary=summary)

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
    #: Whether the request ended with an assistant message (a prefill to continue).
    prefilled: bool = False
