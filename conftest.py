"""Shared test fixtures: the real PostgreSQL and Redis servers, when they are there.

On a developer's machine without them, the tests that need them skip with the reason.
Under ``CI=true`` they must run: a missing server fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator

import pytest

POSTGRES_URL = os.environ.get(
    "LLM_RESILIENCE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _worker_redis_url(url: str, worker: str) -> str:
    """``url`` with its database moved down by the pytest-xdist worker's number.

    The Redis tests flush their database before and after each test, so two workers must
    never share one: worker ``gw0`` keeps the URL's database (default 15), ``gw1`` takes
    the one below it (14), and so on. Outside xdist (``worker`` empty) the URL is as given.
    """
    if not worker.startswith("gw"):
        return url
    base, _, database = url.rpartition("/")
    if not database.isdigit() or not base.startswith("redis://"):
        raise pytest.UsageError(
            f"LLM_RESILIENCE_TEST_REDIS_URL must end in a database number under pytest-xdist "
            f"(each worker takes its own), got {url!r}"
        )
    number = int(database) - int(worker[2:])
    if number < 0:
        raise pytest.UsageError(
            f"pytest-xdist worker {worker} has no Redis database below {database}: "
            f"run fewer workers or point LLM_RESILIENCE_TEST_REDIS_URL at a higher database"
        )
    return f"{base}/{number}"


REDIS_URL = _worker_redis_url(
    os.environ.get("LLM_RESILIENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
    os.environ.get("PYTEST_XDIST_WORKER", ""),
)


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _require(service: str, host: str, port: int) -> None:
    if _reachable(host, port):
        return
    reason = f"{service} is not reachable at {host}:{port}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}, and CI=true requires it (.ci/run starts it)")
    pytest.skip(f"{reason}; start it to run this test")


@pytest.fixture
def postgres_url() -> str:
    """SQLAlchemy URL of the test PostgreSQL database (skips, or fails under CI)."""
    _require("PostgreSQL", "127.0.0.1", 5432)
    return POSTGRES_URL


@pytest.fixture
def redis_url() -> str:
    """URL of the test Redis database (skips, or fails under CI)."""
    _require("Redis", "127.0.0.1", 6379)
    return REDIS_URL


#: LangChain's provider packages keep one HTTP client per base URL for the whole process
#: (``functools.lru_cache``). Tests start a fault server per test on an ephemeral port, and
#: pytest-asyncio runs each test in an event loop of its own: when a port comes round again,
#: the cached async client still holds keep-alive connections opened in an earlier test's
#: (closed) loop to an earlier server, and its next request fails with a connection error.
#: A process with one loop and one provider never meets this; the suite empties the caches
#: after each test.
_CACHED_CLIENTS = {
    "langchain_anthropic._client_utils": (
        "_get_default_httpx_client",
        "_get_default_async_httpx_client",
    ),
    "langchain_openai.chat_models._client_utils": (
        "_cached_sync_httpx_client",
        "_cached_async_httpx_client",
    ),
}


@pytest.fixture(autouse=True)
def _no_http_client_shared_across_tests() -> Iterator[None]:
    yield
    for module_name, names in _CACHED_CLIENTS.items():
        module = sys.modules.get(module_name)
        for name in names:
            cached = getattr(module, name, None)
            if cached is not None and hasattr(cached, "cache_clear"):
                cached.cache_clear()


@pytest.fixture(scope="session")
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses every connection for the whole run: bound and never
    listening, so no server another test starts can take it meanwhile (a port that was
    merely found free can be, and then answers)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])
