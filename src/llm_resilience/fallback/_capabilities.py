"""What a fallback chain's members can do, and so what the chain can do.

Each adapter reads its framework's facts about a member (LangChain's model profile,
LlamaIndex's ``LLMMetadata``) and asks the rules here, so both frameworks answer alike:

* `member_profile`: one member's facts as a [`MemberProfile`][], keeping only
  credible values (a context window from 1 token to `MAX_CONTEXT_WINDOW`, flags
  that are ``bool``) and marking the clients known to take an assistant prefill;
* `merge_capabilities`: what the chain can do, over its members' capabilities:
  a limit (context window, output cap) is the smallest any member states, a flag is
  true only when every member says so and false when any says not, and any other value
  holds when every member states the same one;
* what a request may carry to another provider: Anthropic's ``cache_control`` marks are
  dropped for a member not known to take them (`without_cache_control`,
  `content_without_cache_control`: the mark names no content, so dropping it changes
  only what is cached), and a provider's built-in server tool (`is_server_tool`) is
  never sent to a member of another provider (`same_provider`): the request is refused,
  as a tool dropped would change the answer.

Examples:
    >>> merge_capabilities([{"max_input_tokens": 200_000, "tool_calling": True},
    ...                     {"max_input_tokens": 128_000, "tool_calling": False}])
    {'max_input_tokens': 128000, 'tool_calling': False}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeGuard

from llm_resilience.fallback._routing import MAX_CONTEXT_WINDOW, MemberProfile

__all__ = [
    "MAX_CONTEXT_WINDOW",
    "content_without_cache_control",
    "credible_context_window",
    "is_server_tool",
    "member_profile",
    "merge_capabilities",
    "of_classes",
    "same_provider",
    "takes_prefill",
    "without_cache_control",
]


def credible_context_window(value: object) -> int | None:
    """``value`` if it is a context window the chain can rely on, else None (unknown).

    A credible window is an ``int`` (not a ``bool``) from 1 to `MAX_CONTEXT_WINDOW`
    tokens; frameworks report 0, -1 or absurd values for models they do not know.

    Examples:
        >>> credible_context_window(128_000), credible_context_window(-1)
        (128000, None)
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 1 <= value <= MAX_CONTEXT_WINDOW else None


def takes_prefill(client: object, classes: Iterable[tuple[str, str]]) -> bool:
    """Whether ``client`` is known to take an assistant prefill (``mid_stream="continue"``).

    ``classes`` are ``(package, class name)`` pairs of the framework classes known to take
    one (``("langchain_anthropic", "ChatAnthropic")``: Anthropic's Messages API does); a
    client of such a class, or of a subclass, does. Classes are matched by name, so the
    core never imports a framework.

    Examples:
        >>> class ChatAnthropic: ...
        >>> ChatAnthropic.__module__ = "langchain_anthropic.chat_models"
        >>> takes_prefill(ChatAnthropic(), [("langchain_anthropic", "ChatAnthropic")])
        True
    """
    return of_classes(client, classes)


def of_classes(client: object, classes: Iterable[tuple[str, str]]) -> bool:
    """Whether ``client``'s class, or a base of it, is one of ``classes`` (``(package,
    class name)`` pairs, matched by name so the core never imports a framework).

    Examples:
        >>> of_classes(object(), [("builtins", "object")])
        True
    """
    known = tuple(classes)
    return any(
        klass.__name__ == name
        and (klass.__module__ == package or klass.__module__.startswith(package + "."))
        for klass in type(client).__mro__
        for package, name in known
    )


def member_profile(
    client: object,
    *,
    context_window: object = None,
    tool_calling: object = None,
    image_inputs: object = None,
    structured_output: object = None,
    prefill_classes: Iterable[tuple[str, str]] = (),
) -> MemberProfile | None:
    """What a framework says of one member, as the chain's [`MemberProfile`][].

    Each fact is read leniently: a window that is not credible
    (`credible_context_window`) or a flag that is not a ``bool`` is unknown. The
    member takes an assistant prefill when `takes_prefill` says so for
    ``prefill_classes``, else that is unknown. None when nothing is known.

    Examples:
        >>> member_profile(object(), context_window=128_000, tool_calling="yes")
        MemberProfile(context_window=128000, tool_calling=None, image_inputs=None, \
structured_output=None, assistant_prefill=None)
    """
    profile = MemberProfile(
        context_window=credible_context_window(context_window),
        tool_calling=_flag(tool_calling),
        image_inputs=_flag(image_inputs),
        structured_output=_flag(structured_output),
        assistant_prefill=True if takes_prefill(client, prefill_classes) else None,
    )
    return None if profile == MemberProfile() else profile


def merge_capabilities(
    members: Sequence[Mapping[str, Any] | None],
    declared: Sequence[MemberProfile | None] | None = None,
    names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What a chain can do, from what each member can do (a mapping per member, or None).

    Keys are the framework's own (``max_input_tokens``, ``num_output``,
    ``tool_calling``, ...). ``declared`` (the chain's ``member_profiles``, one
    [`MemberProfile`][] or None per member) wins over a member's mapping, each field
    under the framework key ``names`` gives it (``{"context_window": "max_input_tokens"}``;
    a field ``names`` leaves out has no key in that framework). A key a member lacks, or
    a None member, is unknown there:

    * a limit (an ``int``): the smallest positive value any member states; a member that
      states none, or 0 or less ("unknown", as LlamaIndex's ``num_output=-1``), sets no
      bound, and with no member stating one the key is left out;
    * a flag (a ``bool``): False when any member says False, True when every member
      says True, left out otherwise (unknown);
    * anything else: kept when every member states the same value, else left out.

    Examples:
        >>> merge_capabilities([{"num_output": -1, "pdf_inputs": True}, {"num_output": 512}])
        {'num_output': 512}
    """
    if declared is not None:
        members = [
            _over(member, mine, names or {}) for member, mine in zip(members, declared, strict=True)
        ]
    keys = sorted({key for member in members if member for key in member})
    merged: dict[str, Any] = {}
    for key in keys:
        values = [member.get(key) if member else None for member in members]
        stated = [value for value in values if value is not None]
        if all(isinstance(value, bool) for value in stated):
            if False in stated:
                merged[key] = False
            elif len(stated) == len(values):
                merged[key] = True
        elif all(_is_count(value) for value in stated):
            bounds = [value for value in stated if _is_count(value) and value > 0]
            if bounds:
                merged[key] = min(bounds)
        elif len(stated) == len(values) and all(value == stated[0] for value in stated):
            merged[key] = stated[0]
    return merged


def _over(
    member: Mapping[str, Any] | None, declared: MemberProfile | None, names: Mapping[str, str]
) -> Mapping[str, Any] | None:
    """``member``'s capabilities with the fields ``declared`` states put over them."""
    if declared is None:
        return member
    stated = {
        key: value
        for field, key in names.items()
        if (value := getattr(declared, field)) is not None
    }
    return {**(member or {}), **stated}


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


#: Where a content block, tool or settings mapping may carry a nested ``cache_control``.
_NESTED_MARKS = ("extras", "metadata")


def without_cache_control(payload: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
    """``payload`` without Anthropic's ``cache_control`` mark (also inside its ``extras``
    and ``metadata``), and whether one was there; ``payload`` itself when none was.

    Examples:
        >>> without_cache_control({"type": "text", "cache_control": {"type": "ephemeral"}})
        ({'type': 'text'}, True)
    """
    changed = "cache_control" in payload
    result: Mapping[str, Any] = (
        {key: value for key, value in payload.items() if key != "cache_control"}
        if changed
        else payload
    )
    for key in _NESTED_MARKS:
        nested = result.get(key)
        if isinstance(nested, Mapping) and "cache_control" in nested:
            inner = {k: v for k, v in nested.items() if k != "cache_control"}
            result = {**result, key: inner or None}
            changed = True
    return result, changed


def content_without_cache_control(content: object) -> tuple[object, bool]:
    """A message's content (a string, or a list of blocks) without ``cache_control``
    marks in its blocks, and whether any was there; ``content`` itself when none was.

    Examples:
        >>> content_without_cache_control(["hi", {"type": "text", "text": "x",
        ...                                "cache_control": {"type": "ephemeral"}}])
        (['hi', {'type': 'text', 'text': 'x'}], True)
    """
    if not isinstance(content, list):
        return content, False
    blocks: list[object] = []
    changed = False
    for block in content:
        if isinstance(block, Mapping):
            block, dropped = without_cache_control(block)
            changed = changed or dropped
        blocks.append(block)
    return (blocks if changed else content), changed


#: The ``type`` values of a tool given as a plain function schema (any provider's).
_FUNCTION_TOOL_TYPES = frozenset({"function", "custom"})
#: Keys that hold a function tool's schema, in OpenAI's and Anthropic's formats.
_SCHEMA_KEYS = ("function", "input_schema", "parameters")


def is_server_tool(tool: object) -> bool:
    """Whether ``tool`` (a tool as a mapping) is a provider's built-in server tool
    (``{"type": "web_search_20250305", ...}``, ``{"type": "web_search_preview"}``): a
    ``type`` other than a function's and no schema of its own. Such a tool means
    something only to its provider.

    Examples:
        >>> is_server_tool({"type": "web_search_20250305", "name": "web_search"})
        True
        >>> is_server_tool({"type": "function", "function": {"name": "add"}})
        False
    """
    if not isinstance(tool, Mapping):
        return False
    kind = tool.get("type")
    if not isinstance(kind, str) or kind in _FUNCTION_TOOL_TYPES:
        return False
    return not any(key in tool for key in _SCHEMA_KEYS)


def same_provider(client: object, other: object) -> bool:
    """Whether two clients come from the same provider package (``langchain_openai``,
    ``langchain_anthropic``...), read from the top-level package of their classes.

    Examples:
        >>> same_provider(1, 2), same_provider(1, object())
        (True, True)
    """
    return type(client).__module__.split(".")[0] == type(other).__module__.split(".")[0]
