"""The attempt rules of ``llm_resilience.runs``: the per-run cap, the events, the reasons."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest

from llm_resilience import AttemptCap, AttemptCapExceededError, AttemptEvent, is_transient
from llm_resilience.fallback import (
    content_without_cache_control,
    is_server_tool,
    without_cache_control,
)
from llm_resilience.runs import superseded_reason, timed_out_by


def test_the_cap_counts_each_run_apart_and_refuses_the_attempt_past_it() -> None:
    cap = AttemptCap(2)
    assert [cap.take("a"), cap.take("b"), cap.take("a")] == [1, 1, 2]
    with pytest.raises(AttemptCapExceededError) as caught:
        cap.take("a")
    assert (caught.value.max_attempts, caught.value.run_id) == (2, "a")
    assert cap.attempts("a") == 2
    cap.close("a")
    assert cap.take("a") == 1


def test_the_cap_forgets_the_least_recently_used_run_past_max_runs() -> None:
    cap = AttemptCap(5, max_runs=2)
    cap.take("old")
    cap.take("kept")
    cap.take("kept")
    cap.take("new")
    assert (cap.attempts("old"), cap.attempts("kept"), cap.attempts("new")) == (0, 2, 1)


def test_threads_sharing_a_cap_never_take_more_than_it() -> None:
    cap = AttemptCap(50)
    granted: list[int] = []

    def worker() -> None:
        for _ in range(20):
            try:
                granted.append(cap.take("run"))
            except AttemptCapExceededError:
                pass

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(granted) == list(range(1, 51))


def test_a_capped_run_is_never_retried_elsewhere() -> None:
    assert is_transient(AttemptCapExceededError(3, "run")) is False


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_the_cap_refuses_a_count_that_is_not_a_positive_int(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="max_attempts"):
        AttemptCap(bad)  # type: ignore[arg-type]


def test_an_event_payload_is_json_safe_and_carries_no_error_text() -> None:
    error = ConnectionError("reset by 10.0.0.7 while sending 'my secret prompt'")
    event = AttemptEvent(
        "superseded",
        run_id="r",
        attempt=2,
        model="gpt-4o",
        message_id="lc_run--x",
        reason=superseded_reason(error),
        estimate=Decimal("0.0012"),
    )
    payload = event.payload()
    assert payload["reason"] == "ConnectionError"
    assert payload["estimate"] == "0.0012"
    assert "secret" not in repr(payload)
    with pytest.raises(ValueError, match="kind"):
        AttemptEvent("failed", run_id="r", attempt=1, model=None, message_id=None)  # type: ignore[arg-type]


def test_an_abandoned_attempt_is_named_by_the_limit_that_fired() -> None:
    limits = {"first_token_timeout": 1.0, "idle_timeout": 0.5}
    assert timed_out_by(**limits, tokens=0, since_last=1.0) == "first_token_timeout"
    assert timed_out_by(**limits, tokens=4, since_last=0.6) == "idle_timeout"
    assert timed_out_by(**limits, tokens=4, since_last=0.1) == "per_client_timeout"
    assert superseded_reason(None, timed_out="per_client_timeout") == "timeout"


def test_cache_control_marks_are_dropped_from_settings_blocks_and_extras() -> None:
    mark = {"type": "ephemeral"}
    settings, changed = without_cache_control({"cache_control": mark, "max_tokens": 10})
    assert (dict(settings), changed) == ({"max_tokens": 10}, True)
    tool, changed = without_cache_control({"name": "t", "extras": {"cache_control": mark}})
    assert (dict(tool), changed) == ({"name": "t", "extras": None}, True)
    content = [{"type": "text", "text": "x", "cache_control": mark}]
    assert content_without_cache_control(content) == ([{"type": "text", "text": "x"}], True)
    unmarked = [{"type": "text", "text": "x"}]
    assert content_without_cache_control(unmarked)[0] is unmarked


def test_a_server_tool_is_told_from_a_function_tool() -> None:
    assert is_server_tool({"type": "web_search_preview"})
    assert not is_server_tool({"name": "f", "input_schema": {}})
    assert not is_server_tool({"type": "function", "function": {"name": "f"}})
