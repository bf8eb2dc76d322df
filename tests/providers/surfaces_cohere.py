"""The Cohere rows of the provider matrix: the v2 SDK (``cohere.ClientV2``, and
``AsyncClientV2``) on the core ``FallbackChain``, LangChain's ``ChatCohere``
(``langchain-cohere``, v2 over its ``cohere.Client``) in ``FallbackChatModel`` and
LlamaIndex's ``Cohere`` (``llama-index-llms-cohere``, which calls the v1 Chat API) in
``FallbackLLM``.

Each builder takes the member's endpoint (anything with a ``root`` URL), its timeout and
``max_retries`` (None: the package's own default), as ``provider_surfaces.Row.member``
does. The cohere SDK retries each call twice (429, 408, 409, 5xx; never a stream) unless
that call's ``request_options`` say otherwise, and neither its clients nor ``ChatCohere``
have a setting for it: a member built with ``max_retries`` keeps the request options a
user would pass on each call, and the row's calls (the SDK row) or its chain's
per-member arguments (``ChatCohere``) pass them. LlamaIndex's ``Cohere`` takes them in
``additional_kwargs``, which it sends with every request.

No builder asks a hub for a tokenizer: nothing here calls ``tokenize`` or
``get_num_tokens`` (``ChatCohere.get_num_tokens`` would download Cohere's tokenizer), and
every model is named, so ``ChatCohere`` never lists models to find a default.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import Any, Protocol


class _Endpoint(Protocol):
    @property
    def root(self) -> str: ...


#: A model every package knows (LlamaIndex's ``Cohere`` refuses names not in its table).
COHERE_MODEL = "command-a-03-2025"
COHERE_KEY = "sk-FAKE-cohere"

# The per-call request options each member was built with, as its user would pass them.
_OPTIONS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _question() -> str:
    from provider_surfaces import QUESTION

    return QUESTION


def _remember(member: Any, max_retries: int | None) -> Any:
    _OPTIONS[member] = {} if max_retries is None else {"max_retries": max_retries}
    return member


def _request_options(member: Any) -> dict[str, Any]:
    options = _OPTIONS.get(member) or {}
    return {"request_options": dict(options)} if options else {}


# -- the v2 SDK on the core FallbackChain ---------------------------------------------


def cohere_sdk(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import cohere

    client = cohere.ClientV2(api_key=COHERE_KEY, base_url=endpoint.root, timeout=timeout)
    return _remember(client, max_retries)


def async_cohere_sdk(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import cohere

    client = cohere.AsyncClientV2(api_key=COHERE_KEY, base_url=endpoint.root, timeout=timeout)
    return _remember(client, max_retries)


def _messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": _question()}]


def _chat(client: Any) -> Any:
    return client.chat(model=COHERE_MODEL, messages=_messages(), **_request_options(client))


def _chat_stream(client: Any) -> Any:
    # A generator: the request goes out when it is first iterated.
    return client.chat_stream(model=COHERE_MODEL, messages=_messages(), **_request_options(client))


def _reply_text(reply: Any) -> str:
    return "".join(block.text for block in reply.message.content if block.type == "text")


def _event_text(event: Any) -> str:
    if getattr(event, "type", None) != "content-delta":
        return ""
    content = event.delta.message.content
    return str(getattr(content, "text", "") or "") if content is not None else ""


def cohere_sdk_call(chain: Any) -> str:
    return _reply_text(chain.invoke(lambda _index, client: _chat(client)))


def cohere_sdk_stream(chain: Any) -> Iterator[str]:
    events: Iterable[Any] = chain.stream(
        lambda _index, client: _chat_stream(client),
        is_content=lambda event: bool(_event_text(event)),
    )
    return (text for text in map(_event_text, events) if text)


async def cohere_sdk_acall(chain: Any) -> str:
    return _reply_text(await chain.ainvoke(lambda _index, client: _chat(client)))


async def cohere_sdk_astream(chain: Any) -> AsyncIterator[str]:
    events: AsyncIterable[Any] = chain.astream(
        lambda _index, client: _chat_stream(client),
        is_content=lambda event: bool(_event_text(event)),
    )
    async for event in events:
        if text := _event_text(event):
            yield text


# -- LangChain: ChatCohere --------------------------------------------------------------


def chat_cohere(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from langchain_cohere import ChatCohere

    model = ChatCohere(  # type: ignore[call-arg]
        model=COHERE_MODEL,
        cohere_api_key=COHERE_KEY,
        base_url=endpoint.root,
        timeout_seconds=timeout,
    )
    # A pydantic model is not hashable: the options are kept by its (sync) client.
    _remember(model.client, max_retries)
    return model


def cohere_langchain_chain(members: list[Any], classifier: Any) -> Any:
    from langchain_llm_resilience import FallbackChatModel

    # ChatCohere sends its call arguments on as the v2 request: ``request_options`` is how
    # its retries are set, member by member.
    return FallbackChatModel(
        models=members,
        classifier=classifier,
        member_kwargs=[_request_options(member.client) for member in members],
    )


# -- LlamaIndex: Cohere -----------------------------------------------------------------


def llama_cohere(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from llama_index.llms.cohere import Cohere

    # Cohere's ``timeout`` never reaches its clients (cohere.Client is built without
    # one: 300 s), so the timeout travels in the request options too. Its ``max_retries``
    # counts the attempts of its own tenacity loop (503, 500 and 504, 4 to 10 s apart;
    # 1: none), each a call its client retries twice unless the options say otherwise.
    options: dict[str, Any] = {"timeout_in_seconds": timeout}
    retries: dict[str, Any] = {}
    if max_retries is not None:
        options["max_retries"] = max_retries
        retries["max_retries"] = max_retries + 1
    return Cohere(
        model=COHERE_MODEL,
        api_key=COHERE_KEY,
        base_url=endpoint.root,
        additional_kwargs={"request_options": options},
        **retries,
    )
