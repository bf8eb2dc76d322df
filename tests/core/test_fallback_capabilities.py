"""What a chain's members can do, and so the chain: the rules both adapters ask.

LangChain's ``FallbackChatModel.profile`` and LlamaIndex's ``FallbackLLM.metadata`` are
both :func:`merge_capabilities` over their members; each member's routing profile is
:func:`member_profile` over what its framework says of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from llm_resilience import FallbackChain
from llm_resilience.fallback import (
    MemberProfile,
    RequestNeeds,
    member_profile,
    merge_capabilities,
)
from llm_resilience.fallback._routing import MAX_CONTEXT_WINDOW

# -- what the chain can do -------------------------------------------------------------


def test_a_chain_can_do_what_every_member_can_within_the_smallest_stated_limits() -> None:
    merged = merge_capabilities(
        [
            {"max_input_tokens": 200_000, "tool_calling": True, "image_inputs": True},
            {"max_input_tokens": 128_000, "tool_calling": True, "image_inputs": False},
        ]
    )

    assert merged == {"max_input_tokens": 128_000, "tool_calling": True, "image_inputs": False}


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        # A member that states no limit (or 0 or less: "unknown") sets no bound.
        ([{"num_output": -1}, {"num_output": 512}], {"num_output": 512}),
        ([{"max_output_tokens": 4_096}, None], {"max_output_tokens": 4_096}),
        ([{"context_window": 0}, {"context_window": -1}], {}),
        # A flag holds only when every member says so; one member's False is the chain's.
        ([{"pdf_inputs": True}, {}], {}),
        ([{"pdf_inputs": False}, None], {"pdf_inputs": False}),
        # Any other value stands when every member states the same one.
        ([{"status": "ga"}, {"status": "ga"}], {"status": "ga"}),
        ([{"status": "ga"}, {"status": "beta"}], {}),
        ([{"status": "ga"}, {}], {}),
        ([None, None], {}),
    ],
    ids=[
        "unknown-limit-no-bound",
        "member-without-profile-no-bound",
        "no-member-states-a-limit",
        "flag-unknown-in-one",
        "flag-false-in-one",
        "same-text",
        "different-text",
        "text-unknown-in-one",
        "nothing-known",
    ],
)
def test_what_a_member_does_not_state_neither_raises_nor_lowers_the_chain(
    members: list[dict[str, Any] | None], expected: dict[str, Any]
) -> None:
    assert merge_capabilities(members) == expected


def test_the_declared_member_profiles_win_under_the_framework_s_own_keys() -> None:
    merged = merge_capabilities(
        [{"max_input_tokens": 1_000_000, "tool_calling": True}, None],
        [
            MemberProfile(context_window=32_000, assistant_prefill=True),
            MemberProfile(tool_calling=True),
        ],
        {"context_window": "max_input_tokens", "tool_calling": "tool_calling"},
    )

    # A deployment capped at 32k bounds the chain; assistant_prefill has no key here.
    assert merged == {"max_input_tokens": 32_000, "tool_calling": True}


# -- what one member can do ------------------------------------------------------------


class ChatAnthropic:
    """Stands for ``langchain_anthropic.ChatAnthropic``: matched by package and name."""


ChatAnthropic.__module__ = "langchain_anthropic.chat_models"

PREFILL = (("langchain_anthropic", "ChatAnthropic"),)


class MyAnthropic(ChatAnthropic):
    """A user's subclass, in the user's own module."""


class ChatAnthropicLookalike:
    """The same name in another package is not the class that takes a prefill."""


ChatAnthropicLookalike.__name__ = "ChatAnthropic"
ChatAnthropicLookalike.__module__ = "langchain_anthropic_extras.chat"


@pytest.mark.parametrize(
    ("client", "prefill"),
    [(ChatAnthropic(), True), (MyAnthropic(), True), (ChatAnthropicLookalike(), None)],
    ids=["the-class", "a-subclass", "a-lookalike"],
)
def test_a_member_takes_a_prefill_when_its_class_or_a_base_is_known_to(
    client: object, prefill: bool | None
) -> None:
    profile = member_profile(client, prefill_classes=PREFILL)

    assert (profile.assistant_prefill if profile else None) is prefill


@pytest.mark.parametrize(
    ("window", "credible"),
    [
        (128_000, 128_000),
        (MAX_CONTEXT_WINDOW, MAX_CONTEXT_WINDOW),
        (MAX_CONTEXT_WINDOW + 1, None),
        (0, None),
        (-1, None),
        (True, None),
        (128_000.0, None),
        ("128000", None),
    ],
)
def test_only_a_credible_context_window_is_known(window: object, credible: int | None) -> None:
    profile = member_profile(object(), context_window=window, tool_calling=True)

    assert profile is not None
    assert profile.context_window == credible


def test_a_flag_that_is_not_a_bool_is_unknown_and_a_member_known_for_nothing_has_no_profile() -> (
    None
):
    assert member_profile(object(), tool_calling="yes", image_inputs=1) is None
    assert member_profile(object(), structured_output=False) == MemberProfile(
        structured_output=False
    )


@pytest.mark.parametrize(
    ("declared", "served_by"),
    [(None, "tools"), ([MemberProfile(tool_calling=True), None], "no-tools")],
    ids=["framework-facts", "declared-wins"],
)
def test_what_a_framework_says_of_a_member_routes_it_and_declared_fields_win(
    declared: list[MemberProfile | None] | None, served_by: str
) -> None:
    chain = FallbackChain(
        ["no-tools", "tools"],
        member_profiles=declared,
        profile_of=lambda client: member_profile(client, tool_calling=client == "tools"),
    )

    answer = chain.invoke(lambda index, client: client, needs=RequestNeeds(tool_calling=True))

    assert answer == served_by
