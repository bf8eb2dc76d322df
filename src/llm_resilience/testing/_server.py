"""A local HTTP server that answers like OpenAI and Anthropic and fails on cue.

It speaks enough of the OpenAI Chat Completions API (``POST /v1/chat/completions``) and
the Anthropic Messages API (``POST /v1/messages``) for the real SDK clients, and the
LangChain and LlamaIndex models built on them, to run against it unchanged. A script of
:class:`Fault` values decides, one per incoming request and in order, how each request is
answered; when the script is used up, requests get the normal answer (``default_fault``).

Everything runs on daemon threads, so a hanging request never keeps the process alive and
sync and async clients alike work inside a plain ``with`` block.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal, cast

__all__ = ["Fault", "FaultInjectingServer", "ServedRequest"]

logger = logging.getLogger(__name__)

FaultKind = Literal["ok", "status", "hang", "drop_mid_stream", "refuse", "slow"]
Provider = Literal["openai", "anthropic"]

# How often the accept loop looks at the stop flag: the worst case added to ``stop()``.
_POLL_INTERVAL = 0.02


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


class FaultInjectingServer:
    """A fake OpenAI + Anthropic endpoint on ``127.0.0.1`` that injects scripted faults.

    ::

        with FaultInjectingServer(reply="Paris is the capital of France.") as server:
            server.script(Fault.status(429), Fault.hang())
            model = ChatOpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0)
            # the first call gets a RateLimitError, the second hangs, the rest succeed

    Each request to ``/v1/chat/completions`` or ``/v1/messages`` takes the next fault of
    the script (thread-safe); when the script is empty it gets ``default_fault``
    (``Fault.ok()`` unless set). A normal answer is ``reply`` split into word chunks, with
    the model echoed from the request and rough usage: input tokens are the words of all
    message and system text, output tokens the number of reply chunks.

    Tool calls: when the request carries ``tools`` and its last message is the user's with
    the word ``weather`` in its text, the answer calls the first tool with the minimal
    arguments its schema requires (``"test"``, ``0``, ``false``, ``[]``, ``{}`` by type).
    A following request whose last message is a tool result gets the text reply, so agent
    loops end.

    ``stop()`` returns within a few hundredths of a second, hanging requests included;
    their connections are closed.
    """

    def __init__(
        self,
        reply: str = "Hello from the fault-injecting server.",
        *,
        name: str = "fault-server",
        default_fault: Fault | None = None,
    ) -> None:
        #: The text every normal answer carries.
        self.reply = reply
        #: A label for logs and ``repr``.
        self.name = name
        self._default_fault = default_fault or Fault.ok()
        self._lock = threading.Lock()
        self._script: deque[Fault] = deque()
        self._requests: list[ServedRequest] = []
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        where = f"port {self.port}" if self._httpd is not None else "not started"
        return f"FaultInjectingServer(name={self.name!r}, {where})"

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> FaultInjectingServer:
        """Bind a free port on 127.0.0.1 and serve from a daemon thread. Idempotent."""
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError(f"{self!r} was stopped; create a new server instead")
            if self._httpd is not None:
                return self
            httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
            httpd.owner = self
            self._httpd = httpd
            self._thread = threading.Thread(
                target=httpd.serve_forever,
                kwargs={"poll_interval": _POLL_INTERVAL},
                name=f"{self.name}-accept",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every open connection, hanging ones included. Idempotent."""
        self._stopping.set()
        with self._lock:
            httpd, self._httpd = self._httpd, None
            connections = list(self._connections)
            self._connections.clear()
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        for connection in connections:
            _close_abruptly(connection)
        if self._thread is not None:
            self._thread.join(timeout=1)

    def __enter__(self) -> FaultInjectingServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port; raises RuntimeError before ``start()``."""
        httpd = self._httpd
        if httpd is None:
            raise RuntimeError(f"{self.name}: server is not running; use `with` or start()")
        return int(httpd.server_address[1])

    @property
    def openai_base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, the ``base_url`` for OpenAI clients."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """``http://127.0.0.1:PORT``, the ``base_url`` for Anthropic clients."""
        return f"http://127.0.0.1:{self.port}"

    # -- the script --------------------------------------------------------------------

    def script(self, *faults: Fault) -> None:
        """Append ``faults`` to the script: one per incoming request, in order."""
        for fault in faults:
            if not isinstance(fault, Fault):
                raise TypeError(f"script takes Fault values; got {fault!r}")
        with self._lock:
            self._script.extend(faults)

    @property
    def pending(self) -> tuple[Fault, ...]:
        """The scripted faults not yet used."""
        with self._lock:
            return tuple(self._script)

    @property
    def default_fault(self) -> Fault:
        """What a request gets once the script is used up (``Fault.ok()`` by default)."""
        return self._default_fault

    @default_fault.setter
    def default_fault(self, fault: Fault) -> None:
        if not isinstance(fault, Fault):
            raise TypeError(f"default_fault must be a Fault; got {fault!r}")
        self._default_fault = fault

    @property
    def requests(self) -> list[ServedRequest]:
        """A copy of the records of every request served so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def reset(self) -> None:
        """Forget the remaining script and the request records; ``default_fault`` stays."""
        with self._lock:
            self._script.clear()
            self._requests.clear()

    # -- used by the handler -----------------------------------------------------------

    def _next_fault(self, record: ServedRequest) -> Fault:
        with self._lock:
            fault = self._script.popleft() if self._script else self._default_fault
            self._requests.append(dataclasses.replace(record, fault=fault))
        return fault

    def _track(self, connection: socket.socket, *, add: bool) -> bool:
        with self._lock:
            if add:
                if self._httpd is None:
                    return False
                self._connections.add(connection)
            else:
                self._connections.discard(connection)
        return True


def _close_abruptly(connection: socket.socket) -> None:
    # shutdown() wakes a thread blocked reading this socket and sends FIN at once,
    # which close() alone would not do while another thread still uses the socket.
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: FaultInjectingServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-answer is expected here; keep stderr quiet.
        logger.debug("connection from %s ended with an error", client_address, exc_info=True)


class _Stopped(Exception):
    """The server stopped while a request was being answered."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as separate writes; without this, Nagle's algorithm
        # meets the client's delayed ACK and every answer waits about 40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.server.owner._track(self.connection, add=True):
            # Accepted while stopping: nobody would close it later.
            self.close_connection = True
            _close_abruptly(self.connection)

    def finish(self) -> None:
        self.server.owner._track(self.connection, add=False)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        # The request line holds only method and path; never bodies.
        logger.debug("%s: " + format, self.server.owner.name, *args)

    def do_GET(self) -> None:
        self._read_body()
        self._send_json(404, {"error": {"message": "Not found", "type": "not_found"}})

    def do_POST(self) -> None:
        body = self._read_body()
        path = self.path.split("?", 1)[0].rstrip("/")
        provider: Provider
        if path.endswith("/chat/completions"):
            provider = "openai"
        elif path.endswith("/messages"):
            provider = "anthropic"
        else:
            error = {"message": f"Unknown path {path}", "type": "not_found"}
            self._send_json(404, {"error": error})
            return
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            self._send_json(400, _error_body(provider, 400))
            return
        owner = self.server.owner
        tool = _tool_to_call(provider, payload)
        record = ServedRequest(
            path=path,
            provider=provider,
            model=str(payload.get("model") or ""),
            stream=bool(payload.get("stream")),
            fault=Fault.ok(),
            tool_call=tool is not None,
            at=time.monotonic(),
        )
        fault = owner._next_fault(record)
        logger.debug("%s: %s %s -> %s", owner.name, provider, path, fault.kind)
        try:
            self._answer(provider, payload, record, tool, fault)
        except (_Stopped, OSError):
            self._drop()

    # -- answers -----------------------------------------------------------------------

    def _answer(
        self,
        provider: Provider,
        payload: dict[str, Any],
        record: ServedRequest,
        tool: _ToolCall | None,
        fault: Fault,
    ) -> None:
        stopping = self.server.owner._stopping
        if fault.kind == "status":
            self._send_status_fault(provider, fault)
            return
        if fault.kind == "refuse" or (fault.kind == "drop_mid_stream" and not record.stream):
            self._drop()
            return
        if fault.kind == "hang" and stopping.wait(fault.seconds):
            raise _Stopped
        answer = _Answer(provider, payload, self.server.owner.reply, tool)
        delay = fault.delay_per_chunk or 0.0
        if not record.stream:
            if delay and stopping.wait(delay * len(answer.pieces)):
                raise _Stopped
            self._send_json(200, answer.body(), provider=provider)
            return
        limit = fault.after_chunks if fault.kind == "drop_mid_stream" else None
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self._send_request_id(provider)
        self.end_headers()
        sent = 0
        for event, phase in answer.events():
            # A drop cuts before content chunk N+1, or before the tail when the reply
            # has N chunks or fewer: a drop fault never lets the stream complete.
            if limit is not None and (phase == "tail" or (phase == "content" and sent == limit)):
                self._drop()
                return
            if phase == "content":
                if delay and stopping.wait(delay):
                    raise _Stopped
                sent += 1
            self._write_chunk(event)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _send_status_fault(self, provider: Provider, fault: Fault) -> None:
        code = cast(int, fault.status_code)
        headers: dict[str, str] = {}
        if fault.retry_after is not None:
            headers["retry-after"] = _number(fault.retry_after)
        if fault.retry_after_ms is not None:
            headers["retry-after-ms"] = _number(fault.retry_after_ms)
        if isinstance(fault.body, str):
            self._send_bytes(code, fault.body.encode(), "text/plain; charset=utf-8", headers)
            return
        body = fault.body if fault.body is not None else _error_body(provider, code)
        self._send_json(code, body, provider=provider, headers=headers)

    # -- wire helpers ------------------------------------------------------------------

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_request_id(self, provider: Provider | None) -> None:
        if provider == "openai":
            self.send_header("x-request-id", f"req_{uuid.uuid4().hex}")
        elif provider == "anthropic":
            self.send_header("request-id", f"req_{uuid.uuid4().hex}")

    def _send_json(
        self,
        code: int,
        body: Mapping[str, Any],
        *,
        provider: Provider | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        data = json.dumps(body).encode()
        self._send_bytes(code, data, "application/json", headers, provider)

    def _send_bytes(
        self,
        code: int,
        data: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
        provider: Provider | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self._send_request_id(provider)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _write_chunk(self, data: bytes) -> None:
        # Our own chunk framing, so a drop can leave the body visibly unterminated.
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _drop(self) -> None:
        self.close_connection = True
        _close_abruptly(self.connection)


# -- provider shapes ---------------------------------------------------------------------


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


_OPENAI_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to use this model.", "invalid_request_error", None),
    404: ("The model does not exist.", "invalid_request_error", "model_not_found"),
    429: (
        "Rate limit reached for requests on the fault-injecting server. Please try again later.",
        "requests",
        "rate_limit_exceeded",
    ),
    500: ("The server had an error while processing your request.", "server_error", None),
    503: ("The server is overloaded or not ready yet.", "server_error", None),
}

_ANTHROPIC_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use this resource."),
    404: ("not_found_error", "The requested resource could not be found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
    500: ("api_error", "Internal server error"),
    503: ("api_error", "Service unavailable"),
    529: ("overloaded_error", "Overloaded"),
}


def _error_body(provider: Provider, code: int) -> dict[str, Any]:
    if provider == "openai":
        message, kind, error_code = _OPENAI_ERRORS.get(
            code,
            (
                f"Request failed with status {code}.",
                "server_error" if code >= 500 else "invalid_request_error",
                None,
            ),
        )
        return {"error": {"message": message, "type": kind, "param": None, "code": error_code}}
    fallback = ("api_error" if code >= 500 else "invalid_request_error", f"Status {code}")
    kind, message = _ANTHROPIC_ERRORS.get(code, fallback)
    return {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": f"req_{uuid.uuid4().hex}",
    }


def _texts(content: object) -> Iterator[str]:
    """The text parts of a message's content (a string or a list of typed blocks)."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                yield str(block.get("text") or "")


def _prompt_words(provider: Provider, payload: Mapping[str, Any]) -> int:
    texts: list[str] = []
    if provider == "anthropic":
        texts.extend(_texts(payload.get("system")))
    for message in payload.get("messages") or []:
        if isinstance(message, dict):
            texts.extend(_texts(message.get("content")))
    return max(1, sum(len(text.split()) for text in texts))


@dataclass(frozen=True, slots=True)
class _ToolCall:
    name: str
    arguments: dict[str, Any]


_WEATHER = re.compile(r"\bweather\b", re.IGNORECASE)


def _tool_to_call(provider: Provider, payload: Mapping[str, Any]) -> _ToolCall | None:
    tools = payload.get("tools")
    messages = payload.get("messages")
    if not tools or not isinstance(tools, list) or not messages or not isinstance(messages, list):
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    if not any(_WEATHER.search(text) for text in _texts(last.get("content"))):
        return None
    first: dict[str, Any] = tools[0] if isinstance(tools[0], dict) else {}
    if provider == "openai":
        nested = first.get("function")
        function: dict[str, Any] = nested if isinstance(nested, dict) else first
        name, schema = function.get("name"), function.get("parameters")
    else:
        name, schema = first.get("name"), first.get("input_schema")
    return _ToolCall(str(name or "tool"), _minimal_arguments(schema))


_PLACEHOLDERS: dict[str, Any] = {
    "string": "test",
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "object": {},
}


def _minimal_arguments(schema: object) -> dict[str, Any]:
    """A value for each required property of a JSON schema, by its type."""
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties") or {}
    arguments: dict[str, Any] = {}
    for name in schema.get("required") or []:
        spec = properties.get(name) if isinstance(properties, dict) else None
        spec = spec if isinstance(spec, dict) else {}
        if spec.get("enum"):
            arguments[name] = spec["enum"][0]
            continue
        kind = spec.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        arguments[name] = _PLACEHOLDERS.get(str(kind), "test")
    return arguments


def _word_chunks(text: str) -> list[str]:
    """Split ``text`` into words with their leading spaces; joined they give ``text`` back."""
    chunks: list[str] = re.findall(r"\s*\S+", text)
    rest = text[len("".join(chunks)) :]
    if rest:
        if chunks:
            chunks[-1] += rest
        else:
            chunks.append(rest)
    return chunks


_Phase = Literal["head", "content", "tail"]


class _Answer:
    """The normal answer to one request, as one JSON body or as SSE events."""

    def __init__(
        self, provider: Provider, payload: Mapping[str, Any], reply: str, tool: _ToolCall | None
    ) -> None:
        self.provider = provider
        self.payload = payload
        self.tool = tool
        self.model = str(payload.get("model") or "fault-server-model")
        self.text = reply
        self.pieces = (
            _word_chunks(json.dumps(tool.arguments)) if tool is not None else _word_chunks(reply)
        )
        self.input_tokens = _prompt_words(provider, payload)
        self.output_tokens = max(1, len(self.pieces))
        self.created = int(time.time())
        prefix = "chatcmpl-" if provider == "openai" else "msg_"
        self.id = prefix + uuid.uuid4().hex[:24]
        self.tool_id = ("call_" if provider == "openai" else "toolu_") + uuid.uuid4().hex[:24]

    def body(self) -> dict[str, Any]:
        return self._openai_body() if self.provider == "openai" else self._anthropic_body()

    def events(self) -> Iterator[tuple[bytes, _Phase]]:
        """SSE events, each with its phase: before, within or after the content chunks."""
        if self.provider == "openai":
            return self._openai_events()
        return self._anthropic_events()

    # -- OpenAI ------------------------------------------------------------------------

    def _openai_usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.input_tokens + self.output_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _openai_envelope(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "service_tier": "default",
            "system_fingerprint": "fp_fault_server",
        }

    def _openai_body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "refusal": None, "annotations": []}
        if self.tool is not None:
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": self.tool_id,
                    "type": "function",
                    "function": {
                        "name": self.tool.name,
                        "arguments": json.dumps(self.tool.arguments),
                    },
                }
            ]
        else:
            message["content"] = self.text
        return {
            **self._openai_envelope("chat.completion"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if self.tool is not None else "stop",
                }
            ],
            "usage": self._openai_usage(),
        }

    def _openai_events(self) -> Iterator[tuple[bytes, _Phase]]:
        options = self.payload.get("stream_options")
        with_usage = isinstance(options, dict) and bool(options.get("include_usage"))

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {
                **self._openai_envelope("chat.completion.chunk"),
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if with_usage:
                data["usage"] = None
            return _sse(data)

        if self.tool is not None:
            call = {
                "index": 0,
                "id": self.tool_id,
                "type": "function",
                "function": {"name": self.tool.name, "arguments": ""},
            }
            yield chunk({"role": "assistant", "content": None, "tool_calls": [call]}), "head"
            for piece in self.pieces:
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                yield chunk(delta), "content"
            yield chunk({}, "tool_calls"), "tail"
        else:
            yield chunk({"role": "assistant", "content": "", "refusal": None}), "head"
            for piece in self.pieces:
                yield chunk({"content": piece}), "content"
            yield chunk({}, "stop"), "tail"
        if with_usage:
            final = {
                **self._openai_envelope("chat.completion.chunk"),
                "choices": [],
                "usage": self._openai_usage(),
            }
            yield _sse(final), "tail"
        yield b"data: [DONE]\n\n", "tail"

    # -- Anthropic ---------------------------------------------------------------------

    def _anthropic_usage(self, output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }

    def _anthropic_block(self, *, streaming: bool) -> dict[str, Any]:
        if self.tool is not None:
            return {
                "type": "tool_use",
                "id": self.tool_id,
                "name": self.tool.name,
                "input": {} if streaming else self.tool.arguments,
            }
        return {"type": "text", "text": "" if streaming else self.text}

    def _anthropic_message(self, *, streaming: bool) -> dict[str, Any]:
        done = not streaming
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [self._anthropic_block(streaming=False)] if done else [],
            "stop_reason": (("tool_use" if self.tool else "end_turn") if done else None),
            "stop_sequence": None,
            "usage": self._anthropic_usage(self.output_tokens if done else 1),
        }

    def _anthropic_body(self) -> dict[str, Any]:
        return self._anthropic_message(streaming=False)

    def _anthropic_events(self) -> Iterator[tuple[bytes, _Phase]]:
        def event(data: dict[str, Any]) -> bytes:
            return b"event: %s\n" % str(data["type"]).encode() + _sse(data)

        message = self._anthropic_message(streaming=True)
        yield event({"type": "message_start", "message": message}), "head"
        block = self._anthropic_block(streaming=True)
        yield event({"type": "content_block_start", "index": 0, "content_block": block}), "head"
        yield event({"type": "ping"}), "head"
        for piece in self.pieces:
            if self.tool is not None:
                delta = {"type": "input_json_delta", "partial_json": piece}
            else:
                delta = {"type": "text_delta", "text": piece}
            yield event({"type": "content_block_delta", "index": 0, "delta": delta}), "content"
        yield event({"type": "content_block_stop", "index": 0}), "tail"
        stop_reason = "tool_use" if self.tool is not None else "end_turn"
        yield (
            event(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    # Cumulative, as the API sends it now; LangChain reads input here.
                    "usage": self._anthropic_usage(self.output_tokens),
                }
            ),
            "tail",
        )
        yield event({"type": "message_stop"}), "tail"


def _sse(data: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"
