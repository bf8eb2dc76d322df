"""A chain reads what it cannot answer from its first member; writes stay on the chain.

Code written against one model (its model name, ``temperature``, a custom attribute)
keeps working once that model is the primary of a chain.
"""

from __future__ import annotations

from typing import Any

import pytest
from fallback_driver import clones

from llm_resilience.testing import FaultInjectingServer


@pytest.fixture
def server() -> Any:
    with FaultInjectingServer() as started:
        yield started


def test_a_real_provider_clients_settings_read_through_the_chain(
    driver: Any, server: FaultInjectingServer
) -> None:
    primary = driver.openai_member(server, "gpt-4o-mini", temperature=0.3)
    secondary = driver.answering(model="secondary")
    chain = driver.fallback([primary, secondary], per_client_timeout=30)

    assert getattr(chain, driver.model_attribute) == "gpt-4o-mini"
    assert chain.temperature == 0.3
    assert chain.max_retries == 0
    # The chain's own fields and properties answer for themselves.
    assert chain.per_client_timeout == 30
    assert chain.inner == (primary, secondary)


def test_a_custom_attribute_reads_from_the_primary_and_a_missing_one_names_both(
    driver: Any,
) -> None:
    primary = driver.with_attribute(foo=3)
    chain = driver.fallback([primary, driver.plain()])

    assert chain.foo == 3
    with pytest.raises(AttributeError) as raised:
        chain.no_such_setting  # noqa: B018

    chain_type, primary_type = type(chain).__name__, type(primary).__name__
    assert str(raised.value) == (
        f"'{chain_type}' object has no attribute 'no_such_setting', nor has its first "
        f"member ({primary_type})"
    )
    assert raised.value.name == "no_such_setting"
    assert raised.value.obj is chain
    assert not hasattr(chain, "no_such_setting")


def test_an_attribute_only_the_secondary_has_is_not_read(driver: Any) -> None:
    chain = driver.fallback([driver.plain(), driver.with_attribute(foo=4)])

    with pytest.raises(AttributeError, match=f"'{type(chain).__name__}' object has no attribute"):
        chain.foo  # noqa: B018


def test_writes_land_on_the_chain_and_never_on_the_primary(
    driver: Any, server: FaultInjectingServer
) -> None:
    primary = driver.openai_member(server, temperature=0.3)
    chain = driver.fallback([primary, driver.answering()])

    with pytest.raises(ValueError, match='no field "temperature"'):
        chain.temperature = 0.0
    assert primary.temperature == 0.3
    assert chain.temperature == 0.3

    field, value = driver.own_field
    setattr(chain, field, value)
    assert getattr(chain, field) == value
    assert getattr(primary, field) != value


def test_private_and_dunder_names_are_never_read_from_the_primary(driver: Any) -> None:
    primary = driver.answering(model="primary")
    chain = driver.fallback([primary, driver.answering()])

    assert getattr(chain, "model_name") == "primary"  # noqa: B009  # read through
    with pytest.raises(
        AttributeError, match=f"'{type(chain).__name__}' object has no attribute '_calls'"
    ):
        chain._calls  # noqa: B018
    with pytest.raises(AttributeError):
        chain.__wrapped__  # noqa: B018


async def test_copies_and_pickles_of_a_chain_still_read_through_and_still_serve(
    driver: Any,
) -> None:
    chain = driver.fallback([driver.with_attribute(foo=7), driver.plain()])

    for clone in clones(chain):
        assert clone is not chain
        assert clone.foo == 7
        assert driver.served_by(await driver.run(clone, "call")) == 0
        with pytest.raises(AttributeError):
            clone.bar  # noqa: B018


async def test_reads_through_the_chain_change_nothing_about_which_member_serves(
    driver: Any,
) -> None:
    primary = driver.failing(model="primary-model")
    chain = driver.fallback([primary, driver.answering("from the secondary")])

    assert getattr(chain, "model_name") == "primary-model"  # noqa: B009
    reply = await driver.run(chain, "acall")

    assert reply.text == "from the secondary"
    assert driver.served_by(reply) == 1
    assert driver.calls(primary) == 1
