"""Token counts as providers send them: the one lenient reader."""

from __future__ import annotations

from llm_resilience.usage import first_token_count, token_count


def test_a_token_count_is_an_int_from_zero_and_a_whole_float_only_when_asked() -> None:
    assert [token_count(value) for value in (0, 12, -1, True, 12.0, "12", None)] == [
        0,
        12,
        None,
        None,
        None,
        None,
        None,
    ]
    assert [token_count(value, whole_float=True) for value in (6.0, 6.5, -1.0, False)] == [
        6,
        None,
        None,
        None,
    ]
    assert first_token_count(None, -3, False, 7, 9) == 7
