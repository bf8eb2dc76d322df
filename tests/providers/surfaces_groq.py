"""The Groq rows of the provider matrix, and LlamaIndex's Azure OpenAI row.

Groq: the ``groq`` SDK (``Groq``, ``AsyncGroq``; a Stainless SDK like openai's) on the core
``FallbackChain``, LangChain's ``ChatGroq`` (``langchain-groq``, over the groq SDK) and
LlamaIndex's ``Groq`` (``llama-index-llms-groq``, an ``OpenAILike`` over the openai SDK),
each posting to ``/openai/v1/chat/completions`` on the fault server. Azure OpenAI:
LlamaIndex's ``AzureOpenAI`` (``llama-index-llms-azure-openai``), on the Azure route the
server already speaks.

Each builder takes the member's endpoint (anything with a ``root`` URL), its timeout and
``max_retries`` (None: the package's own default), as ``provider_surfaces.Row.member``
does. The question and the Azure names are ``provider_surfaces``'s, which imports this
module for its rows, so they are read from it at call time.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, Protocol


class _Endpoint(Protocol):
    @property
    def root(self) -> str: ...


GROQ_MODEL = "llama-3.3-70b-versatile"
GROQ_KEY = "sk-FAKE-groq"


def _question() -> str:
    from provider_surfaces import QUESTION

    return QUESTION


def _retries(max_retries: int | None) -> dict[str, int]:
    return {} if max_retries is None else {"max_retries": max_retries}


# -- groq.Groq and AsyncGroq on the core FallbackChain ----------------------------------


def groq_sdk(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import groq

    # The groq SDK's base URL is the host; it posts to /openai/v1/chat/completions.
    return groq.Groq(
        base_url=endpoint.root, api_key=GROQ_KEY, timeout=timeout, **_retries(max_retries)
    )


def async_groq_sdk(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import groq

    return groq.AsyncGroq(
        base_url=endpoint.root, api_key=GROQ_KEY, timeout=timeout, **_retries(max_retries)
    )


def _request(client: Any, *, stream: bool) -> Any:
    return client.chat.completions.create(
        model=GROQ_MODEL, messages=[{"role": "user", "content": _question()}], stream=stream
    )


def _text(chunk: Any) -> str:
    choices = getattr(chunk, "choices", None) or []
    return (choices[0].delta.content or "") if choices else ""


def groq_sdk_call(chain: Any) -> str:
    reply = chain.invoke(lambda _index, client: _request(client, stream=False))
    return str(reply.choices[0].message.content)


def _closing_chunks(client: Any) -> Iterator[Any]:
    # groq 0.37's Stream, unlike openai's, does not close its response when iteration
    # fails or stops early: the half-read response's generators are then finalized by
    # the garbage collector, which can run while this thread holds the connection pool's
    # lock (httpcore's is not reentrant) and so deadlock a later request on the same
    # client. ``with`` closes it at once, as a careful caller of the SDK does.
    with _request(client, stream=True) as stream:
        yield from stream


def groq_sdk_stream(chain: Any) -> Iterator[str]:
    chunks: Iterable[Any] = chain.stream(
        lambda _index, client: _closing_chunks(client),
        is_content=lambda chunk: bool(_text(chunk)),
    )
    return (text for text in map(_text, chunks) if text)


async def groq_sdk_acall(chain: Any) -> str:
    reply = await chain.ainvoke(lambda _index, client: _request(client, stream=False))
    return str(reply.choices[0].message.content)


async def _chunks(client: Any) -> AsyncIterator[Any]:
    async with await _request(client, stream=True) as stream:
        async for chunk in stream:
            yield chunk


async def groq_sdk_astream(chain: Any) -> AsyncIterator[str]:
    chunks: AsyncIterable[Any] = chain.astream(
        lambda _index, client: _chunks(client),
        is_content=lambda chunk: bool(_text(chunk)),
    )
    async for chunk in chunks:
        if text := _text(chunk):
            yield text


# -- LangChain: ChatGroq ----------------------------------------------------------------


def chat_groq(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from langchain_groq import ChatGroq

    # ChatGroq passes max_retries (default 2) and timeout to the groq clients it builds.
    return ChatGroq(  # type: ignore[call-arg]
        model=GROQ_MODEL,
        api_key=GROQ_KEY,
        base_url=endpoint.root,
        timeout=timeout,
        **_retries(max_retries),
    )


# -- LlamaIndex: Groq, and AzureOpenAI ---------------------------------------------------


def llama_groq(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from llama_index.llms.groq import Groq

    # An OpenAILike: the openai SDK on Groq's base URL, max_retries (default 3) passed to it,
    # and llama-index-llms-openai's own retry loop around each call. ``context_window``
    # spares it a model lookup for a model it does not know.
    return Groq(
        model=GROQ_MODEL,
        api_key=GROQ_KEY,
        api_base=f"{endpoint.root}/openai/v1",
        timeout=timeout,
        context_window=131_072,
        **_retries(max_retries),
    )


def llama_azure(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from llama_index.llms.azure_openai import AzureOpenAI
    from provider_surfaces import AZURE_API_VERSION, AZURE_DEPLOYMENT, OPENAI_MODEL

    return AzureOpenAI(
        model=OPENAI_MODEL,
        engine=AZURE_DEPLOYMENT,
        azure_endpoint=endpoint.root,
        api_version=AZURE_API_VERSION,
        api_key="sk-FAKE-azure",
        timeout=timeout,
        **_retries(max_retries),
    )
