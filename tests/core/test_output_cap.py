"""A call's output cap: one rule for a strict budget's hold and a token limiter's weight."""

from __future__ import annotations

from llm_resilience.usage import model_output_cap, output_cap


class _Gemini:
    max_tokens = None
    max_output_tokens = 2048


def test_a_calls_own_cap_wins_else_the_largest_its_models_state_else_unknown() -> None:
    gemini = model_output_cap(_Gemini())
    profiled = model_output_cap(object(), documented=8192)

    assert (gemini, profiled, model_output_cap(object(), documented=-1)) == (2048, 8192, None)
    assert output_cap({"max_completion_tokens": 500}, [gemini]) == 500
    assert output_cap({"max_tokens": None, "max_output_tokens": 300}, [gemini]) == 300
    assert output_cap({}, [gemini]) == 2048
    assert output_cap({}, [gemini, None, profiled]) == 8192
    assert output_cap({"max_tokens": "many"}, [None]) is None
