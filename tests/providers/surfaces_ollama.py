"""The Ollama rows of the provider matrix: the ``ollama`` SDK's ``Client`` and
``AsyncClient`` on the core ``FallbackChain``, LangChain's ``ChatOllama``
(``langchain-ollama``) and LlamaIndex's ``Ollama`` (``llama-index-llms-ollama``), each
calling Ollama's native ``POST /api/chat`` and streaming it as newline-delimited JSON
from the fault server.

Each builder takes the member's endpoint (anything with a ``root`` URL), its timeout and
``max_retries``, as ``provider_surfaces.Row.member`` does. The ollama SDK has no retries
of its own (its httpx client makes one request; only an httpx transport built with
``retries=N`` would retry a failed connect), and neither ChatOllama nor LlamaIndex's
Ollama adds any: ``max_retries`` has nothing to set, whatever it says. The question is
``provider_surfaces``'s, which imports this module for its rows, so it is read from it at
call time.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, Protocol


class _Endpoint(Protocol):
    @property
    def root(self) -> str: ...


#: The model every Ollama member asks for, as ``ollama pull`` names it.
OLLAMA_MODEL = "llama3.2"
# LlamaIndex's Ollama asks the server for the model's context window (``/api/show``)
# unless it is given one.
_CONTEXT_WINDOW = 8192


def _messages() -> list[dict[str, str]]:
    from provider_surfaces import QUESTION

    return [{"role": "user", "content": QUESTION}]


# -- the ollama SDK on the core FallbackChain -------------------------------------------


def ollama_sdk(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import ollama

    # No retry option exists: ``max_retries`` (None, the default, or 0) changes nothing.
    return ollama.Client(host=endpoint.root, timeout=timeout)


def async_ollama_sdk(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import ollama

    return ollama.AsyncClient(host=endpoint.root, timeout=timeout)


def _text(part: Any) -> str:
    message = getattr(part, "message", None)
    return str(getattr(message, "content", "") or "") if message is not None else ""


def ollama_sdk_call(chain: Any) -> str:
    reply = chain.invoke(
        lambda _index, client: client.chat(model=OLLAMA_MODEL, messages=_messages(), stream=False)
    )
    return _text(reply)


def ollama_sdk_stream(chain: Any) -> Iterator[str]:
    # ``chat(stream=True)`` returns a generator: the request goes out at its first item.
    parts: Iterable[Any] = chain.stream(
        lambda _index, client: client.chat(model=OLLAMA_MODEL, messages=_messages(), stream=True),
        is_content=lambda part: bool(_text(part)),
    )
    return (text for text in map(_text, parts) if text)


async def ollama_sdk_acall(chain: Any) -> str:
    reply = await chain.ainvoke(
        lambda _index, client: client.chat(model=OLLAMA_MODEL, messages=_messages(), stream=False)
    )
    return _text(reply)


async def _parts(client: Any) -> AsyncIterator[Any]:
    async for part in await client.chat(model=OLLAMA_MODEL, messages=_messages(), stream=True):
        yield part


async def ollama_sdk_astream(chain: Any) -> AsyncIterator[str]:
    parts: AsyncIterable[Any] = chain.astream(
        lambda _index, client: _parts(client), is_content=lambda part: bool(_text(part))
    )
    async for part in parts:
        if text := _text(part):
            yield text


# -- LangChain: ChatOllama ---------------------------------------------------------------


def chat_ollama(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from langchain_ollama import ChatOllama

    # ``client_kwargs`` go to both ollama clients (and so to httpx): the timeout.
    return ChatOllama(
        model=OLLAMA_MODEL, base_url=endpoint.root, client_kwargs={"timeout": timeout}
    )


# -- LlamaIndex: Ollama ------------------------------------------------------------------


def llama_ollama(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from llama_index.llms.ollama import Ollama

    return Ollama(
        model=OLLAMA_MODEL,
        base_url=endpoint.root,
        request_timeout=timeout,
        context_window=_CONTEXT_WINDOW,
    )
