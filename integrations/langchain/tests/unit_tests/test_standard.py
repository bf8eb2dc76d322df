"""LangChain's standard chat-model unit suite over the three wrappers and the fake.

``FallbackChatModel``, ``CostTrackedChatModel`` and ``RateLimitedChatModel`` each run it
over the scripted fake (the chain after a member that always answers HTTP 429), so a
wrapper that broke a LangChain contract the fake keeps fails here.

Skipped by the suite itself, by design:

* ``test_init_from_env``: ``init_from_env_params`` is empty because neither class reads
  environment variables (a chain's members read their own);
* ``test_serdes``: neither class is LangChain-serializable (``is_lc_serializable()`` is
  False), since a chain holds arbitrary member objects and the fake is a test double.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_llm_resilience import CostTrackedChatModel, FallbackChatModel, RateLimitedChatModel
from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel
from llm_resilience import CostBudget, InMemoryCostLedger


@pytest.fixture
def benchmark(benchmark: Any) -> Any:
    """pytest-benchmark's fixture, told to run the suite's timing tests just once.

    Timings of offline fakes have no baseline to compare with; one run still checks
    the code path works.
    """
    benchmark.disabled = True
    return benchmark


class TestScriptedChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ScriptedChatModel]:
        return ScriptedChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "scripted-secondary"}


class TestFallbackChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[FallbackChatModel]:
        return FallbackChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"models": [FailingChatModel(), ScriptedChatModel(model="scripted-secondary")]}


class TestCostTrackedChatModelUnit(ChatModelUnitTests):
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


class TestRateLimitedChatModelUnit(ChatModelUnitTests):
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
