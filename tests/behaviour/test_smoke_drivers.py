"""The drivers themselves: each framework's model answers and fails the way the suite expects."""

from __future__ import annotations

import pytest
from driver import Driver, Mode


async def test_an_answering_model_gives_its_text_in_every_call_shape(
    driver: Driver, mode: Mode
) -> None:
    reply = await driver.run(driver.answering("Paris is the capital."), mode)
    assert reply.text.strip() == "Paris is the capital."


async def test_a_fallback_of_a_failing_and_an_answering_model_answers_from_the_second(
    driver: Driver, mode: Mode
) -> None:
    failing = driver.failing()
    chain = driver.fallback([failing, driver.answering("from the secondary")])
    reply = await driver.run(chain, mode)
    assert reply.text.strip() == "from the secondary"
    assert driver.calls(failing) == 1


async def test_a_failing_model_alone_raises_its_error(driver: Driver, mode: Mode) -> None:
    error = driver.rate_limit_error()
    with pytest.raises(type(error)):
        await driver.run(driver.failing(error), mode)
