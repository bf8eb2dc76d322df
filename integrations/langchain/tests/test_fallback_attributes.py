"""FallbackChatModel reads what it cannot answer from its first member, as ``with_fallbacks``.

Code written against one model keeps reading ``model.model_name``, ``model.temperature``
or a custom attribute once that model is the primary of a chain; writes stay on the chain.
"""

from __future__ import annotations

import copy
import pickle

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models import FakeListChatModel
from langchain_openai import ChatOpenAI
from pydantic import PrivateAttr

from langchain_llm_resilience import FallbackChatModel
from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel


class FooModel(ScriptedChatModel):
    """A model with attributes of its own, like langchain-core's ``FakeStructuredOutputModel``."""

    foo: int = 0
    _hidden: str = PrivateAttr(default="the primary's private state")


class BarModel(ScriptedChatModel):
    bar: int = 0


def openai_primary() -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-4o-mini", temperature=0.3, api_key="sk-FAKE-openai-key", max_retries=0
    )


def anthropic_secondary() -> ChatAnthropic:
    return ChatAnthropic(  # type: ignore[call-arg]
        model="claude-haiku-4-5", temperature=0.9, api_key="sk-FAKE-anthropic-key", max_retries=0
    )


def test_unknown_attributes_are_read_from_the_first_member_as_with_fallbacks_reads_them() -> None:
    # langchain-core's own test_fallbacks_getattr, with our chain in place of with_fallbacks.
    chain = FallbackChatModel(models=[FooModel(foo=3), BarModel(bar=4)])
    built_in = FooModel(foo=3).with_fallbacks([BarModel(bar=4)])

    assert chain.foo == built_in.foo == 3
    with pytest.raises(AttributeError):
        built_in.bar  # noqa: B018
    with pytest.raises(AttributeError, match=r"'FallbackChatModel' object has no attribute 'bar'"):
        chain.bar  # noqa: B018


def test_a_missing_attribute_error_names_the_chain_the_attribute_and_the_primary() -> None:
    chain = FallbackChatModel(models=[openai_primary(), anthropic_secondary()])

    with pytest.raises(AttributeError) as raised:
        chain.no_such_setting  # noqa: B018

    assert str(raised.value) == (
        "'FallbackChatModel' object has no attribute 'no_such_setting', nor has its first "
        "member (ChatOpenAI)"
    )
    assert raised.value.name == "no_such_setting"
    assert raised.value.obj is chain
    assert not hasattr(chain, "no_such_setting")


def test_model_name_and_temperature_of_a_real_provider_model_read_through_the_chain() -> None:
    primary, secondary = openai_primary(), anthropic_secondary()
    chain = FallbackChatModel(models=[primary, secondary], per_client_timeout=30)

    assert chain.model_name == "gpt-4o-mini"
    assert chain.temperature == 0.3
    assert chain.max_retries == 0
    # The chain's own fields and properties answer for themselves.
    assert chain.per_client_timeout == 30
    assert chain.inner == (primary, secondary)
    assert chain.rate_limiter is None


def test_writes_land_on_the_chain_and_never_on_the_primary() -> None:
    primary = openai_primary()
    chain = FallbackChatModel(models=[primary, anthropic_secondary()])

    with pytest.raises(ValueError, match='no field "temperature"'):
        chain.temperature = 0.0
    assert primary.temperature == 0.3
    assert chain.temperature == 0.3

    chain.verbose = True
    assert chain.verbose is True
    assert primary.verbose is False


def test_private_and_dunder_names_are_never_read_from_the_primary() -> None:
    chain = FallbackChatModel(models=[FooModel(foo=3), BarModel()])

    with pytest.raises(
        AttributeError, match="'FallbackChatModel' object has no attribute '_hidden'"
    ):
        chain._hidden  # noqa: B018
    with pytest.raises(AttributeError):
        chain.__wrapped__  # noqa: B018
    # The chain's own private state still resolves through pydantic.
    assert chain._chain.clients[0] is chain.models[0]


class PicklableFooModel(FakeListChatModel):
    """The fakes of our testing module hold locks, which pickle drops; this one holds none."""

    foo: int = 0


def test_copies_and_pickles_of_a_chain_still_read_through_and_still_serve() -> None:
    chain = FallbackChatModel(
        models=[
            PicklableFooModel(foo=7, responses=["from the primary"]),
            FakeListChatModel(responses=["from the secondary"]),
        ]
    )

    for clone in (copy.copy(chain), copy.deepcopy(chain), pickle.loads(pickle.dumps(chain))):
        assert clone is not chain
        assert clone.foo == 7
        assert clone.responses == ["from the primary"]
        assert clone.invoke("hello").text == "from the primary"
        with pytest.raises(AttributeError):
            clone.bar  # noqa: B018


async def test_reads_through_the_chain_change_nothing_about_which_member_serves() -> None:
    primary = FailingChatModel(model="primary-model")
    chain = FallbackChatModel(models=[primary, ScriptedChatModel(responses=["from the secondary"])])

    assert chain.model_name == "primary-model"
    answer = await chain.ainvoke("hello")

    assert answer.text == "from the secondary"
    assert answer.response_metadata["fallback_served_by"] == [1]
    assert primary.calls == 1
