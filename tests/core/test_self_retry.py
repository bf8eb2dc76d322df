"""What retries by itself: one registry and one advice rule for the fallback chain's and the
retry wrappers' warnings (``llm_resilience.self_retry``)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from llm_resilience import RetryPolicy
from llm_resilience.self_retry import (
    self_retry_setting,
    warn_if_self_retrying,
    warn_of_multiplied_retries,
)


class _SelfRetrying:
    def __init__(self, max_retries: int) -> None:
        self.max_retries = max_retries


class _BotocoreClient:
    """Looks like a boto3 client to the rule: a botocore class with its retry config."""

    __module__ = "botocore.client"

    def __init__(self, total_max_attempts: int) -> None:
        retries = {"mode": "standard", "total_max_attempts": total_max_attempts}
        self.meta = SimpleNamespace(config=SimpleNamespace(retries=retries))


def test_an_object_is_warned_about_once_whichever_layer_noticed_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience")
    model = _SelfRetrying(max_retries=2)

    warn_if_self_retrying(model, position=0)
    warn_of_multiplied_retries(model, RetryPolicy(), wrapper="RetryingThing")
    warn_if_self_retrying(model, position=1)

    (record,) = caplog.records
    assert record.name == "llm_resilience.fallback"
    assert "retries by itself (max_retries=2)" in record.getMessage()


def test_the_retry_wrappers_warning_gives_the_settings_own_advice(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="llm_resilience.retry")
    client = _BotocoreClient(total_max_attempts=3)
    assert self_retry_setting(client) == ("retries.total_max_attempts", 3)

    warn_of_multiplied_retries(client, RetryPolicy(attempts=2), wrapper="RetryingThing")

    (record,) = caplog.records
    assert record.name == "llm_resilience.retry"
    assert 'Config(retries={"total_max_attempts": 1})' in record.getMessage()
    assert "max_retries=0" not in record.getMessage()
    # total_max_attempts counts attempts in all: 2 policy attempts of 3 client attempts each.
    assert "up to 2 x 3 = 6 times" in record.getMessage()
