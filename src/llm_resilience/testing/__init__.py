"""Test doubles for resilience stacks: a local LLM server that fails on cue.

[`FaultInjectingServer`][] answers like the OpenAI Chat Completions and Anthropic
Messages APIs on ``127.0.0.1``, so real SDK clients (and the LangChain and LlamaIndex
models built on them) run against it unchanged, while a script of [`Fault`][] values
makes chosen requests fail with 429s, 5xx, hangs, refused connections, slow first
tokens, streams that stall or are cut mid-body, a content filter
([`Fault.content_filtered`][llm_resilience.testing.Fault.content_filtered]) or a refused assistant
prefill ([`Fault.prefill_rejected`][llm_resilience.testing.Fault.prefill_rejected]). A request that
ends with an assistant message is answered with the rest of the reply after it, as a provider that
takes a prefill does.

Examples:
    >>> from llm_resilience.testing import Fault, FaultInjectingServer
    >>> with FaultInjectingServer(reply="Paris.") as server:
    ...     server.script(Fault.status(429), Fault.drop_mid_stream(after_chunks=2))
    ...     len(server.pending)
    2

[`FaultProxy`][] does the same for a real PostgreSQL or Redis: a TCP proxy that can
go silent (connections open, nothing answers) or reset every connection, on cue.

`FakeFaults` is the fault state the adapters' fake models share: the requests
counted, hangs that end at their seconds or on `release()`, and a fresh copy of the
configured error for each raise; `HasFakeFaults` shows it on a fake as `calls`,
`last_error` and `release()`.

``fresh_error`` copies a configured exception for each raise (so a fake raising it many
times keeps no traceback alive); the ``openai`` SDK errors the adapters' fake models
raise are built in ``llm_resilience.testing.errors``, and their tool arguments and
structured answers in ``llm_resilience.testing.schema``.

pytest users get ``fault_server`` and ``fault_server_factory`` fixtures with
``pytest_plugins = ["llm_resilience.testing.fixtures"]``. Only the standard library is
imported here.
"""

from __future__ import annotations

from llm_resilience.testing._fake_faults import FakeFaults, HasFakeFaults
from llm_resilience.testing._proxy import FaultProxy, ProxyMode
from llm_resilience.testing._server import Fault, FaultInjectingServer, ServedRequest
from llm_resilience.testing.errors import fresh_error

__all__ = [
    "FakeFaults",
    "Fault",
    "FaultInjectingServer",
    "FaultProxy",
    "HasFakeFaults",
    "ProxyMode",
    "ServedRequest",
    "fresh_error",
]
