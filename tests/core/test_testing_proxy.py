"""FaultProxy: forwards bytes, goes silent without closing, resets on cue."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from llm_resilience.testing import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address  # type: ignore[misc]
    server.shutdown()
    server.server_close()


def _ask(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    return sock.recv(4096)


def test_a_forwarding_proxy_carries_bytes_both_ways(echo_server: tuple[str, int]) -> None:
    with (
        FaultProxy(echo_server) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port)) as sock,
    ):
        sock.settimeout(2)
        assert _ask(sock, b"ping") == b"ping"


def test_a_silent_proxy_keeps_the_connection_open_and_answers_nothing_until_it_forwards(
    echo_server: tuple[str, int],
) -> None:
    with (
        FaultProxy(echo_server) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port)) as sock,
    ):
        sock.settimeout(2)
        assert _ask(sock, b"one") == b"one"
        proxy.mode = "silent"
        sock.settimeout(0.3)
        sock.sendall(b"two")  # accepted by the kernel: the connection looks alive
        with pytest.raises(TimeoutError):
            sock.recv(4096)
        proxy.mode = "forward"
        sock.settimeout(2)
        assert sock.recv(4096) == b"two"  # held, not lost


def _is_dead(sock: socket.socket) -> bool:
    """Whether the peer reset or closed ``sock`` (a reset may surface on the second try)."""
    try:
        for _ in range(2):
            if _ask(sock, b"?") == b"":
                return True
    except OSError:
        return True
    return False


def test_a_resetting_proxy_resets_open_and_new_connections(echo_server: tuple[str, int]) -> None:
    with FaultProxy(echo_server) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
            sock.settimeout(2)
            assert _ask(sock, b"x") == b"x"
            proxy.mode = "reset"
            assert _is_dead(sock)
        with socket.create_connection(("127.0.0.1", proxy.port)) as fresh:
            fresh.settimeout(2)
            assert _is_dead(fresh)


def test_an_unknown_mode_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"mode must be one of \('forward', 'silent', 'reset'\)"):
        FaultProxy(("127.0.0.1", 1), mode="down")  # type: ignore[arg-type]


def test_a_pump_whose_sockets_are_closed_under_it_ends_quietly(
    echo_server: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reset (or stop) closes a link's sockets from another thread; a pump that checked
    # the link just before sees descriptors of -1 in its select. Seen in CI as an
    # unhandled ValueError in a pump thread of test_fault_soak.py. The window is replayed
    # here on purpose: the sockets are closed, the link not yet marked closed.
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    with FaultProxy(echo_server) as proxy, socket.create_connection(("127.0.0.1", proxy.port)):
        [link] = _links_of(proxy)
        link.client.close()
        pump = threading.Thread(target=proxy._pump, args=(link,))
        pump.start()
        pump.join(timeout=2)
        assert not pump.is_alive()
        assert raised == []
        assert link.closed
        with proxy._lock:
            assert link not in proxy._links


def _links_of(proxy: FaultProxy) -> list[Any]:
    for _ in range(200):  # the accepting thread registers the link a moment later
        with proxy._lock:
            if proxy._links:
                return list(proxy._links)
        threading.Event().wait(0.01)
    raise AssertionError("the proxy registered no connection")
