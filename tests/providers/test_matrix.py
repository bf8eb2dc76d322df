"""The provider conformance matrix, cell by cell, through real SDKs and integrations.

Each cell is a fallback chain of two members of the same row (a bare SDK client in the
core ``FallbackChain``, or a LangChain or LlamaIndex model in its adapter's chain), both
built with ``max_retries=0``. The first member's server fails the way the provider does;
the second is healthy. The cell's expected outcome, from ``provider_cases.py``, is either
"falls back" (the healthy member answers) or "propagates" (the provider's own error
reaches the caller and the healthy member is never asked); either way the failing member
was asked exactly once. ``docs/providers.md`` is written from the same cells.
"""

from __future__ import annotations

import importlib.util
import urllib.parse
from collections.abc import Iterator

import pytest
from provider_cases import (
    DELIVERED,
    TIMEOUT,
    Cell,
    Classifier,
    async_cells,
    cells,
    classifiers_to_prove,
)
from provider_surfaces import (
    AZURE_DEPLOYMENT,
    BEDROCK_MODEL,
    GEMINI_MODEL,
    UNRESOLVABLE_HOST,
    Endpoint,
    Row,
)

from llm_resilience import TransientClassifier
from llm_resilience.testing import FaultInjectingServer
from llm_resilience.transient import status_code_of

FAILING_REPLY = "one two three four five six"
HEALTHY_REPLY = "the healthy member answered this request"

# Azure names the deployment in the path (and the API version in the query).
PATHS = {
    "OpenAI": "/v1/chat/completions",
    "Azure OpenAI": f"/openai/deployments/{AZURE_DEPLOYMENT}/chat/completions",
    "Anthropic": "/v1/messages",
    # botocore escapes the model id's ``:`` in the path; a stream asks ``converse-stream``.
    "AWS Bedrock": f"/model/{urllib.parse.quote(BEDROCK_MODEL, safe='')}/converse",
    # Gemini names the method after the model: a stream asks ``:streamGenerateContent``.
    "Google Gemini": f"/v1beta/models/{GEMINI_MODEL}:generateContent",
    # Mistral's path is OpenAI's; the fault server serves it under /mistral.
    "Mistral": "/mistral/v1/chat/completions",
    # Groq serves OpenAI's API under /openai/v1.
    "Groq": "/openai/v1/chat/completions",
    # Ollama's native chat API: one path, the body says whether to stream.
    "Ollama": "/api/chat",
    # Cohere's v2 Chat API; LlamaIndex's Cohere calls v1's.
    "Cohere": "/v2/chat",
}


# Rows whose call streams on the wire too: ChatOllama's ``invoke`` sends ``"stream": true``
# (its default) and joins the chunks.
STREAMED_CALLS = frozenset({"ollama-langchain"})


def _path(row: Row, *, stream: bool) -> str:
    path = PATHS[row.provider]
    if stream and row.wire == "gemini":
        return path.replace(":generateContent", ":streamGenerateContent")
    if stream and row.wire == "bedrock":
        return path + "-stream"
    if row.key == "cohere-llamaindex":
        return "/v1/chat"
    return path


CLASSIFIER_OBJECTS: dict[Classifier, TransientClassifier] = {
    "default": TransientClassifier(),
    "server-errors": TransientClassifier.with_server_errors(),
}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[FaultInjectingServer, FaultInjectingServer]]:
    with (
        FaultInjectingServer(reply=FAILING_REPLY, name="failing") as failing,
        FaultInjectingServer(reply=HEALTHY_REPLY, name="healthy") as healthy,
    ):
        yield failing, healthy


# Members hold no state between requests, and building one costs its SDK's HTTP client
# (an SSL context each): one per row, endpoint and timeout serves every cell.
_members: dict[tuple[str, Endpoint, float, bool], object] = {}


def _member(row: Row, endpoint: Endpoint, timeout: float, *, asynchronous: bool = False) -> object:
    key = (row.key, endpoint, timeout, asynchronous)
    if key not in _members:
        build = row.amember if asynchronous else row.member
        assert build is not None, f"{row.key} has no async client"
        _members[key] = build(endpoint, timeout=timeout, max_retries=0)
    return _members[key]


def _status_along(exc: BaseException) -> int | None:
    current: BaseException | None = exc
    while current is not None:
        status = status_code_of(current)
        if status is not None:
            return status
        current = current.__cause__
    return None


def _params(chosen: list[Cell] | None = None) -> list[object]:
    params: list[object] = []
    for cell in cells() if chosen is None else chosen:
        missing = importlib.util.find_spec(cell.row.package.split(".")[0]) is None
        for classifier in classifiers_to_prove(cell, every=chosen is None):
            marks = (
                [pytest.mark.skip(reason=f"{cell.row.package} not installed")] if missing else []
            )
            params.append(pytest.param(cell, classifier, id=f"{cell.id}-{classifier}", marks=marks))
    return params


@pytest.mark.parametrize(("cell", "classifier"), _params())
def test_each_provider_failure_falls_back_or_propagates_as_the_matrix_says(
    cell: Cell,
    classifier: Classifier,
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
    refused_port: int,
) -> None:
    failing, healthy = servers
    failing.reset()
    healthy.reset()
    column, row = cell.column, cell.row
    if column.target == "server":
        failing.script(cell.fault)
        endpoint = Endpoint("127.0.0.1", failing.port)
    elif column.target == "refused":
        endpoint = Endpoint("127.0.0.1", refused_port)
    else:
        endpoint = Endpoint(UNRESOLVABLE_HOST, failing.port)
    members = [
        _member(row, endpoint, column.timeout),
        _member(row, Endpoint("127.0.0.1", healthy.port), TIMEOUT),
    ]
    chain = row.chain(members, CLASSIFIER_OBJECTS[classifier])
    delivered: list[str] = []

    def run() -> str:
        if cell.mode == "call":
            return row.call(chain)
        # Chunks are taken one at a time, so a failure mid-stream leaves those before it.
        assert row.stream is not None, f"{row.key} has no stream"
        for text in row.stream(chain):
            delivered.append(text)
        return "".join(delivered)

    if column.expected(classifier, row) == "falls back":
        answer = run()
        if cell.mode == "stream-after":
            # The failing member's first chunks stay delivered; the healthy member restarts.
            assert answer == " ".join(FAILING_REPLY.split()[:DELIVERED]) + HEALTHY_REPLY
        else:
            assert answer == HEALTHY_REPLY
        assert len(healthy.requests) == 1
    else:
        with pytest.raises(Exception) as caught:
            run()
        if column.status_for(row) is not None:
            assert _status_along(caught.value) == column.status_for(row), repr(caught.value)
        assert healthy.requests == []
        expected_delivered = DELIVERED if cell.mode == "stream-after" else 0
        assert len(delivered) == expected_delivered
    asked = len(failing.requests)
    assert asked == (1 if column.target == "server" else 0)
    if asked:
        assert failing.requests[0].stream == (cell.mode != "call" or row.key in STREAMED_CALLS)
        assert failing.requests[0].path == _path(row, stream=cell.mode != "call")


# One event loop for every async cell: the async HTTP clients the members (and the
# provider packages' caches) hold stay bound to the loop they were made in.
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("cell", "classifier"), _params(async_cells()))
async def test_the_async_paths_fall_back_or_propagate_as_the_matrix_says(
    cell: Cell,
    classifier: Classifier,
    servers: tuple[FaultInjectingServer, FaultInjectingServer],
) -> None:
    failing, healthy = servers
    failing.reset()
    healthy.reset()
    column, row = cell.column, cell.row
    failing.script(cell.fault)
    members = [
        _member(row, Endpoint("127.0.0.1", server.port), TIMEOUT, asynchronous=True)
        for server in (failing, healthy)
    ]
    chain = row.chain(members, CLASSIFIER_OBJECTS[classifier])
    delivered: list[str] = []

    async def run() -> str:
        assert row.acall is not None, f"{row.key} has no async"
        assert row.astream is not None, f"{row.key} has no async stream"
        if cell.mode == "call":
            return await row.acall(chain)
        async for text in row.astream(chain):
            delivered.append(text)
        return "".join(delivered)

    if column.expected(classifier, row) == "falls back":
        answer = await run()
        restarted = (
            " ".join(FAILING_REPLY.split()[:DELIVERED]) if cell.mode == "stream-after" else ""
        )
        assert answer == restarted + HEALTHY_REPLY
        assert len(healthy.requests) == 1
    else:
        with pytest.raises(Exception) as caught:
            await run()
        if column.status_for(row) is not None:
            assert _status_along(caught.value) == column.status_for(row), repr(caught.value)
        assert healthy.requests == []
        assert len(delivered) == (DELIVERED if cell.mode == "stream-after" else 0)
    assert len(failing.requests) == 1
    assert failing.requests[0].path == _path(row, stream=cell.mode != "call")
