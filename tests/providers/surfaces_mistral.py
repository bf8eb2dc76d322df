"""The Mistral rows of the provider matrix: the ``mistralai`` SDK's ``Mistral`` client on the
core ``FallbackChain`` (``chat.complete``/``chat.stream`` and their async twins),
``langchain-mistralai``'s ``ChatMistralAI`` (which calls the HTTP API with httpx itself,
not through the SDK) and LlamaIndex's ``MistralAI`` (over the SDK).

Each builder takes the member's endpoint (anything with a ``root`` URL), its timeout and
``max_retries`` (None: the package's own default), as ``provider_surfaces.Row.member``
does. The fault server serves Mistral's API under ``/mistral`` (its path is OpenAI's).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, Protocol


class _Endpoint(Protocol):
    @property
    def root(self) -> str: ...


MISTRAL_MODEL = "mistral-small-latest"
MISTRAL_KEY = "sk-FAKE-mistral"


def _question() -> str:
    from provider_surfaces import QUESTION

    return QUESTION


def _server_url(endpoint: _Endpoint) -> str:
    return f"{endpoint.root}/mistral"


# -- mistralai on the core FallbackChain -------------------------------------------------


def mistral_retry_config(retries: int) -> Any:
    """A ``RetryConfig`` that backs off for about ``retries`` short waits (10 ms, doubling,
    bounded by the elapsed-time budget): the SDK counts time, not attempts."""
    from mistralai.client.utils import BackoffStrategy, RetryConfig

    budget = sum(10 * 2**attempt for attempt in range(retries))
    return RetryConfig("backoff", BackoffStrategy(10, 100, 2.0, budget, jitter_ms=0), False)


def mistral_sdk(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from mistralai.client import Mistral

    # The SDK retries only with a RetryConfig (``retry_config=``, or ``retries=`` per
    # call); its default is one attempt. None keeps that default; a count builds a
    # backoff config (``mistral_retry_config``); 0 is the default too.
    options: dict[str, Any] = {}
    if max_retries:
        options["retry_config"] = mistral_retry_config(max_retries)
    return Mistral(
        api_key=MISTRAL_KEY,
        server_url=_server_url(endpoint),
        timeout_ms=int(timeout * 1000),
        **options,
    )


def _messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": _question()}]


def _chunk_text(event: Any) -> str:
    # ``chat.stream`` yields CompletionEvent values: the chunk is ``.data``.
    choices = getattr(getattr(event, "data", None), "choices", None) or []
    content = choices[0].delta.content if choices else None
    return content if isinstance(content, str) else ""


def _reply_text(reply: Any) -> str:
    content = reply.choices[0].message.content
    return content if isinstance(content, str) else ""


def mistral_sdk_call(chain: Any) -> str:
    reply = chain.invoke(
        lambda _index, client: client.chat.complete(model=MISTRAL_MODEL, messages=_messages())
    )
    return _reply_text(reply)


def mistral_sdk_stream(chain: Any) -> Iterator[str]:
    events: Iterable[Any] = chain.stream(
        lambda _index, client: client.chat.stream(model=MISTRAL_MODEL, messages=_messages()),
        is_content=lambda event: bool(_chunk_text(event)),
    )
    return (text for text in map(_chunk_text, events) if text)


async def mistral_sdk_acall(chain: Any) -> str:
    reply = await chain.ainvoke(
        lambda _index, client: client.chat.complete_async(model=MISTRAL_MODEL, messages=_messages())
    )
    return _reply_text(reply)


async def _events(client: Any) -> AsyncIterator[Any]:
    async for event in await client.chat.stream_async(model=MISTRAL_MODEL, messages=_messages()):
        yield event


async def mistral_sdk_astream(chain: Any) -> AsyncIterator[str]:
    events: AsyncIterable[Any] = chain.astream(
        lambda _index, client: _events(client),
        is_content=lambda event: bool(_chunk_text(event)),
    )
    async for event in events:
        if text := _chunk_text(event):
            yield text


# -- LangChain: ChatMistralAI ------------------------------------------------------------


def chat_mistral(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import httpx
    from langchain_mistralai import ChatMistralAI

    # Its ``max_retries`` (default 5) is the attempts in all of a tenacity loop around
    # each request, on httpx transport errors only (refused, timed out, cut), 4 to 10 s
    # apart: 1 is one attempt. An error status is never retried.
    retries = {} if max_retries is None else {"max_retries": max_retries + 1}
    base_url = f"{_server_url(endpoint)}/v1"
    # Its ``timeout`` is a whole number of seconds; the httpx clients it would build
    # are built here, as it builds them, with the row's timeout (0.2 s for a read timeout).
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "Authorization": f"Bearer {MISTRAL_KEY}",
    }
    return ChatMistralAI(  # type: ignore[call-arg]
        model=MISTRAL_MODEL,
        api_key=MISTRAL_KEY,
        endpoint=base_url,
        client=httpx.Client(base_url=base_url, headers=headers, timeout=timeout),
        async_client=httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout),
        **retries,
    )


# -- LlamaIndex: MistralAI ---------------------------------------------------------------


def llama_mistral(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from llama_index.llms.mistralai import MistralAI

    # Its ``max_retries`` (default 5) goes to the SDK as ``retries=`` on every call,
    # where only a RetryConfig turns retrying on: an int leaves one attempt.
    retries = {} if max_retries is None else {"max_retries": max_retries}
    return MistralAI(
        model=MISTRAL_MODEL,
        api_key=MISTRAL_KEY,
        endpoint=_server_url(endpoint),
        timeout=timeout,
        **retries,
    )
