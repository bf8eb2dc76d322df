"""A TCP proxy that makes a real database or Redis fail on cue: silent, reset, or healthy.

Point a ledger or a limiter at the proxy instead of the server, then switch its mode:

```python
with FaultProxy(("127.0.0.1", 5432)) as proxy:
    ledger = SqlCostLedger(f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/test")
    proxy.mode = "silent"     # connections stay open and nothing answers
    ...
    proxy.mode = "forward"    # the server answers again, on the same connections
```

* ``"forward"``: bytes flow both ways.
* ``"silent"``: new connections are accepted and existing ones kept, but no byte moves in
  either direction. The operating system still acknowledges what the client sends, so
  to the client this is a frozen server: TCP keepalives and the server's own timeouts
  cannot notice it, only a bound kept on the client's side.
* ``"reset"``: every open connection is reset and new ones are reset on arrival.

Everything runs on daemon threads and only the standard library is imported.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from types import TracebackType
from typing import Literal

__all__ = ["FaultProxy", "ProxyMode"]

ProxyMode = Literal["forward", "silent", "reset"]
_MODES = ("forward", "silent", "reset")
# How often idle pumps look at the mode: the worst delay a mode change takes to apply.
_POLL = 0.02


def _reset(sock: socket.socket | None) -> None:
    """Close ``sock`` with a TCP reset (SO_LINGER 0), not a graceful FIN."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One client connection and, once bytes first flow, its upstream connection."""

    __slots__ = ("client", "closed", "upstream")

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.upstream: socket.socket | None = None
        self.closed = False

    def close(self) -> None:
        self.closed = True
        _reset(self.client)
        _reset(self.upstream)


class FaultProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; [`mode`][] decides what gets through.

    Examples:
        >>> proxy = FaultProxy(("127.0.0.1", 6379))
        >>> proxy.mode
        'forward'
    """

    def __init__(self, target: tuple[str, int], *, mode: ProxyMode = "forward") -> None:
        self._target = target
        self._mode: ProxyMode = "forward"
        self.mode = mode
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: Connections accepted so far.
        self.accepted = 0

    @property
    def mode(self) -> ProxyMode:
        """``"forward"``, ``"silent"`` or ``"reset"``; takes effect within 20 ms."""
        return self._mode

    @mode.setter
    def mode(self, mode: ProxyMode) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        self._mode = mode
        if mode == "reset":
            with self._lock:
                links, self._links = self._links, []
            for link in links:
                link.close()

    @property
    def port(self) -> int:
        """The port the proxy listens on (127.0.0.1)."""
        if self._listener is None:
            raise RuntimeError("the proxy is not started")
        port: int = self._listener.getsockname()[1]
        return port

    def start(self) -> FaultProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.settimeout(_POLL)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and reset every connection."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self._mode == "reset":
                _reset(client)
                continue
            link = _Link(client)
            with self._lock:
                self._links.append(link)
            threading.Thread(target=self._pump, args=(link,), daemon=True).start()

    def _pump(self, link: _Link) -> None:
        """Move bytes both ways while forwarding; hold them (unread) while silent."""
        try:
            while not link.closed and not self._stopping.is_set():
                if self._mode != "forward":
                    self._stopping.wait(_POLL)
                    continue
                if link.upstream is None:
                    link.upstream = socket.create_connection(self._target, timeout=5)
                sockets = [link.client, link.upstream]
                readable, _, _ = select.select(sockets, [], [], _POLL)
                if self._mode != "forward":
                    continue  # went silent while waiting: leave the bytes unread
                for source in readable:
                    data = source.recv(65536)
                    if not data:
                        link.close()
                        return
                    other = link.upstream if source is link.client else link.client
                    other.sendall(data)
        except (OSError, ValueError):
            # ValueError: a reset or stop closed the sockets (descriptor -1) between the
            # check above and select(); the link is over either way.
            link.close()
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._links.remove(link)
