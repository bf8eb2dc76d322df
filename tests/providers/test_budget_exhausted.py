"""An upstream "budget exhausted" through every provider's real client: never retried on the
same member, failed over to the next.

Each provider answers a spent account its own way (``Fault.budget_exhausted``: OpenAI's
429 ``insufficient_quota``, Anthropic's 402 ``billing_error``, Bedrock's
``ServiceQuotaExceededException``, 402 elsewhere); the SDK's own exception must read as
budget exhausted, so ``member_retry`` and ``RetryPolicy`` leave it alone while the chain
moves on to the next member.
"""

from __future__ import annotations

import importlib.util

import pytest
from provider_surfaces import ROWS, Endpoint, Row

from llm_resilience import RetryPolicy
from llm_resilience.fallback import FallbackChain
from llm_resilience.retry import is_retryable
from llm_resilience.testing import Fault, FaultInjectingServer
from llm_resilience.transient import is_budget_exhausted, is_transient


def _rows(*, sdk_only: bool = False) -> list[object]:
    return [
        pytest.param(
            row,
            id=row.key,
            marks=[pytest.mark.skip(reason=f"{row.package} not installed")]
            if importlib.util.find_spec(row.package.split(".")[0]) is None
            else [],
        )
        for row in ROWS
        if not sdk_only or row.surface == "SDK"
    ]


@pytest.mark.parametrize("row", _rows())
def test_a_spent_account_fails_over_to_the_next_member(row: Row) -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.budget_exhausted(row.wire), Fault.ok())
        endpoint = Endpoint("127.0.0.1", server.port)
        members = [row.member(endpoint, timeout=10, max_retries=0) for _ in range(2)]
        answer = row.call(row.chain(members, None))
        assert answer
        assert len(server.requests) == 2


_NO_WAIT = RetryPolicy(attempts=3, base_delay=0, jitter=0)


@pytest.mark.parametrize("row", _rows(sdk_only=True))
def test_a_spent_account_is_never_retried_on_the_same_member(row: Row) -> None:
    with FaultInjectingServer() as server:
        fault = Fault.budget_exhausted(row.wire)
        server.script(*[fault] * 8)
        endpoint = Endpoint("127.0.0.1", server.port)
        members = [row.member(endpoint, timeout=10, max_retries=0) for _ in range(2)]
        chain = FallbackChain(members, member_retry=_NO_WAIT)
        with pytest.raises(Exception) as caught:
            # A retry policy around the whole chain does not retry it either.
            _NO_WAIT.call(row.call, chain)
        # One request per member: no same-member retry, no retry of the chain.
        assert len(server.requests) == 2
    assert is_budget_exhausted(caught.value)
    assert is_transient(caught.value)
    assert not is_retryable(caught.value)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        pytest.param(
            402,
            {"error": {"code": 402, "message": "Insufficient credits. Add more using ..."}},
            id="openrouter-402",
        ),
        pytest.param(
            429,
            {
                "error": {
                    "message": "Budget has been exceeded! Current cost: 10.2, Max budget: 10.0",
                    "type": "budget_exceeded",
                    "param": None,
                    "code": "429",
                }
            },
            id="litellm-budget-exceeded-429",
        ),
        pytest.param(
            400,
            {
                "error": {
                    "message": "Budget has been exceeded! Current cost: 10.2, Max budget: 10.0",
                    "type": "budget_exceeded",
                    "param": None,
                    "code": "400",
                }
            },
            id="litellm-budget-exceeded-400",
        ),
    ],
)
def test_a_gateways_budget_refusal_through_the_openai_sdk_fails_over_unretried(
    status: int, body: dict[str, object]
) -> None:
    row = next(row for row in ROWS if row.key == "openai-sdk")
    with FaultInjectingServer() as server:
        server.script(*[Fault.status(status, body=body)] * 8)
        endpoint = Endpoint("127.0.0.1", server.port)
        members = [row.member(endpoint, timeout=10, max_retries=0) for _ in range(2)]
        chain = FallbackChain(members, member_retry=_NO_WAIT)
        with pytest.raises(Exception) as caught:
            row.call(chain)
        assert len(server.requests) == 2
    assert is_budget_exhausted(caught.value)


def test_a_plain_rate_limit_is_still_retried_on_the_same_member() -> None:
    row = next(row for row in ROWS if row.key == "openai-sdk")
    with FaultInjectingServer() as server:
        server.script(Fault.status(429), Fault.ok())
        endpoint = Endpoint("127.0.0.1", server.port)
        members = [row.member(endpoint, timeout=10, max_retries=0) for _ in range(2)]
        tried: list[int] = []

        def attempt(index: int, client: object) -> object:
            tried.append(index)
            return client.chat.completions.create(  # type: ignore[attr-defined]
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
            )

        FallbackChain(members, member_retry=_NO_WAIT).invoke(attempt)
    assert tried == [0, 0]
