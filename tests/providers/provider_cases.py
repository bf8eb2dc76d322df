"""The provider conformance matrix: every failure, how each provider sends it, and what a
fallback chain does with it under the default classifier and the server-errors preset.

``test_matrix.py`` runs every cell listed here against real clients; ``render_providers.py`` writes
``docs/providers.md`` from the same lists, so the page cannot claim what no test proves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from provider_surfaces import ROWS, Row

from llm_resilience.testing import Fault
from llm_resilience.testing._wire_mistral import MISTRAL_CAPACITY_EXCEEDED

Mode = Literal["call", "stream-before", "stream-after"]
Outcome = Literal["falls back", "propagates"]
Classifier = Literal["default", "server-errors"]
# Special targets: the member points at no server at all.
Target = Literal["server", "refused", "dns"]

MODES: tuple[Mode, ...] = ("call", "stream-before", "stream-after")
MODE_TITLES: dict[Mode, str] = {
    "call": "call",
    "stream-before": "stream, before the first chunk",
    "stream-after": "stream, after the first chunk",
}
CLASSIFIERS: tuple[Classifier, ...] = ("default", "server-errors")
#: The client timeout of a read-timeout cell; every other cell's member waits 10 s.
READ_TIMEOUT = 0.2
TIMEOUT = 10.0
#: Content chunks a stream delivers before an after-the-first-chunk failure.
DELIVERED = 2

# -- Azure OpenAI's own error bodies ------------------------------------------------------

_AZURE_429 = {
    "error": {
        "code": "429",
        "message": (
            "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version "
            "2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing "
            "tier. Please retry after 1 second."
        ),
    }
}
_AZURE_401 = {
    "error": {
        "code": "401",
        "message": (
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure "
            "to provide a valid key for an active subscription and use a correct regional "
            "API endpoint for your resource."
        ),
    }
}
_AZURE_404 = {
    "error": {
        "code": "DeploymentNotFound",
        "message": (
            "The API deployment for this resource does not exist. If you created the "
            "deployment within the last 5 minutes, please wait a moment and try again."
        ),
    }
}
_OPENAI_OVERLOADED = {
    "error": {
        "message": "The engine is currently overloaded, please try again later.",
        "type": "server_error",
        "param": None,
        "code": None,
    }
}


# -- Bedrock's own error codes (sent as ``x-amzn-ErrorType``) -------------------------------

_BEDROCK_NOT_READY = {
    "__type": "ModelNotReadyException",
    "message": "Model is not ready to serve inference requests. Try your request again later.",
}
_BEDROCK_BAD_KEY = {
    "__type": "UnrecognizedClientException",
    "message": "The security token included in the request is invalid.",
}


# -- Gemini's own answers -----------------------------------------------------------------

# A bad API key: Gemini answers 400 INVALID_ARGUMENT (not 401), reason API_KEY_INVALID.
_GEMINI_BAD_KEY = {
    "error": {
        "code": 400,
        "message": "API key not valid. Please pass a valid API key.",
        "status": "INVALID_ARGUMENT",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            }
        ],
    }
}
# A 502 comes from Google's front end, as an HTML page, not as a google.rpc.Status.
_GOOGLE_502 = (
    "<!DOCTYPE html>\n<html lang=en>\n  <meta charset=utf-8>\n"
    "  <title>Error 502 (Server Error)!!1</title>\n"
    "  <p><b>502.</b> <ins>That's an error.</ins>\n"
    "  <p>The server encountered a temporary error and could not complete your request."
    "<p>Please try again in 30 seconds.  <ins>That's all we know.</ins>\n"
)


# -- Groq's front end ----------------------------------------------------------------------


# Groq's API sits behind Cloudflare: a bad gateway or a gateway timeout is its HTML page.
def _cloudflare_page(code: int, title: str) -> str:
    return (
        f"<html>\r\n<head><title>{code} {title}</title></head>\r\n<body>\r\n"
        f"<center><h1>{code} {title}</h1></center>\r\n<hr><center>cloudflare</center>\r\n"
        "</body>\r\n</html>\r\n"
    )


_CLOUDFLARE_502 = _cloudflare_page(502, "Bad Gateway")
_CLOUDFLARE_504 = _cloudflare_page(504, "Gateway Time-out")


# -- Ollama's own answers -----------------------------------------------------------------

# A cloud model (``:cloud``) proxied to ollama.com without a signed-in key: Ollama's
# ``server/cloud_proxy.go`` answers 401 "unauthorized" with the URL to sign in at.
_OLLAMA_UNAUTHORIZED = {
    "error": "unauthorized",
    "signin_url": "https://ollama.com/connect?name=host&key=sk-FAKE-ollama",
}
# A 504 comes from a reverse proxy in front of Ollama: nginx's own page, not JSON.
_NGINX_504 = (
    "<html>\r\n<head><title>504 Gateway Time-out</title></head>\r\n<body>\r\n"
    "<center><h1>504 Gateway Time-out</h1></center>\r\n<hr><center>nginx</center>\r\n"
    "</body>\r\n</html>\r\n"
)


@dataclass(frozen=True, slots=True)
class Column:
    """One kind of failure, as each provider sends it."""

    key: str
    title: str
    #: ``fault(row, mode)``: the scripted fault, or None where it cannot happen.
    fault: Callable[[Row, Mode], Fault | None]
    #: The expected outcome under each classifier; a mapping gives it per provider.
    default: Outcome | Mapping[str, Outcome]
    server_errors: Outcome | Mapping[str, Outcome]
    #: Where the failing member points.
    target: Target = "server"
    #: The failing member's client timeout.
    timeout: float = TIMEOUT
    #: The status the propagated error carries (checked with ``status_code_of``); a
    #: mapping gives it per provider.
    status: int | Mapping[str, int] | None = None
    #: What the provider sends, for the table's notes.
    note: str = ""

    def expected(self, classifier: Classifier, row: Row) -> Outcome:
        outcome = self.default if classifier == "default" else self.server_errors
        return outcome if isinstance(outcome, str) else outcome[row.provider]

    def status_for(self, row: Row) -> int | None:
        status = self.status
        return status if status is None or isinstance(status, int) else status[row.provider]


def _status(code: int, **options: Any) -> Callable[[Row, Mode], Fault | None]:
    """A plain status answer; a stream gets it before any chunk."""

    def fault(row: Row, mode: Mode) -> Fault | None:
        return None if mode == "stream-after" else Fault.status(code, **options)

    return fault


def _azure_or(
    azure: Callable[[Row, Mode], Fault | None], other: Callable[[Row, Mode], Fault | None]
) -> Callable[[Row, Mode], Fault | None]:
    return lambda row, mode: (azure if row.provider == "Azure OpenAI" else other)(row, mode)


def _per_wire(
    other: Callable[[Row, Mode], Fault | None], **by_wire: Callable[[Row, Mode], Fault | None]
) -> Callable[[Row, Mode], Fault | None]:
    """The fault of the row's wire where ``by_wire`` names it (``bedrock=...``), else
    ``other``."""
    return lambda row, mode: by_wire.get(row.wire, other)(row, mode)


def _before_stream(
    fault: Callable[[Row, Mode], Fault | None],
) -> Callable[[Row, Mode], Fault | None]:
    """``fault`` for a call and before a stream starts; nothing after its first chunk."""
    return lambda row, mode: None if mode == "stream-after" else fault(row, mode)


def _never(row: Row, mode: Mode) -> Fault | None:
    return None


def _bedrock_stream_exception(code: int) -> Callable[[Row, Mode], Fault | None]:
    """Bedrock: the status before a stream starts; after its first chunk, the stream's own
    exception message for it (``throttlingException``, ``serviceUnavailableException``,
    ``validationException``), which botocore raises as an ``EventStreamError``."""

    def fault(row: Row, mode: Mode) -> Fault | None:
        if mode == "stream-after":
            return Fault.error_event(code, after_chunks=DELIVERED)
        return Fault.status(code)

    return fault


def _model_stream_error(row: Row, mode: Mode) -> Fault | None:
    # Bedrock's ``modelStreamErrorException``: the model failed after its stream started.
    if row.wire == "bedrock" and mode == "stream-after":
        return Fault.error_event(424, after_chunks=DELIVERED)
    return None


def _rate_limited_with_retry_after(row: Row, mode: Mode) -> Fault | None:
    if mode == "stream-after":
        return None
    if row.provider == "Azure OpenAI":
        return Fault.status(429, retry_after=1, retry_after_ms=1000, body=_AZURE_429)
    return Fault.status(429, retry_after=1)


def _overloaded(row: Row, mode: Mode) -> Fault | None:
    if row.wire == "anthropic":
        if mode == "stream-after":
            return Fault.error_event(529, after_chunks=DELIVERED)
        return Fault.status(529)
    if mode == "stream-after":
        return None
    if row.wire == "bedrock":
        return Fault.status(429, body=_BEDROCK_NOT_READY)
    if row.wire in ("gemini", "cohere"):
        # Gemini's own 503 UNAVAILABLE: "The model is overloaded. Please try again later."
        # Cohere has no overload status of its own: a 503 (ServiceUnavailableError).
        return Fault.status(503)
    if row.wire == "mistral":
        # Mistral's own: a 429 whose type is service_tier_capacity_exceeded (code 3505).
        return Fault.status(429, body=MISTRAL_CAPACITY_EXCEEDED)
    if row.wire == "groq":
        # Groq's own code: 498, its flex tier at capacity (``capacity_exceeded``).
        return Fault.status(498)
    if row.wire == "ollama":
        # Ollama's own: a 503 "server busy, please try again.  maximum pending requests
        # exceeded" when more requests wait than OLLAMA_MAX_QUEUE allows.
        return Fault.status(503)
    if row.provider == "Azure OpenAI":
        return Fault.status(429, retry_after_ms=1000, body=_AZURE_429)
    return Fault.status(503, body=_OPENAI_OVERLOADED)


def _server_error(row: Row, mode: Mode) -> Fault | None:
    if mode == "stream-after" and row.wire == "cohere":
        # Cohere has no error event: a failed generation ends its stream with
        # ``message-end`` ``finish_reason: ERROR``, which nothing raises at.
        return None
    if mode == "stream-after":
        return Fault.error_event(500, after_chunks=DELIVERED)
    return Fault.status(500)


def _read_timeout(row: Row, mode: Mode) -> Fault | None:
    if mode == "call":
        return Fault.hang()
    if mode == "stream-before":
        return Fault.slow_first_token(30)
    return Fault.stall_mid_stream(after_chunks=DELIVERED)


def _dropped(row: Row, mode: Mode) -> Fault | None:
    return Fault.drop_mid_stream(after_chunks=DELIVERED if mode == "stream-after" else 0)


def _no_server(row: Row, mode: Mode) -> Fault | None:
    return Fault.ok() if mode != "stream-after" else None


def _context(row: Row, mode: Mode) -> Fault | None:
    # Ollama truncates a prompt longer than its context window and answers 200.
    if mode == "stream-after" or row.wire == "ollama":
        return None
    return Fault.context_length_exceeded(row.wire)


def _filtered(row: Row, mode: Mode) -> Fault | None:
    return None if mode == "stream-after" else Fault.content_filtered(prompt=True)


COLUMNS: tuple[Column, ...] = (
    Column(
        "429", "rate limited (429)",
        _per_wire(
            _azure_or(_status(429, body=_AZURE_429), _status(429)),
            bedrock=_bedrock_stream_exception(429),
        ),
        "falls back", "falls back",
        note=(
            "Azure: its own body (`code` \"429\"); Bedrock: `ThrottlingException` (mid-stream: "
            "the event stream's `throttlingException`); Gemini: `RESOURCE_EXHAUSTED` with a "
            "`RetryInfo` detail, `retryDelay` \"7s\"; Groq: type `requests`, code "
            "`rate_limit_exceeded`. Ollama itself never sends a 429: a "
            "proxy in front of it does, or ollama.com behind a cloud model, whose status and "
            "headers Ollama passes on."
        ),
    ),
    Column(
        "429-retry-after", "rate limited (429 + `Retry-After`)", _rate_limited_with_retry_after,
        "falls back", "falls back",
        note=(
            "`retry-after: 1`; Azure adds `retry-after-ms: 1000`. Ollama sends no "
            "`Retry-After` of its own (only a proxy or ollama.com would)."
        ),
    ),
    Column(
        "503", "unavailable (503)", _per_wire(_status(503), bedrock=_bedrock_stream_exception(503)),
        "falls back", "falls back",
        note=(
            "Bedrock: `ServiceUnavailableException` (mid-stream: "
            "`serviceUnavailableException`); Gemini: `UNAVAILABLE`; Groq: \"is currently over "
            "capacity\", code `service_unavailable`; "
            "Ollama: its \"server busy\" (the only 503 it sends)."
        ),
    ),
    Column(
        "overloaded", "overloaded", _overloaded,
        {
            "OpenAI": "falls back", "Azure OpenAI": "falls back", "Anthropic": "propagates",
            "AWS Bedrock": "falls back", "Google Gemini": "falls back", "Mistral": "falls back",
            "Groq": "falls back", "Ollama": "falls back",
            "Cohere": "falls back",
        },
        "falls back", status=529,
        note=(
            "Anthropic: 529 `overloaded_error` (mid-stream: its `error` event); OpenAI: 503 "
            "\"engine is currently overloaded\"; Azure: 429 with `retry-after-ms` (a "
            "provisioned deployment at capacity); Bedrock: 429 `ModelNotReadyException`; "
            "Gemini: 503 `UNAVAILABLE` \"The model is overloaded\"; Mistral: 429 "
            "`service_tier_capacity_exceeded` (code \"3505\"); Groq: 498 `capacity_exceeded` "
            "(its flex tier at capacity), which counts as a 503; "
            "Ollama: 503 \"server busy, please try again.  maximum pending requests exceeded\" "
            "(its queue, `OLLAMA_MAX_QUEUE`, is full); Cohere: none of its own, a 503 "
            "(`ServiceUnavailableError`)."
        ),
    ),
    Column(
        "500", "server error (500)", _per_wire(_server_error, mistral=_before_stream(_server_error)),
        "propagates", "falls back", status=500,
        note=(
            "Mid-stream: Anthropic's `error` event (`api_error`), OpenAI's `error` object "
            "(`server_error`) on the 200 stream, Gemini's `{\"error\": ...}` event (`INTERNAL`), "
            "Bedrock's `internalServerException` message in its event stream, Groq's "
            "`data:` event holding its error object (`internal_server_error`). "
            "Bedrock: `InternalServerException`; Gemini: `INTERNAL`. Mistral documents no "
            "in-stream error event (a failure mid-stream is a cut connection, the dropped "
            "column). Ollama: `{\"error\": ...}` for any failure it has no status for (a "
            "model runner that crashed: \"llama runner process has terminated\"); mid-stream, "
            "an `{\"error\": ...}` line, which the ollama SDK raises as a `ResponseError` with "
            "no status (`status_code` -1) and which counts as a 500. Cohere sends no error "
            "mid-stream: a failed generation ends with `message-end` `finish_reason` "
            "`ERROR`, which the SDK yields as a normal event, so that cell is \"—\"."
        ),
    ),
    Column(
        "502", "bad gateway (502)",
        _per_wire(
            _status(502),
            groq=_status(502, body=_CLOUDFLARE_502),
            gemini=_status(502, body=_GOOGLE_502),
        ),
        "propagates", "falls back", status=502,
        note=(
            "Bedrock: a gateway's 502 with no AWS error code; Gemini: Google's front end's "
            "HTML error page; Groq: Cloudflare's HTML page (its API sits behind "
            "Cloudflare); Ollama: the 502 its cloud proxy sends when ollama.com cannot be "
            "reached (or a reverse proxy's)."
        ),
    ),
    Column(
        "504", "gateway timeout (504)",
        _per_wire(
            _status(504),
            groq=_status(504, body=_CLOUDFLARE_504),
            bedrock=_status(408, body={"__type": "ModelTimeoutException"}),
            ollama=_status(504, body=_NGINX_504),
        ),
        "propagates", "falls back", status=504,
        note=(
            "Bedrock: its own timeout, 408 `ModelTimeoutException`, which counts as a 504 "
            "(like Anthropic's `timeout_error`). Gemini: `DEADLINE_EXCEEDED`. Groq: "
            "Cloudflare's \"504 Gateway Time-out\" page. Ollama sends none: a reverse proxy in "
            "front of it does (nginx's \"504 Gateway Time-out\" page)."
        ),
    ),
    Column(
        "refused", "connection refused", _no_server, "falls back", "falls back",
        target="refused", note="A closed port on 127.0.0.1.",
    ),
    Column(
        "dns", "DNS failure", _no_server, "falls back", "falls back", target="dns",
        note="The host `nonexistent.invalid`, which never resolves.",
    ),
    Column(
        "read-timeout", "read timeout", _read_timeout, "falls back", "falls back",
        timeout=READ_TIMEOUT,
        note=(
            f"The client's own {READ_TIMEOUT} s timeout: no response; a 200 stream whose "
            "first token never comes; a stream silent after two chunks."
        ),
    ),
    Column(
        "dropped", "connection dropped", _dropped, "falls back", "falls back",
        note="A call: closed before any response; a stream: body cut, never terminated.",
    ),
    Column(
        "model-stream-error", "model stream error", _model_stream_error,
        "falls back", "falls back",
        note=(
            "Bedrock only: the event stream's `modelStreamErrorException` (the model failed "
            "after its stream started; the service model says to retry the request), which "
            "counts as a 503."
        ),
    ),
    Column(
        "400", "bad request (400)", _per_wire(_status(400), bedrock=_bedrock_stream_exception(400)),
        "propagates", "propagates", status=400,
        note="Bedrock: `ValidationException` (mid-stream: `validationException`).",
    ),
    Column(
        "401", "unauthorised (401)",
        _per_wire(
            _azure_or(_status(401, body=_AZURE_401), _status(401)),
            bedrock=_status(403, body=_BEDROCK_BAD_KEY),
            gemini=_status(400, body=_GEMINI_BAD_KEY),
            ollama=_status(401, body=_OLLAMA_UNAUTHORIZED),
        ),
        "propagates", "propagates",
        status={
            "OpenAI": 401, "Azure OpenAI": 401, "Anthropic": 401, "AWS Bedrock": 403,
            "Google Gemini": 400, "Mistral": 401, "Groq": 401, "Ollama": 401, "Cohere": 401,
        },
        note=(
            "Bedrock: a bad key is a 403 `UnrecognizedClientException`; Gemini: a 400 "
            "`INVALID_ARGUMENT` \"API key not valid\" (reason `API_KEY_INVALID`); Mistral: "
            "its gateway's `{\"message\": \"Unauthorized\"}`. Ollama takes no API key: its "
            "401 is a cloud model's (\"unauthorized\" with a `signin_url`) or an "
            "authenticating proxy's."
        ),
    ),
    Column(
        "403", "forbidden (403)", _status(403), "propagates", "propagates", status=403,
        note=(
            "Bedrock: `AccessDeniedException`; Gemini: `PERMISSION_DENIED`; Ollama: a cloud "
            "model while cloud use is disabled, or a proxy's."
        ),
    ),
    Column(
        "404", "not found (404)",
        _azure_or(_status(404, body=_AZURE_404), _status(404)),
        "propagates", "propagates", status=404,
        note=(
            "Azure: `DeploymentNotFound`; Bedrock: `ResourceNotFoundException`; Gemini: "
            "`NOT_FOUND`; Ollama: `model \"llama3.2\" not found, try pulling it first`."
        ),
    ),
    Column(
        "context", "context too long", _context, "propagates", "propagates", status=400,
        note=(
            "OpenAI/Azure: `context_length_exceeded`; Anthropic: \"prompt is too long\"; "
            "Bedrock: `ValidationException` \"Input is too long for requested model.\"; "
            "Gemini: `INVALID_ARGUMENT` \"The input token count (N) exceeds the maximum "
            "number of tokens allowed (M).\"; Mistral: \"Prompt contains N tokens and 0 draft "
            "tokens, too large for model with M maximum context length\"; Groq: "
            "`context_length_exceeded` \"Please reduce the length of the messages or "
            "completion.\" Ollama has no such error: a prompt longer than its context window "
            "(`num_ctx`) is truncated, the server logs \"truncating input prompt\", and the "
            "answer is a 200 (hence \"—\"). Cohere: \"too many tokens: total number of tokens "
            "in the prompt cannot exceed M - received N.\""
        ),
    ),
    Column(
        "content-filter", "content filtered",
        _per_wire(
            _filtered,
            mistral=_never, groq=_never, bedrock=_never, gemini=_never, ollama=_never,
            cohere=_never,
        ),
        "propagates", "propagates", status=400,
        note=(
            "Azure's 400 `content_filter` with `innererror.code` "
            "`ResponsibleAIPolicyViolation`. Bedrock has no such error: a guardrail answers "
            "200 with `stopReason` `guardrail_intervened`; nor has Gemini: a blocked prompt "
            "is a 200 with `promptFeedback.blockReason` `SAFETY` and no candidates, a "
            "blocked answer a candidate with `finishReason` `SAFETY`. Mistral filters nothing "
            "unless a request asks for `guardrails` (moderation), whose blocked answer its "
            "SDK declares no shape for: no cell. Nor has Groq: it filters no chat content "
            "itself (moderation is a model the caller runs, Llama Guard). Ollama has no "
            "content filter. Nor has Cohere: its safety modes steer the answer in the "
            "prompt, and no status or finish reason says a filter fired."
        ),
    ),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Cell:
    row: Row
    column: Column
    mode: Mode
    fault: Fault

    @property
    def id(self) -> str:
        return f"{self.row.key}-{self.column.key}-{self.mode}"


#: The cells the async paths (``ainvoke``/``astream``, ``achat``/``astream_chat``, the
#: SDKs' async clients) run too: each outcome, before and after a stream's start.
ASYNC_CELLS: frozenset[tuple[str, Mode]] = frozenset(
    {
        ("429", "call"),
        ("429", "stream-before"),
        ("500", "call"),
        ("500", "stream-before"),
        ("500", "stream-after"),
        ("dropped", "stream-after"),
        ("400", "call"),
    }
)


def async_cells() -> list[Cell]:
    return [
        cell
        for cell in cells()
        if (cell.column.key, cell.mode) in ASYNC_CELLS and cell.row.acall is not None
    ]


def classifiers_to_prove(cell: Cell, *, every: bool) -> tuple[Classifier, ...]:
    """Both classifiers; or, unless ``every``, only the default where they agree."""
    column, row = cell.column, cell.row
    if every or column.expected("default", row) != column.expected("server-errors", row):
        return CLASSIFIERS
    return ("default",)


def cells() -> list[Cell]:
    """Every (row, column, mode) where the failure can happen, in table order."""
    found: list[Cell] = []
    for row in ROWS:
        for column in COLUMNS:
            for mode in MODES:
                if mode != "call" and row.stream is None:
                    continue
                fault = column.fault(row, mode)
                if fault is not None:
                    found.append(Cell(row, column, mode, fault))
    return found
