"""FaultProxy: forwards bytes, goes silent without closing, resets on cue."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

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
