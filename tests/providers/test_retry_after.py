"""The wait a provider asks for reaches us through every client's rate-limit error.

Both members of each row's chain are answered 429 with the provider's headers, so the
chain raises the last member's own error; ``retry_after_of`` must read the wait from it:
``retry-after`` seconds, or Azure's ``retry-after-ms`` where both are sent.
"""

from __future__ import annotations

import importlib.util

import pytest
from provider_surfaces import ROWS, Endpoint, Row

from llm_resilience.testing import Fault, FaultInjectingServer
from llm_resilience.transient import retry_after_of, status_code_of


def _rows() -> list[object]:
    return [
        pytest.param(
            row,
            id=row.key,
            marks=[pytest.mark.skip(reason=f"{row.package} not installed")]
            if importlib.util.find_spec(row.package.split(".")[0]) is None
            else [],
        )
        for row in ROWS
    ]


@pytest.mark.parametrize("row", _rows())
def test_the_wait_a_provider_asks_for_is_read_from_its_rate_limit_error(row: Row) -> None:
    azure = row.provider == "Azure OpenAI"
    # Azure sends both headers; the milliseconds are the more precise and win.
    fault = (
        Fault.status(429, retry_after=2, retry_after_ms=1500)
        if azure
        else Fault.status(429, retry_after=2)
    )
    with FaultInjectingServer() as server:
        server.script(fault, fault)
        endpoint = Endpoint("127.0.0.1", server.port)
        members = [row.member(endpoint, timeout=10, max_retries=0) for _ in range(2)]
        with pytest.raises(Exception) as caught:
            row.call(row.chain(members, None))
        assert len(server.requests) == 2
    assert status_code_of(caught.value) == 429
    assert retry_after_of(caught.value) == (1.5 if azure else 2.0)
