"""The behaviour suite's fixtures: every test runs once per adapter (and per call shape
where it takes ``mode``)."""

from __future__ import annotations

import os
import sys

import pytest

# The suite's helper modules (driver.py and the concerns' drivers) import by bare name,
# as tests/providers' do: the tree has no packages (pytest's importlib mode).
_HERE = os.path.dirname(__file__)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from cost_driver import LangChainCost, LlamaIndexCost  # noqa: E402
from driver import MODES, Driver, LangChainDriver, LlamaIndexDriver, Mode  # noqa: E402
from fallback_driver import LangChainFallback, LlamaIndexFallback  # noqa: E402
from store_driver import LangChainStores, LlamaIndexStores  # noqa: E402


class LangChain(LangChainFallback, LangChainCost, LangChainStores, LangChainDriver):
    """Everything the suite drives in LangChain."""


class LlamaIndex(LlamaIndexFallback, LlamaIndexCost, LlamaIndexStores, LlamaIndexDriver):
    """Everything the suite drives in LlamaIndex."""


DRIVERS: dict[str, type[Driver]] = {"langchain": LangChain, "llamaindex": LlamaIndex}


@pytest.fixture(params=sorted(DRIVERS))
def driver(request: pytest.FixtureRequest) -> Driver:
    """One adapter's driver: the test runs against LangChain and against LlamaIndex."""
    return DRIVERS[request.param]()


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> Mode:
    """A call shape: call, acall, stream, astream."""
    mode: Mode = request.param
    return mode
