"""LangChain's standard chat-model integration suite, run offline.

``TestFallbackChatModel`` runs the suite over ``FallbackChatModel(models=[a model that
always answers HTTP 429, ScriptedChatModel])``, so every call in every test first fails
over. ``TestFallbackChatModelWithTimeout`` runs it again with a ``per_client_timeout``,
which sends sync calls through the chain's worker threads. ``TestCostTrackedChatModel``
and ``TestRateLimitedChatModel`` run it over the cost and rate-limit layers on the
scripted fake. ``TestScriptedChatModel``
runs it over the scripted fake alone, which tells a wrapper bug from a fake's bug.

No test here touches the network: the suite's multimodal tests download their inputs
from the internet, so their feature flags stay False (and sockets are disabled anyway).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests
from pytest_socket import disable_socket, enable_socket

from langchain_llm_resilience import CostTrackedChatModel, FallbackChatModel, RateLimitedChatModel
from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel
from llm_resilience import CostBudget, InMemoryCostLedger


@pytest.fixture(autouse=True)
def _no_network() -> Iterator[None]:
    """Any test that tried to reach the internet fails instead (event loops use AF_UNIX)."""
    disable_socket(allow_unix_socket=True)
    yield
    enable_socket()


@pytest.fixture
def benchmark(benchmark: Any) -> Any:
    """pytest-benchmark's fixture, told to run the suite's timing tests just once.

    Timings of offline fakes have no baseline to compare with; one run still checks
    the code path works.
    """
    benchmark.disabled = True
    return benchmark


@pytest.fixture
def vcr() -> None:
    """No cassettes: nothing here makes HTTP calls (``enable_vcr_tests`` is False)."""
    return None


class _OfflineFlags(ChatModelIntegrationTests):
    """Feature flags shared by every offline class; each says why it is what it is."""

    @property
    def supports_json_mode(self) -> bool:
        # ScriptedChatModel implements method="json_mode" (keys named in the prompt).
        return True

    @property
    def model_override_value(self) -> str:
        # ScriptedChatModel reports a per-call model="..." as its model_name.
        return "scripted-override"

    @property
    def supports_anthropic_inputs(self) -> bool:
        # Histories with Anthropic tool_use and thinking blocks are accepted (the fake
        # reads the text). With supports_image_inputs False this test needs no network.
        return True

    # Kept False, so the suite skips test_image_inputs, test_pdf_inputs,
    # test_audio_inputs, test_image_tool_message and test_pdf_tool_message: each
    # downloads its input from the internet, which these offline tests must not do,
    # and the fake has no multimodal understanding to test anyway.
    @property
    def supports_image_inputs(self) -> bool:
        return False

    @property
    def supports_image_urls(self) -> bool:
        return False

    @property
    def supports_pdf_inputs(self) -> bool:
        return False

    @property
    def supports_audio_inputs(self) -> bool:
        return False

    @property
    def supports_image_tool_message(self) -> bool:
        return False

    @property
    def supports_pdf_tool_message(self) -> bool:
        return False

    @property
    def enable_vcr_tests(self) -> bool:
        # Skips test_stream_time: a VCR cassette records HTTP, and there is none here.
        return False

    @property
    def supported_usage_metadata_details(self) -> dict[Any, list[Any]]:
        # The fake reports input/output totals only: no audio, reasoning or cache detail.
        return {"invoke": [], "stream": []}


class TestScriptedChatModel(_OfflineFlags):
    @property
    def chat_model_class(self) -> type[ScriptedChatModel]:
        return ScriptedChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "scripted-secondary"}


class TestFallbackChatModel(_OfflineFlags):
    @property
    def chat_model_class(self) -> type[FallbackChatModel]:
        return FallbackChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Fresh members per model: the fixture builds one chain per test.
        return {"models": [FailingChatModel(), ScriptedChatModel(model="scripted-secondary")]}


class TestFallbackChatModelWithTimeout(TestFallbackChatModel):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        # A bound far above any attempt's duration: the timeout never fires, but sync
        # calls and streams now run in the chain's worker threads.
        return {**super().chat_model_params, "per_client_timeout": 10}


class TestCostTrackedChatModel(_OfflineFlags):
    @property
    def chat_model_class(self) -> type[CostTrackedChatModel]:
        return CostTrackedChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # A limit far above any test's spend, and an explicit ledger (no in-memory warning).
        return {
            "inner": ScriptedChatModel(model="scripted-secondary"),
            "budget": CostBudget(3, 15, daily_limit=1_000),
            "ledger": InMemoryCostLedger(),
        }


class TestRateLimitedChatModel(_OfflineFlags):
    @property
    def chat_model_class(self) -> type[RateLimitedChatModel]:
        return RateLimitedChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # Budgets far above any test's calls: the permits never make a test wait.
        return {
            "inner": ScriptedChatModel(model="scripted-secondary"),
            "requests_per_minute": 100_000,
            "tokens_per_minute": 100_000_000,
        }
