"""The secret rule (``llm_resilience.redact``): what is masked, and what stays readable.

The adapters show their members through :func:`redacted_fields`; these tests pin the
rule itself on plain values, pydantic models and opaque objects, with no framework.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from llm_resilience.redact import MASK, is_secret_field, redacted, redacted_fields, scrubbed

KEY = "sk-FAKE-test-key-for-redaction"


@pytest.mark.parametrize(
    "name",
    [
        "api_key",
        "openai_api_key",
        "anthropic_api_key",
        "apiKey",
        "APIKey",
        "x-api-key",
        "X-API-KEY",
        "apikey",
        "key",
        "subscription_key",
        "Ocp-Apim-Subscription-Key",
        "aws_secret_access_key",
        "private_key",
        "token",
        "access_token",
        "hf_token",
        "aws_session_token",
        "azure_ad_token_provider",
        "secret",
        "client_secret",
        "password",
        "passwd",
        "credentials",
        "Authorization",
        "Proxy-Authorization",
        "auth",
        "cookie",
        "sig",
        "dsn",
        "connection_string",
        "headers",
        "default_headers",
        "extra_headers",
        "_api_key",
    ],
)
def test_a_name_that_holds_a_credential_is_secret(name: str) -> None:
    assert is_secret_field(name)


@pytest.mark.parametrize(
    "name",
    [
        "model",
        "model_name",
        "max_tokens",
        "max_output_tokens",
        "token_limit",
        "token_counter",
        "tokenizer",
        "eos_token",
        "pad_token",
        "stop_token",
        "cache_key",
        "partition_key",
        "auth_type",
        "secret_name",
        "password_file",
        "api_base",
        "openai_api_base",
        "base_url",
        "temperature",
        "OpenAI-Organization",
        "",
    ],
)
def test_a_name_that_only_mentions_a_credential_word_is_not_secret(name: str) -> None:
    assert not is_secret_field(name)


def test_a_secret_named_value_is_masked_whatever_its_type() -> None:
    assert redacted(KEY, "api_key") == MASK
    assert redacted(b"raw-key-bytes", "private_key") == MASK
    assert redacted(12345678, "pin_password") == MASK
    assert redacted(lambda: KEY, "azure_ad_token_provider") == MASK


def test_none_false_and_empty_credentials_stay_visible_so_a_missing_key_can_be_seen() -> None:
    assert redacted(None, "api_key") is None
    assert redacted(False, "include_response_headers") is False
    assert redacted("", "api_key") == ""


def test_a_secret_str_is_shown_masked_under_any_name() -> None:
    assert repr(redacted(SecretStr(KEY))) == f"SecretStr('{MASK}')"
    assert repr(redacted(SecretStr(KEY), "model")) == f"SecretStr('{MASK}')"


def test_headers_keep_their_names_and_lose_every_value() -> None:
    headers = {"Authorization": f"Bearer {KEY}", "X-Trace": "abc", "Helicone-Auth": KEY}
    assert redacted(headers, "default_headers") == {
        "Authorization": MASK,
        "X-Trace": MASK,
        "Helicone-Auth": MASK,
    }


def test_mapping_keys_are_judged_as_field_names_at_any_depth() -> None:
    kwargs = {"model": "gpt-4o", "extra_body": {"metadata": {"api-key": KEY, "user": "u1"}}}
    assert redacted(kwargs) == {
        "model": "gpt-4o",
        "extra_body": {"metadata": {"api-key": MASK, "user": "u1"}},
    }


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://user:hunter2@proxy.example:8080/v1",
            f"https://user:{MASK}@proxy.example:8080/v1",
        ),
        ("https://ghp_abcdef123456@github.com/x", f"https://{MASK}@github.com/x"),
        ("redis://:s3cret@cache:6379/0", f"redis://:{MASK}@cache:6379/0"),
        ("https://u:p@ss@host/v1", f"https://u:{MASK}@host/v1"),
        (
            "https://generativelanguage.googleapis.com/v1?key=AbCd&alt=sse",
            f"https://generativelanguage.googleapis.com/v1?key={MASK}&alt=sse",
        ),
        (
            "https://acct.blob.core.windows.net/c?sv=2024&sig=Zm9vYmFy",
            f"https://acct.blob.core.windows.net/c?sv=2024&sig={MASK}",
        ),
        ("https://api.openai.com/v1", "https://api.openai.com/v1"),
    ],
)
def test_a_url_loses_its_userinfo_and_secret_query_parameters_and_keeps_the_rest(
    url: str, shown: str
) -> None:
    assert redacted(url, "api_base") == shown
    assert redacted(url) == shown


def test_credentials_in_free_text_are_masked() -> None:
    assert scrubbed("Authorization: Bearer abcdefgh12345678") == f"Authorization: Bearer {MASK}"
    assert scrubbed(f"use {KEY} here") == f"use sk-{MASK} here"
    google_shaped = "AIza" + "FAKE-test-key-for-redaction"  # never a key-shaped literal
    assert scrubbed(google_shaped) == f"AIza{MASK}"
    assert scrubbed("Client(api_key='abc123', model='m')") == f"Client(api_key='{MASK}', model='m')"
    assert scrubbed('{"password": "pw", "user": "u"}') == f'{{"password": "{MASK}", "user": "u"}}'
    assert scrubbed("Bearer tokens expire") == "Bearer tokens expire"


def test_plain_values_come_back_unchanged() -> None:
    class Mode(enum.StrEnum):
        DEFAULT = "default"

    for value in (None, True, 3, 0.5, "gpt-4o", b"bytes", Mode.DEFAULT):
        assert redacted(value, "model") is value
    assert redacted(("a", "b")) == ("a", "b")
    assert type(redacted(("a", "b"))) is tuple
    assert repr(redacted(MappingProxyType({"model": "m"}))) == "mappingproxy({'model': 'm'})"


class Provider(BaseModel):
    """A provider model as LlamaIndex's OpenAI keeps one: a plain str key."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str = "gpt-4o"
    api_key: str = KEY
    api_base: str = "https://user:hunter2@proxy.example/v1"
    default_headers: dict[str, str] = Field(default_factory=lambda: {"Authorization": KEY})
    secret_str_key: SecretStr = SecretStr(KEY)
    hidden: str = Field(default=KEY, repr=False)
    max_tokens: int = 256


class Layer(BaseModel):
    """A wrapper that shows its fields as the adapters' layers do."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: Any
    requests_per_minute: int = 60

    def __repr_args__(self) -> Any:
        return redacted_fields(super().__repr_args__())


def test_a_pydantic_model_is_shown_field_by_field_with_secrets_masked() -> None:
    shown = repr(redacted(Provider()))
    assert KEY not in shown
    assert "hunter2" not in shown
    assert shown == (
        f"Provider(model='gpt-4o', api_key='{MASK}', "
        f"api_base='https://user:{MASK}@proxy.example/v1', "
        f"default_headers={{'Authorization': '{MASK}'}}, "
        f"secret_str_key=SecretStr('{MASK}'), max_tokens=256)"
    )


def test_a_model_without_secrets_is_shown_exactly_as_pydantic_shows_it() -> None:
    plain = Provider(api_key="", api_base="https://api.openai.com/v1", default_headers={})
    plain_repr = repr(plain)
    assert repr(redacted(plain)) == plain_repr


def test_a_wrapper_using_redacted_fields_hides_nested_secrets_in_repr_and_str() -> None:
    stack = Layer(inner=Layer(inner=[Provider(), Provider(model="gpt-4o-mini")]))
    for text in (repr(stack), str(stack), f"{stack!r}", f"{stack}"):
        assert KEY not in text
        assert "hunter2" not in text
        assert "Layer(inner=[Provider(model='gpt-4o'" in text
        assert "gpt-4o-mini" in text
    assert repr(stack).startswith("Layer(inner=Layer(inner=[Provider(model='gpt-4o'")


def test_redacting_twice_shows_the_same_text() -> None:
    once = repr(redacted(Layer(inner=Provider())))
    assert repr(redacted(redacted(Layer(inner=Provider())))) == once


def test_a_model_with_its_own_repr_is_shown_by_that_repr_not_field_by_field() -> None:
    class Terse(BaseModel):
        text: str = "private prompt text"
        api_key: str = KEY

        def __repr__(self) -> str:
            return f"Terse(api_key={self.api_key!r})"

    assert repr(redacted(Terse())) == f"Terse(api_key='{MASK}')"


def test_a_dataclass_or_other_object_is_shown_by_its_repr_with_the_text_rules() -> None:
    @dataclass
    class Client:
        base_url: str
        api_key: str

    shown = repr(redacted(Client("https://x", KEY)))
    assert shown.endswith(f"Client(base_url='https://x', api_key='{MASK}')")
    opaque = object()
    assert redacted(opaque) is opaque


def test_a_model_that_holds_itself_is_shown_without_endless_recursion() -> None:
    loop = Layer(inner=[])
    loop.inner.append(loop)
    assert repr(redacted(loop)) == "Layer(inner=[Layer(...)], requests_per_minute=60)"
