"""pytest fixtures for [`FaultInjectingServer`][].

Enable them in a ``conftest.py``:

```python
pytest_plugins = ["llm_resilience.testing.fixtures"]

def test_fallback(fault_server, fault_server_factory):
    secondary = fault_server_factory(reply="from the secondary", name="secondary")
    fault_server.script(Fault.status(503))
    ...
```

Every server a test starts through them is stopped when the test ends, hanging requests
included (``stop()`` takes a few hundredths of a second).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llm_resilience.testing._server import FaultInjectingServer

__all__ = ["fault_server", "fault_server_factory"]

ServerFactory = Callable[..., FaultInjectingServer]


@pytest.fixture
def fault_server_factory() -> Iterator[ServerFactory]:
    """A callable taking ``FaultInjectingServer``'s arguments and returning a started server."""
    servers: list[FaultInjectingServer] = []

    def start(*args: Any, **kwargs: Any) -> FaultInjectingServer:
        server = FaultInjectingServer(*args, **kwargs).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def fault_server(fault_server_factory: ServerFactory) -> FaultInjectingServer:
    """A started server named ``primary`` with the default reply, stopped after the test."""
    return fault_server_factory(name="primary")
