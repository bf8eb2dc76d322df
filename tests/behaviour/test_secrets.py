"""No wrapper of either adapter shows a member's credentials: repr, str, errors, what the
framework derives from it (tools, structured output), its dumps and what its tracers get.

The members are the real provider classes, built with keys, auth headers and URLs that
carry passwords (constructing them needs no network; they are never called). The rule
itself (what is a secret) is tested once, in ``tests/core/test_redact.py``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from cost_driver import HEADER_TOKEN, SECRETS

from llm_resilience import CostBudget
from llm_resilience.ledger import InMemoryCostLedger

BUDGET = CostBudget(
    input_price_per_mtok=3, output_price_per_mtok=15, embedding_price_per_mtok=1, daily_limit=25
)


def shown(obj: object) -> list[str]:
    """Every way a user or a logger prints ``obj``."""
    texts = [repr(obj), str(obj), f"{obj!r}", f"{obj}", "%s %r" % (obj, obj)]  # noqa: UP031
    rich = getattr(obj, "__rich_repr__", None)
    if rich is not None:
        texts.append(repr(list(rich())))
    return texts


def assert_no_secret(text: str) -> None:
    leaked = [secret for secret in SECRETS if secret in text]
    assert not leaked, f"{leaked} shown in: {text[:400]}..."


def keyed_fallback(driver: Any, *members: Any) -> Any:
    return driver.fallback(list(members or (driver.keyed_openai(), driver.keyed_anthropic())))


def test_the_openai_member_used_here_does_show_credentials_in_its_own_repr(driver: Any) -> None:
    # What the wrappers must not pass on: the provider class's own repr shows its auth header.
    assert HEADER_TOKEN in repr(driver.keyed_openai())


@pytest.mark.parametrize("layer", ["fallback", "rate_limited", "cost_tracked"])
def test_a_chat_wrapper_repr_and_str_never_show_a_members_credentials(
    driver: Any, layer: str
) -> None:
    member = driver.keyed_openai()
    if layer == "fallback":
        wrapper = keyed_fallback(driver)
    elif layer == "rate_limited":
        wrapper = driver.rate_limited(member, requests_per_minute=60)
    else:
        wrapper = driver.cost_tracked(member, budget=BUDGET, ledger=InMemoryCostLedger())
    for text in shown(wrapper):
        assert_no_secret(text)
    assert repr(wrapper).startswith(f"{type(wrapper).__name__}(")
    if layer != "fallback":
        assert f"inner={type(member).__name__}(" in repr(wrapper)


@pytest.mark.parametrize("layer", ["rate_limited", "cost_tracked"])
def test_an_embeddings_wrapper_repr_never_shows_the_embeddings_credentials(
    driver: Any, layer: str
) -> None:
    inner = driver.keyed_embeddings()
    if layer == "rate_limited":
        wrapper = driver.rate_limited_embeddings(inner, requests_per_minute=60)
    else:
        wrapper = driver.cost_tracked_embeddings(inner, budget=BUDGET, ledger=InMemoryCostLedger())
    for text in shown(wrapper):
        assert_no_secret(text)
    assert type(wrapper).__name__ in repr(wrapper)


def test_a_nested_stack_repr_shows_every_layer_and_no_credentials(driver: Any) -> None:
    # CostTracked(RateLimited(Fallback([openai, anthropic]))), as the builder makes it.
    limited = driver.rate_limited(keyed_fallback(driver), requests_per_minute=60)
    model = driver.cost_tracked(limited, budget=BUDGET, ledger=InMemoryCostLedger())
    for text in shown(model):
        assert_no_secret(text)
    kinds = driver.layer_types()
    text = repr(model)
    assert text.startswith(f"{kinds['cost'].__name__}(")
    assert f"inner={kinds['rate'].__name__}(" in text
    assert f"inner={kinds['fallback'].__name__}(" in text
    assert "requests_per_minute=60" in text
    assert "gpt-4o" in text
    assert "claude-sonnet-4-5" in text


def test_a_fallback_of_fallbacks_hides_the_credentials_of_nested_members(driver: Any) -> None:
    model = keyed_fallback(driver, keyed_fallback(driver), driver.keyed_anthropic())
    for text in shown(model):
        assert_no_secret(text)
    assert repr(model).count(f"{type(model).__name__}(") == 2


def test_a_wrappers_own_error_messages_name_types_not_members(driver: Any) -> None:
    errors: list[str] = []
    with pytest.raises(ValueError) as too_few:
        driver.fallback([driver.keyed_openai()])
    errors.append(str(too_few.value))
    embeddings = driver.keyed_embeddings()
    with pytest.raises(TypeError) as not_chat:
        driver.fallback([driver.keyed_openai(), embeddings])
    errors.append(str(not_chat.value))
    with pytest.raises(TypeError) as not_embeddings:
        driver.rate_limited_embeddings(driver.keyed_openai(), requests_per_minute=60)
    errors.append(str(not_embeddings.value))
    for message in errors:
        assert_no_secret(message)
    assert type(embeddings).__name__ in errors[1]


def test_a_fallback_repr_still_names_its_members_and_their_models_with_credentials_masked(
    driver: Any,
) -> None:
    openai, anthropic = driver.keyed_openai(), driver.keyed_anthropic()
    text = repr(driver.fallback([openai, anthropic]))
    assert f"{type(openai).__name__}(" in text
    assert f"{type(anthropic).__name__}(" in text
    assert "='gpt-4o'" in text
    assert "model='claude-sonnet-4-5'" in text
    assert re.search(r"api_key=(SecretStr\()?'\*{10}'", text)
    assert "default_headers={'Authorization': '**********'}" in text
    assert "api_base='https://team:**********@gateway.example/v1'" in text


def stack(driver: Any, *members: Any, **options: Any) -> Any:
    """CostTracked(RateLimited(Fallback(members))), as the builder makes it."""
    limited = driver.rate_limited(keyed_fallback(driver, *members), requests_per_minute=60)
    return driver.cost_tracked(limited, budget=BUDGET, ledger=InMemoryCostLedger(), **options)


def test_what_the_framework_derives_from_a_stack_prints_without_credentials(
    driver: Any,
) -> None:
    model = stack(driver)
    for derived in driver.derived(model):
        for text in shown(derived):
            assert_no_secret(text)
        assert f"{type(model).__name__}(" in repr(derived)


def test_serializing_a_stack_for_tracing_adds_no_credential(driver: Any) -> None:
    model = stack(driver)
    limited = driver.rate_limited_embeddings(driver.keyed_embeddings(), requests_per_minute=60)
    embeddings = driver.cost_tracked_embeddings(limited, budget=BUDGET)
    records = driver.records_of(model)
    assert records
    for record in records + driver.records_of(embeddings):
        assert_no_secret(repr(record))


def test_a_traced_call_through_a_stack_sends_no_credential_to_the_frameworks_tracers(
    driver: Any,
) -> None:
    # The offline primary answers, so the keyed real members are carried but never called.
    def build(**options: Any) -> Any:
        members = (driver.answering(), driver.keyed_openai(), driver.keyed_anthropic())
        return stack(driver, *members, **options)

    traced = driver.traced_call(build)
    assert traced
    for text in traced:
        assert_no_secret(text)
