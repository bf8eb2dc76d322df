"""Which member served a call: the path mark chains put on an answer, read back."""

from __future__ import annotations

from llm_resilience.served import served_mark, served_member


class _Chain:
    def __init__(self, *members: object) -> None:
        self.members = members

    def layers_below(self) -> tuple[object, ...]:
        return self.members


class _Wrapper:
    def __init__(self, inner: object) -> None:
        self.inner = inner


def test_the_served_member_is_found_along_the_path_through_a_chain_of_chains() -> None:
    inner = _Chain("dead-primary", _Wrapper("live-secondary"))
    stack = _Wrapper(_Chain(inner, "other"))
    # The inner chain marks its answer [1]; the outer chain puts its own index in front.
    mark = served_mark(0, served_mark(1))

    assert mark == [0, 1]
    assert served_member(stack, mark) == "live-secondary"
    # A mark that stops above a chain says nothing of which of its members served: not
    # its primary (the member that failed), but unknown.
    assert served_member(stack, [0]) is None
    assert served_member(stack, [2]) is None
    assert served_member(stack, 1) is None
