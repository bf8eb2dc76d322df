"""A local HTTP server that answers like OpenAI, Anthropic, Bedrock, Gemini, Mistral, Groq,
Ollama and Cohere and fails on cue.

It speaks enough of the OpenAI Chat Completions API (``POST /v1/chat/completions``), the
Anthropic Messages API (``POST /v1/messages``), AWS Bedrock Runtime's Converse API
(``POST /model/{modelId}/converse``, and ``converse-stream`` as a binary AWS event
stream), the Gemini API
(``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent?alt=sse``)
and Mistral's chat API (``POST /v1/chat/completions`` under the prefix ``/mistral``, as
OpenAI's path is the same) and Groq's (``POST /openai/v1/chat/completions``: OpenAI's
API with Groq's errors, its 498 and ``x_groq``),
and Ollama's native chat API (``POST /api/chat``, streamed as newline-delimited JSON),
and Cohere's Chat API (``POST /v2/chat``, and v1's ``POST /v1/chat``; ``_wire_cohere``)
for the real SDK clients, and the
LangChain and LlamaIndex models built on them, to run against it unchanged. A script of
[`Fault`][] values decides, one per incoming request and in order, how each request is
answered; when the script is used up, requests get the normal answer (``default_fault``).

Everything runs on daemon threads, so a hanging request never keeps the process alive and
sync and async clients alike work inside a plain ``with`` block. The faults are defined
in ``_faults``; each provider's wire format is a module of its own (``_wire_openai``,
``_wire_anthropic``, ...), found through the table in ``_wire``; this module serves them
and never asks a provider's name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, cast

from llm_resilience.testing._faults import Fault, FaultKind, Provider, ServedRequest
from llm_resilience.testing._wire import wire_for_path
from llm_resilience.testing._wire_base import (
    Answer,
    ToolCall,
    Wire,
    number,
    prefill_of,
    tool_to_call,
    usage_details_option,
)
from llm_resilience.testing._wire_mistral import MISTRAL_PREFIX

__all__ = ["Fault", "FaultInjectingServer", "FaultKind", "Provider", "ServedRequest"]

logger = logging.getLogger(__name__)

# How often the accept loop looks at the stop flag: the worst case added to ``stop()``.
_POLL_INTERVAL = 0.02


class FaultInjectingServer:
    """A fake OpenAI + Anthropic endpoint on ``127.0.0.1`` that injects scripted faults.

    ```python
    with FaultInjectingServer(reply="Paris is the capital of France.") as server:
        server.script(Fault.status(429), Fault.hang())
        model = ChatOpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0)
        # the first call gets a RateLimitError, the second hangs, the rest succeed
    ```

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

    Structured output: an OpenAI request with ``response_format`` of type ``json_schema``
    (what ``ChatOpenAI(...).with_structured_output(Schema)`` sends by default) gets, instead
    of ``reply``, JSON content that satisfies the schema: the required properties of each
    object, one item per array (or ``minItems``), the first ``enum`` or ``anyOf`` choice,
    numbers inside their bounds, ``"test"`` for strings.

    Assistant prefill: a request whose last message is the assistant's is answered
    with the rest of ``reply`` after that text (as Anthropic, and the OpenAI-compatible
    servers that continue a final assistant message, do), so the prefill and the answer
    joined are ``reply``; a prefill that is not the start of ``reply`` gets all of it.
    On the Anthropic route a prefill ending in whitespace gets Anthropic's 400 ("final
    assistant content cannot end with trailing whitespace").
    [`Fault.prefill_rejected`][] plays a model that takes no prefill at all.

    Prompt caching and reasoning: ``usage_details`` (e.g. ``{"cache_read": 900,
    "cache_write_5m": 100, "cache_write_1h": 50, "reasoning": 7}``, every key optional,
    each an int >= 0) makes every normal answer report those tokens as the provider does,
    on top of the rough usage above: OpenAI adds the cache tokens to ``prompt_tokens``
    (``prompt_tokens_details.cached_tokens``; writes, which OpenAI does not report, as
    ``cache_write_tokens`` there) and the reasoning tokens to ``completion_tokens``
    (``completion_tokens_details.reasoning_tokens``), in the body and in a stream's final
    usage chunk; Anthropic keeps ``input_tokens`` uncached and reports
    ``cache_read_input_tokens``, ``cache_creation_input_tokens`` with its ``cache_creation``
    split by lifetime, and the reasoning inside ``output_tokens``
    (``output_tokens_details.thinking_tokens``), in the body, ``message_start`` (input side)
    and ``message_delta`` (all of it, cumulative); Bedrock keeps ``inputTokens`` uncached
    too and reports ``cacheReadInputTokens``, ``cacheWriteInputTokens`` (split by lifetime
    in ``cacheDetails``) and the reasoning inside ``outputTokens``, in the Converse body
    and a stream's ``metadata`` event; Mistral's usage has no cache or reasoning counts, so
    its ``completion_tokens`` include the reasoning and nothing else is reported; Groq as
    OpenAI does, less the cache writes it does not report, in the body and in a stream's
    last ``x_groq.usage``; Ollama reports no split: the reasoning is inside
    ``eval_count``, and the cache reads are not counted at all (``prompt_eval_count`` is
    the prompt words alone), in a call and a stream's ``done`` line. The attribute can be
    changed between requests.

    ``stop()`` returns within a few hundredths of a second, hanging requests included;
    their connections are closed.
    """

    def __init__(
        self,
        reply: str = "Hello from the fault-injecting server.",
        *,
        name: str = "fault-server",
        default_fault: Fault | None = None,
        usage_details: Mapping[str, int] | None = None,
    ) -> None:
        #: The text every normal answer carries.
        self.reply = reply
        #: Cache and reasoning tokens every normal answer reports (see the class docs).
        self.usage_details = usage_details_option(usage_details)
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

    @property
    def mistral_base_url(self) -> str:
        """``http://127.0.0.1:PORT/mistral``, the ``server_url`` for ``mistralai.Mistral``
        (LangChain's ``ChatMistralAI`` takes it with ``/v1`` as its ``endpoint``)."""
        return f"http://127.0.0.1:{self.port}{MISTRAL_PREFIX}"

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
    # socketserver's default backlog of 5 overflows under a burst of concurrent calls:
    # the kernel then drops connections' handshakes and the clients wait out its SYN-ACK
    # retransmits (1, 2, 4, 8 s...), which reads as a provider that hangs. A provider's
    # real front end never does that.
    request_queue_size = 1024
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
        found = wire_for_path(path)
        if found is None:
            error = {"message": f"Unknown path {path}", "type": "not_found"}
            self._send_json(404, {"error": error})
            return
        # Gemini and Bedrock name the model and a stream in the path, not in the body.
        wire, route = found
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            self._send_json(400, wire.error_body(400))
            return
        if wire.model_from_path and route.model:
            # Gemini names the model in the path; its answer's ``modelVersion`` repeats it.
            payload.setdefault("model", route.model)
        owner = self.server.owner
        tool = tool_to_call(wire, payload)
        record = ServedRequest(
            path=path,
            provider=wire.name,
            model=route.model or str(payload.get("model") or ""),
            # Ollama streams unless the request says ``"stream": false``.
            stream=route.stream or bool(payload.get("stream", wire.streams_by_default)),
            fault=Fault.ok(),
            tool_call=tool is not None,
            at=time.monotonic(),
            prefilled=prefill_of(payload) is not None,
        )
        fault = owner._next_fault(record)
        logger.debug("%s: %s %s -> %s", owner.name, wire.name, path, fault.kind)
        try:
            self._answer(wire, payload, record, tool, fault)
        except (_Stopped, OSError):
            self._drop()

    # -- answers -----------------------------------------------------------------------

    def _answer(
        self,
        wire: Wire,
        payload: dict[str, Any],
        record: ServedRequest,
        tool: ToolCall | None,
        fault: Fault,
    ) -> None:
        stopping = self.server.owner._stopping
        if fault.kind == "status" or (fault.kind == "error_event" and not record.stream):
            self._send_status_fault(wire, fault)
            return
        prefill = prefill_of(payload)
        if fault.kind == "prefill_rejected" and prefill is not None:
            self._send_json(400, wire.prefill_rejection_body(), wire=wire)
            return
        problem = wire.prefill_problem(prefill)
        if problem is not None:
            self._send_json(400, problem, wire=wire)
            return
        if fault.kind == "content_filtered" and fault.status_code is not None:
            # Gemini blocks a prompt with a 200 and ``promptFeedback.blockReason``.
            blocked = wire.blocked_prompt(payload)
            if blocked is not None:
                self._send_blocked_prompt(wire, blocked, record.stream)
                return
            self._send_json(fault.status_code, wire.content_filter_body(), wire=wire)
            return
        if fault.kind == "refuse" or (fault.kind == "drop_mid_stream" and not record.stream):
            self._drop()
            return
        if fault.kind == "hang" and stopping.wait(fault.seconds):
            raise _Stopped
        if fault.kind == "stall_mid_stream" and not record.stream:
            if stopping.wait(fault.seconds):
                raise _Stopped
            self._drop()
            return
        filtered = fault.after_chunks if fault.kind == "content_filtered" else None
        owner = self.server.owner
        answer = Answer(
            wire,
            payload,
            owner.reply,
            tool,
            filtered_after=filtered,
            details=usage_details_option(owner.usage_details),
            compaction=fault.compaction if fault.kind == "compacted" else None,
            summary=fault.summary,
        )
        delay = fault.delay_per_chunk or 0.0
        first_token_delay = (fault.seconds or 0.0) if fault.kind == "slow_first_token" else 0.0
        if not record.stream:
            if first_token_delay and stopping.wait(first_token_delay):
                raise _Stopped
            if delay and stopping.wait(delay * len(answer.pieces)):
                raise _Stopped
            self._send_json(200, answer.body(), wire=wire)
            return
        cut = fault.kind in ("drop_mid_stream", "stall_mid_stream", "error_event")
        limit = fault.after_chunks if cut else None
        self.send_response(200)
        for name, value in wire.stream_headers(payload):
            self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self._send_request_id(wire)
        self.end_headers()
        sent = 0
        # A malformed-chunk fault sends one undecodable event where content chunk N+1
        # (or, for a shorter reply, the tail) would start; the answer then goes on.
        broken = fault.kind == "malformed_chunk"
        end_marker = fault.kind != "missing_done"
        for event, phase in answer.events(end_marker=end_marker):
            if broken and (phase == "tail" or (phase == "content" and sent == fault.after_chunks)):
                self._write_chunk(wire.malformed_event())
                broken = False
            # A drop cuts before content chunk N+1, or before the tail when the reply
            # has N chunks or fewer: a drop fault never lets the stream complete.
            if limit is not None and (phase == "tail" or (phase == "content" and sent == limit)):
                # A stall is a drop after a silence with the connection still open.
                if fault.kind == "stall_mid_stream" and stopping.wait(fault.seconds):
                    raise _Stopped
                if fault.kind == "error_event":
                    # The provider's error event ends a well-formed body: no cut socket.
                    self._write_chunk(wire.error_event(cast(int, fault.status_code)))
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    return
                self._drop()
                return
            if phase == "content":
                if sent == 0 and first_token_delay and stopping.wait(first_token_delay):
                    raise _Stopped
                if delay and stopping.wait(delay):
                    raise _Stopped
                sent += 1
            self._write_chunk(event)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _send_blocked_prompt(self, wire: Wire, blocked: dict[str, Any], stream: bool) -> None:
        if not stream:
            self._send_json(200, blocked, wire=wire)
            return
        data = b"data: " + json.dumps(blocked).encode() + b"\n\n"
        self._send_bytes(200, data, "text/event-stream; charset=utf-8", wire=wire)

    def _send_status_fault(self, wire: Wire, fault: Fault) -> None:
        code = cast(int, fault.status_code)
        headers: dict[str, str] = {}
        if fault.retry_after is not None:
            headers["retry-after"] = number(fault.retry_after)
        if fault.retry_after_ms is not None:
            headers["retry-after-ms"] = number(fault.retry_after_ms)
        if isinstance(fault.body, str):
            self._send_bytes(code, fault.body.encode(), "text/plain; charset=utf-8", headers)
            return
        body, extra = wire.status_error(code, fault.body)
        headers.update(extra)
        self._send_json(code, body, wire=wire, headers=headers)

    # -- wire helpers ------------------------------------------------------------------

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_request_id(self, wire: Wire | None) -> None:
        header = None if wire is None else wire.request_id_header()
        if header is not None:
            self.send_header(*header)

    def _send_json(
        self,
        code: int,
        body: Mapping[str, Any],
        *,
        wire: Wire | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        data = json.dumps(body).encode()
        self._send_bytes(code, data, "application/json", headers, wire)

    def _send_bytes(
        self,
        code: int,
        data: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
        wire: Wire | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self._send_request_id(wire)
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
