"""FallbackLLM reads what it cannot answer from its first member; writes stay on the chain.

Code written against one LLM (``llm.model``, ``llm.temperature``, a custom attribute) keeps
working once that LLM is the primary of a chain.
"""

from __future__ import annotations

import copy
import pickle

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.llms import MockLLM
from llama_index.resilience import FallbackLLM
from llama_index.resilience.testing import FakeFunctionCallingLLM, rate_limit_error

openai_llms = pytest.importorskip("llama_index.llms.openai")

QUESTION = [ChatMessage(role=MessageRole.USER, content="Capital of France?")]


class FooLLM(MockLLM):
    """A picklable LLM with an attribute of its own."""

    foo: int = 0


def foo_llm(foo: int) -> FooLLM:
    llm = FooLLM()  # MockLLM's __init__ takes only its own options
    llm.foo = foo
    return llm


def openai_primary() -> object:
    return openai_llms.OpenAI(
        model="gpt-4o-mini", temperature=0.3, api_key="sk-FAKE-openai-key", max_retries=0
    )


def test_model_and_temperature_of_a_real_provider_llm_read_through_the_chain() -> None:
    primary = openai_primary()
    chain = FallbackLLM(llms=[primary, FakeFunctionCallingLLM(model_name="secondary")])

    assert chain.model == "gpt-4o-mini"
    assert chain.temperature == 0.3
    assert chain.max_retries == 0
    # The chain's own fields, properties and metadata answer for themselves.
    assert chain.llms[0] is primary
    assert chain.metadata.model_name == "fallback(gpt-4o-mini,secondary)"


def test_a_custom_attribute_reads_from_the_primary_and_a_missing_one_names_both() -> None:
    chain = FallbackLLM(llms=[foo_llm(3), FakeFunctionCallingLLM(model_name="secondary")])

    assert chain.foo == 3
    with pytest.raises(AttributeError) as raised:
        chain.text  # noqa: B018  # the secondary has it, the primary does not

    assert str(raised.value) == (
        "'FallbackLLM' object has no attribute 'text', nor has its first member (FooLLM)"
    )
    assert raised.value.name == "text"


def test_writes_land_on_the_chain_and_never_on_the_primary() -> None:
    primary = openai_primary()
    chain = FallbackLLM(llms=[primary, FakeFunctionCallingLLM()])

    with pytest.raises(ValueError, match='no field "temperature"'):
        chain.temperature = 0.0
    assert primary.temperature == 0.3

    chain.system_prompt = "Answer in French."
    assert chain.system_prompt == "Answer in French."
    assert primary.system_prompt is None


def test_private_and_dunder_names_are_never_read_from_the_primary() -> None:
    primary = FakeFunctionCallingLLM(model_name="primary")
    chain = FallbackLLM(llms=[primary, FakeFunctionCallingLLM()])

    assert chain.model_name == "primary"
    with pytest.raises(AttributeError, match="'FallbackLLM' object has no attribute '_calls'"):
        chain._calls  # noqa: B018
    with pytest.raises(AttributeError):
        chain.__wrapped__  # noqa: B018
    assert chain._chain.clients[0] is primary


def test_copies_and_pickles_of_a_chain_still_read_through_and_still_serve() -> None:
    chain = FallbackLLM(llms=[foo_llm(7), MockLLM()])

    for clone in (copy.copy(chain), copy.deepcopy(chain), pickle.loads(pickle.dumps(chain))):
        assert clone is not chain
        assert clone.foo == 7
        assert clone.chat(QUESTION).message.content == "user: Capital of France?\nassistant: "


async def test_reads_through_the_chain_change_nothing_about_which_member_serves() -> None:
    primary = FakeFunctionCallingLLM(model_name="primary", error=rate_limit_error())
    chain = FallbackLLM(llms=[primary, FakeFunctionCallingLLM(model_name="secondary")])

    assert chain.model_name == "primary"
    answer = await chain.achat(QUESTION)

    assert answer.message.content == "The fake model answers."
    assert primary.calls == 1
