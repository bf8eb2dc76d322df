"""What a fallback chain gives back to its adapters: its durations and its restart events.

Both adapters read a chain's duration options back from :attr:`FallbackChain.durations`
and build their restart events from :meth:`StreamRestart.payload`, so the two
frameworks show the same values whatever spelling built the chain.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from llm_resilience import FallbackChain
from llm_resilience.fallback import StreamRestart


@pytest.mark.parametrize("spelling", [30, 30.0, timedelta(seconds=30)], ids=["int", "float", "td"])
def test_every_duration_reads_back_as_seconds_as_float_whatever_its_spelling(
    spelling: float | timedelta,
) -> None:
    chain = FallbackChain(
        ["a", "b"],
        per_client_timeout=spelling,
        first_token_timeout=spelling,
        idle_timeout=spelling,
        hedge_after=timedelta(seconds=5) if isinstance(spelling, timedelta) else 5,
    )

    durations = chain.durations

    assert durations == {
        "per_client_timeout": 30.0,
        "first_token_timeout": 30.0,
        "idle_timeout": 30.0,
        "hedge_after": 5.0,
    }
    assert all(type(value) is float for value in durations.values())


def test_a_duration_left_off_reads_back_as_none() -> None:
    assert FallbackChain(["a", "b"]).durations == dict.fromkeys(
        ("per_client_timeout", "first_token_timeout", "idle_timeout", "hedge_after")
    )


def test_a_restart_payload_names_the_failure_by_class_never_by_message() -> None:
    restart = StreamRestart(
        failed_client=0,
        next_client=2,
        chunks=7,
        error=ConnectionResetError("prompt text that must not leak"),
        continued=True,
    )

    assert restart.payload() == {
        "failed_client": 0,
        "next_client": 2,
        "chunks": 7,
        "error_type": "ConnectionResetError",
        "continued": True,
    }
