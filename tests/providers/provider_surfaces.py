"""The rows of the provider matrix: each a real SDK client or framework model, and how a
fallback chain of two of them is called and streamed.

Every row builds its members from the real packages (``openai``, ``anthropic``,
``langchain-openai``, ``langchain-anthropic``, ``llama-index-llms-openai``,
``llama-index-llms-anthropic``, ``boto3``, ``langchain-aws`` and
``llama-index-llms-bedrock-converse`` for AWS Bedrock (``surfaces_bedrock``), ``google-genai``,
``langchain-google-genai`` and ``llama-index-llms-google-genai`` for Gemini, ``mistralai``,
``langchain-mistralai`` and ``llama-index-llms-mistralai`` for Mistral (``surfaces_mistral``),
``groq``, ``langchain-groq`` and ``llama-index-llms-groq`` for Groq and
``llama-index-llms-azure-openai`` (``surfaces_groq``), ``ollama``, ``langchain-ollama`` and
``llama-index-llms-ollama`` for Ollama (``surfaces_ollama``), ``cohere``, ``langchain-cohere``
and ``llama-index-llms-cohere`` for Cohere (``surfaces_cohere``)) pointed at an :class:`Endpoint` on 127.0.0.1 (or at an
unresolvable host name), and runs them in the fallback chain of its surface: the core
:class:`~llm_resilience.fallback.FallbackChain` for a bare SDK, ``FallbackChatModel``
for LangChain, ``FallbackLLM`` for LlamaIndex.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from surfaces_bedrock import (
    bedrock_sdk,
    bedrock_sdk_call,
    bedrock_sdk_stream,
    chat_bedrock,
    langchain_text_astream,
    langchain_text_stream,
    llama_bedrock,
)
from surfaces_cohere import (
    async_cohere_sdk,
    chat_cohere,
    cohere_langchain_chain,
    cohere_sdk,
    cohere_sdk_acall,
    cohere_sdk_astream,
    cohere_sdk_call,
    cohere_sdk_stream,
    llama_cohere,
)
from surfaces_groq import (
    async_groq_sdk,
    chat_groq,
    groq_sdk,
    groq_sdk_acall,
    groq_sdk_astream,
    groq_sdk_call,
    groq_sdk_stream,
    llama_azure,
    llama_groq,
)
from surfaces_mistral import (
    chat_mistral,
    llama_mistral,
    mistral_sdk,
    mistral_sdk_acall,
    mistral_sdk_astream,
    mistral_sdk_call,
    mistral_sdk_stream,
)
from surfaces_ollama import (
    async_ollama_sdk,
    chat_ollama,
    llama_ollama,
    ollama_sdk,
    ollama_sdk_acall,
    ollama_sdk_astream,
    ollama_sdk_call,
    ollama_sdk_stream,
)

Wire = Literal["openai", "anthropic", "bedrock", "gemini", "mistral", "groq", "ollama", "cohere"]
Surface = Literal["SDK", "LangChain", "LlamaIndex"]

QUESTION = "What is the capital of France?"
OPENAI_MODEL = "gpt-4o-mini"
AZURE_DEPLOYMENT = "gpt-4o-mini-deployment"
AZURE_API_VERSION = "2024-10-21"
CLAUDE = "claude-haiku-4-5"
#: A Bedrock model id; botocore sends it in the path, its ``:`` escaped.
BEDROCK_MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
GEMINI_MODEL = "gemini-2.5-flash"
# A host name that can never resolve (RFC 6761): a DNS failure without any network.
UNRESOLVABLE_HOST = "nonexistent.invalid"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a member sends its requests: a local port, or an unresolvable host."""

    host: str
    port: int

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Row:
    """One client of one provider, and the fallback chain it runs in."""

    #: Stable id, used in test ids and the generated table.
    key: str
    #: The provider as the table names it: "OpenAI", "Azure OpenAI", "Anthropic".
    provider: str
    surface: Surface
    #: The class the row exercises, as the table shows it.
    client: str
    #: The error bodies and stream format the provider's API sends.
    wire: Wire
    #: ``member(endpoint, timeout=..., max_retries=...)``: one chain member.
    member: Callable[..., Any]
    #: ``chain(members, classifier)``: the fallback chain over the members.
    chain: Callable[[list[Any], Any], Any]
    #: ``call(chain)``: one request; the reply text.
    call: Callable[[Any], str]
    #: ``stream(chain)``: one streamed request; the text of each content chunk, as it
    #: comes; None where the fault server does not speak the row's stream format yet.
    stream: Callable[[Any], Iterator[str]] | None
    #: The package the row needs importable.
    package: str
    #: ``amember(endpoint, ...)``: a member for async calls (the SDKs' async clients);
    #: None, with ``acall`` and ``astream``, for a client with no async API (boto3).
    amember: Callable[..., Any] | None
    #: ``await acall(chain)``: one async request; the reply text.
    acall: Callable[[Any], Awaitable[str]] | None
    #: ``astream(chain)``: one async streamed request; each content chunk's text.
    astream: Callable[[Any], AsyncIterator[str]] | None


# -- the three surfaces' chains ----------------------------------------------------------


def _core_chain(members: list[Any], classifier: Any) -> Any:
    from llm_resilience.fallback import FallbackChain

    return FallbackChain(members, classifier=classifier)


def _langchain_chain(members: list[Any], classifier: Any) -> Any:
    from langchain_llm_resilience import FallbackChatModel

    return FallbackChatModel(models=members, classifier=classifier)


def _llama_chain(members: list[Any], classifier: Any) -> Any:
    from llama_index.resilience import FallbackLLM

    return FallbackLLM(llms=members, classifier=classifier)


def _langchain_call(chain: Any) -> str:
    return str(chain.invoke(QUESTION).content)


def _langchain_stream(chain: Any) -> Iterator[str]:
    return (str(chunk.content) for chunk in chain.stream(QUESTION) if chunk.content)


async def _langchain_acall(chain: Any) -> str:
    return str((await chain.ainvoke(QUESTION)).content)


async def _langchain_astream(chain: Any) -> AsyncIterator[str]:
    async for chunk in chain.astream(QUESTION):
        if chunk.content:
            yield str(chunk.content)


def _llama_messages() -> list[Any]:
    from llama_index.core.base.llms.types import ChatMessage, MessageRole

    return [ChatMessage(role=MessageRole.USER, content=QUESTION)]


def _llama_call(chain: Any) -> str:
    return str(chain.chat(_llama_messages()).message.content)


def _llama_stream(chain: Any) -> Iterator[str]:
    return (part.delta for part in chain.stream_chat(_llama_messages()) if part.delta)


async def _llama_acall(chain: Any) -> str:
    return str((await chain.achat(_llama_messages())).message.content)


async def _llama_astream(chain: Any) -> AsyncIterator[str]:
    async for part in await chain.astream_chat(_llama_messages()):
        if part.delta:
            yield part.delta


# -- OpenAI and Azure OpenAI through the bare SDK ---------------------------------------


def _openai_sdk(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import openai

    retries = {} if max_retries is None else {"max_retries": max_retries}
    return openai.OpenAI(
        base_url=f"{endpoint.root}/v1", api_key="sk-FAKE-openai", timeout=timeout, **retries
    )


def _azure_sdk(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import openai

    retries = {} if max_retries is None else {"max_retries": max_retries}
    return openai.AzureOpenAI(
        azure_endpoint=endpoint.root,
        azure_deployment=AZURE_DEPLOYMENT,
        api_version=AZURE_API_VERSION,
        api_key="sk-FAKE-azure",
        timeout=timeout,
        **retries,
    )


def _async_openai_sdk(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import openai

    retries = {} if max_retries is None else {"max_retries": max_retries}
    return openai.AsyncOpenAI(
        base_url=f"{endpoint.root}/v1", api_key="sk-FAKE-openai", timeout=timeout, **retries
    )


def _async_azure_sdk(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import openai

    retries = {} if max_retries is None else {"max_retries": max_retries}
    return openai.AsyncAzureOpenAI(
        azure_endpoint=endpoint.root,
        azure_deployment=AZURE_DEPLOYMENT,
        api_version=AZURE_API_VERSION,
        api_key="sk-FAKE-azure",
        timeout=timeout,
        **retries,
    )


def _openai_request(client: Any, *, stream: bool) -> Any:
    return client.chat.completions.create(
        model=OPENAI_MODEL, messages=[{"role": "user", "content": QUESTION}], stream=stream
    )


def _openai_text(chunk: Any) -> str:
    choices = getattr(chunk, "choices", None) or []
    return (choices[0].delta.content or "") if choices else ""


def _openai_sdk_call(chain: Any) -> str:
    reply = chain.invoke(lambda _index, client: _openai_request(client, stream=False))
    return str(reply.choices[0].message.content)


def _openai_sdk_stream(chain: Any) -> Iterator[str]:
    chunks: Iterable[Any] = chain.stream(
        lambda _index, client: _openai_request(client, stream=True),
        is_content=lambda chunk: bool(_openai_text(chunk)),
    )
    return (text for text in map(_openai_text, chunks) if text)


async def _openai_sdk_acall(chain: Any) -> str:
    reply = await chain.ainvoke(lambda _index, client: _openai_request(client, stream=False))
    return str(reply.choices[0].message.content)


async def _openai_chunks(client: Any) -> AsyncIterator[Any]:
    async for chunk in await _openai_request(client, stream=True):
        yield chunk


async def _openai_sdk_astream(chain: Any) -> AsyncIterator[str]:
    chunks: AsyncIterable[Any] = chain.astream(
        lambda _index, client: _openai_chunks(client),
        is_content=lambda chunk: bool(_openai_text(chunk)),
    )
    async for chunk in chunks:
        if text := _openai_text(chunk):
            yield text


# -- Anthropic through the bare SDK ------------------------------------------------------


def _anthropic_sdk(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import anthropic

    retries = {} if max_retries is None else {"max_retries": max_retries}
    return anthropic.Anthropic(
        base_url=endpoint.root, api_key="sk-FAKE-anthropic", timeout=timeout, **retries
    )


def _async_anthropic_sdk(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    import anthropic

    retries = {} if max_retries is None else {"max_retries": max_retries}
    return anthropic.AsyncAnthropic(
        base_url=endpoint.root, api_key="sk-FAKE-anthropic", timeout=timeout, **retries
    )


def _anthropic_request(client: Any, *, stream: bool) -> Any:
    return client.messages.create(
        model=CLAUDE,
        max_tokens=64,
        messages=[{"role": "user", "content": QUESTION}],
        stream=stream,
    )


def _anthropic_text(event: Any) -> str:
    if getattr(event, "type", None) != "content_block_delta":
        return ""
    return str(getattr(event.delta, "text", "") or "")


def _anthropic_sdk_call(chain: Any) -> str:
    reply = chain.invoke(lambda _index, client: _anthropic_request(client, stream=False))
    return "".join(block.text for block in reply.content if block.type == "text")


def _anthropic_sdk_stream(chain: Any) -> Iterator[str]:
    events: Iterable[Any] = chain.stream(
        lambda _index, client: _anthropic_request(client, stream=True),
        is_content=lambda event: bool(_anthropic_text(event)),
    )
    return (text for text in map(_anthropic_text, events) if text)


async def _anthropic_sdk_acall(chain: Any) -> str:
    reply = await chain.ainvoke(lambda _index, client: _anthropic_request(client, stream=False))
    return "".join(block.text for block in reply.content if block.type == "text")


async def _anthropic_events(client: Any) -> AsyncIterator[Any]:
    async for event in await _anthropic_request(client, stream=True):
        yield event


async def _anthropic_sdk_astream(chain: Any) -> AsyncIterator[str]:
    events: AsyncIterable[Any] = chain.astream(
        lambda _index, client: _anthropic_events(client),
        is_content=lambda event: bool(_anthropic_text(event)),
    )
    async for event in events:
        if text := _anthropic_text(event):
            yield text


# -- AWS Bedrock: boto3, ChatBedrockConverse, BedrockConverse, in ``surfaces_bedrock`` ---


# -- Google Gemini through google-genai --------------------------------------------------


def _gemini_options(endpoint: Endpoint, timeout: float, max_retries: int | None) -> Any:
    from google.genai import types

    # google-genai retries only when given ``retry_options``; ``attempts`` counts the first
    # request too. None keeps the SDK's default: no retry options, one attempt.
    retry = None if max_retries is None else types.HttpRetryOptions(attempts=max_retries + 1)
    # Its timeout is in milliseconds.
    return types.HttpOptions(
        base_url=endpoint.root, timeout=int(timeout * 1000), retry_options=retry
    )


def _gemini_sdk(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from google import genai

    return genai.Client(
        api_key="sk-FAKE-gemini", http_options=_gemini_options(endpoint, timeout, max_retries)
    )


def _async_gemini_sdk(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    return _gemini_sdk(endpoint, timeout=timeout, max_retries=max_retries).aio


def _gemini_text(chunk: Any) -> str:
    # ``.text`` joins the first candidate's text parts; None when there are none.
    candidates = getattr(chunk, "candidates", None) or []
    return (chunk.text or "") if candidates else ""


def _gemini_sdk_call(chain: Any) -> str:
    reply = chain.invoke(
        lambda _index, client: client.models.generate_content(model=GEMINI_MODEL, contents=QUESTION)
    )
    return _gemini_text(reply)


def _gemini_sdk_stream(chain: Any) -> Iterator[str]:
    chunks: Iterable[Any] = chain.stream(
        lambda _index, client: client.models.generate_content_stream(
            model=GEMINI_MODEL, contents=QUESTION
        ),
        is_content=lambda chunk: bool(_gemini_text(chunk)),
    )
    return (text for text in map(_gemini_text, chunks) if text)


async def _gemini_sdk_acall(chain: Any) -> str:
    reply = await chain.ainvoke(
        lambda _index, client: client.models.generate_content(model=GEMINI_MODEL, contents=QUESTION)
    )
    return _gemini_text(reply)


async def _gemini_chunks(client: Any) -> AsyncIterator[Any]:
    stream = await client.models.generate_content_stream(model=GEMINI_MODEL, contents=QUESTION)
    async for chunk in stream:
        yield chunk


async def _gemini_sdk_astream(chain: Any) -> AsyncIterator[str]:
    chunks: AsyncIterable[Any] = chain.astream(
        lambda _index, client: _gemini_chunks(client),
        is_content=lambda chunk: bool(_gemini_text(chunk)),
    )
    async for chunk in chunks:
        if text := _gemini_text(chunk):
            yield text


# -- LangChain ---------------------------------------------------------------------------


def _chat_openai(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=OPENAI_MODEL,
        base_url=f"{endpoint.root}/v1",
        api_key="sk-FAKE-openai",  # type: ignore[arg-type]
        timeout=timeout,
        max_retries=max_retries,
    )


def _azure_chat_openai(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from langchain_openai import AzureChatOpenAI

    return AzureChatOpenAI(
        azure_endpoint=endpoint.root,
        azure_deployment=AZURE_DEPLOYMENT,
        api_version=AZURE_API_VERSION,
        api_key="sk-FAKE-azure",  # type: ignore[arg-type]
        timeout=timeout,
        max_retries=max_retries,
    )


def _chat_anthropic(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from langchain_anthropic import ChatAnthropic

    retries = {} if max_retries is None else {"max_retries": max_retries}
    return ChatAnthropic(  # type: ignore[call-arg]
        model_name=CLAUDE,
        base_url=endpoint.root,
        api_key="sk-FAKE-anthropic",
        timeout=timeout,
        stop=None,
        **retries,
    )


def _chat_google(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from langchain_google_genai import ChatGoogleGenerativeAI

    # Its ``max_retries`` counts attempts in all (google-genai's ``attempts``): 1 is no
    # retry. None keeps its default of 6.
    retries = {} if max_retries is None else {"max_retries": max_retries + 1}
    return ChatGoogleGenerativeAI(
        model=GEMINI_MODEL,
        api_key="sk-FAKE-gemini",
        base_url=endpoint.root,
        timeout=timeout,
        **retries,
    )


# -- LlamaIndex --------------------------------------------------------------------------


def _llama_openai(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from llama_index.llms.openai import OpenAI

    retries = {} if max_retries is None else {"max_retries": max_retries}
    return OpenAI(
        model=OPENAI_MODEL,
        api_base=f"{endpoint.root}/v1",
        api_key="sk-FAKE-openai",
        timeout=timeout,
        **retries,
    )


def _llama_anthropic(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from llama_index.llms.anthropic import Anthropic

    retries = {} if max_retries is None else {"max_retries": max_retries}
    return Anthropic(
        model=CLAUDE,
        base_url=endpoint.root,
        api_key="sk-FAKE-anthropic",
        timeout=timeout,
        **retries,
    )


def _llama_google(endpoint: Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from google.genai import types
    from llama_index.llms.google_genai import GoogleGenAI

    # Its ``max_retries`` counts attempts of its own retry loop (0 and 1: one attempt);
    # None keeps its default of 3. ``max_tokens`` and ``context_window`` spare it the
    # model lookup it otherwise makes when built.
    retries = {} if max_retries is None else {"max_retries": max_retries}
    return GoogleGenAI(
        model=GEMINI_MODEL,
        api_key="sk-FAKE-gemini",
        http_options=types.HttpOptions(base_url=endpoint.root, timeout=int(timeout * 1000)),
        max_tokens=64,
        context_window=1_048_576,
        **retries,
    )


ROWS: tuple[Row, ...] = (
    Row(
        "openai-sdk", "OpenAI", "SDK", "openai.OpenAI", "openai",
        _openai_sdk, _core_chain, _openai_sdk_call, _openai_sdk_stream, "openai",
        amember=_async_openai_sdk, acall=_openai_sdk_acall, astream=_openai_sdk_astream,
    ),
    Row(
        "openai-langchain", "OpenAI", "LangChain", "ChatOpenAI", "openai",
        _chat_openai, _langchain_chain, _langchain_call, _langchain_stream, "langchain_openai",
        amember=_chat_openai, acall=_langchain_acall, astream=_langchain_astream,
    ),
    Row(
        "openai-llamaindex", "OpenAI", "LlamaIndex", "llama_index.llms.openai.OpenAI", "openai",
        _llama_openai, _llama_chain, _llama_call, _llama_stream, "llama_index.llms.openai",
        amember=_llama_openai, acall=_llama_acall, astream=_llama_astream,
    ),
    Row(
        "azure-sdk", "Azure OpenAI", "SDK", "openai.AzureOpenAI", "openai",
        _azure_sdk, _core_chain, _openai_sdk_call, _openai_sdk_stream, "openai",
        amember=_async_azure_sdk, acall=_openai_sdk_acall, astream=_openai_sdk_astream,
    ),
    Row(
        "azure-langchain", "Azure OpenAI", "LangChain", "AzureChatOpenAI", "openai",
        _azure_chat_openai, _langchain_chain, _langchain_call, _langchain_stream,
        "langchain_openai", amember=_azure_chat_openai, acall=_langchain_acall, astream=_langchain_astream,
    ),
    Row(
        "azure-llamaindex", "Azure OpenAI", "LlamaIndex", "llama_index.llms.azure_openai.AzureOpenAI",
        "openai", llama_azure, _llama_chain, _llama_call, _llama_stream,
        "llama_index.llms.azure_openai", amember=llama_azure, acall=_llama_acall, astream=_llama_astream,
    ),
    Row(
        "anthropic-sdk", "Anthropic", "SDK", "anthropic.Anthropic", "anthropic",
        _anthropic_sdk, _core_chain, _anthropic_sdk_call, _anthropic_sdk_stream, "anthropic",
        amember=_async_anthropic_sdk, acall=_anthropic_sdk_acall, astream=_anthropic_sdk_astream,
    ),
    Row(
        "anthropic-langchain", "Anthropic", "LangChain", "ChatAnthropic", "anthropic",
        _chat_anthropic, _langchain_chain, _langchain_call, _langchain_stream,
        "langchain_anthropic", amember=_chat_anthropic, acall=_langchain_acall, astream=_langchain_astream,
    ),
    Row(
        "anthropic-llamaindex", "Anthropic", "LlamaIndex", "llama_index.llms.anthropic.Anthropic",
        "anthropic", _llama_anthropic, _llama_chain, _llama_call, _llama_stream,
        "llama_index.llms.anthropic", amember=_llama_anthropic, acall=_llama_acall, astream=_llama_astream,
    ),
    # No async: boto3 has none (aioboto3 is not installed).
    Row(
        "bedrock-sdk", "AWS Bedrock", "SDK", 'boto3.client("bedrock-runtime")', "bedrock",
        bedrock_sdk, _core_chain, bedrock_sdk_call, bedrock_sdk_stream, "boto3",
        amember=None, acall=None, astream=None,
    ),
    Row(
        "bedrock-langchain", "AWS Bedrock", "LangChain", "ChatBedrockConverse", "bedrock",
        chat_bedrock, _langchain_chain, _langchain_call, langchain_text_stream,
        "langchain_aws", amember=chat_bedrock, acall=_langchain_acall,
        astream=langchain_text_astream,
    ),
    # Async without aioboto3: llama-index-llms-bedrock-converse (0.15) then runs the sync
    # boto3 client in a thread (``asyncio.to_thread``; a queue for streams).
    Row(
        "bedrock-llamaindex", "AWS Bedrock", "LlamaIndex",
        "llama_index.llms.bedrock_converse.BedrockConverse", "bedrock", llama_bedrock,
        _llama_chain, _llama_call, _llama_stream, "llama_index.llms.bedrock_converse",
        amember=llama_bedrock, acall=_llama_acall, astream=_llama_astream,
    ),
    Row(
        "gemini-sdk", "Google Gemini", "SDK", "google.genai.Client", "gemini",
        _gemini_sdk, _core_chain, _gemini_sdk_call, _gemini_sdk_stream, "google.genai",
        amember=_async_gemini_sdk, acall=_gemini_sdk_acall, astream=_gemini_sdk_astream,
    ),
    Row(
        "gemini-langchain", "Google Gemini", "LangChain", "ChatGoogleGenerativeAI", "gemini",
        _chat_google, _langchain_chain, _langchain_call, _langchain_stream,
        "langchain_google_genai", amember=_chat_google, acall=_langchain_acall,
        astream=_langchain_astream,
    ),
    Row(
        "gemini-llamaindex", "Google Gemini", "LlamaIndex",
        "llama_index.llms.google_genai.GoogleGenAI", "gemini", _llama_google, _llama_chain,
        _llama_call, _llama_stream, "llama_index.llms.google_genai", amember=_llama_google,
        acall=_llama_acall, astream=_llama_astream,
    ),
    Row(
        "mistral-sdk", "Mistral", "SDK", "mistralai.Mistral", "mistral",
        mistral_sdk, _core_chain, mistral_sdk_call, mistral_sdk_stream, "mistralai",
        amember=mistral_sdk, acall=mistral_sdk_acall, astream=mistral_sdk_astream,
    ),
    Row(
        "mistral-langchain", "Mistral", "LangChain", "ChatMistralAI", "mistral",
        chat_mistral, _langchain_chain, _langchain_call, _langchain_stream,
        "langchain_mistralai", amember=chat_mistral, acall=_langchain_acall,
        astream=_langchain_astream,
    ),
    Row(
        "mistral-llamaindex", "Mistral", "LlamaIndex", "llama_index.llms.mistralai.MistralAI",
        "mistral", llama_mistral, _llama_chain, _llama_call, _llama_stream,
        "llama_index.llms.mistralai", amember=llama_mistral, acall=_llama_acall,
        astream=_llama_astream,
    ),
    # Groq (``surfaces_groq``): its API is OpenAI's at /openai/v1, with its own errors.
    Row(
        "groq-sdk", "Groq", "SDK", "groq.Groq", "groq",
        groq_sdk, _core_chain, groq_sdk_call, groq_sdk_stream, "groq",
        amember=async_groq_sdk, acall=groq_sdk_acall, astream=groq_sdk_astream,
    ),
    Row(
        "groq-langchain", "Groq", "LangChain", "ChatGroq", "groq",
        chat_groq, _langchain_chain, _langchain_call, _langchain_stream, "langchain_groq",
        amember=chat_groq, acall=_langchain_acall, astream=_langchain_astream,
    ),
    Row(
        "groq-llamaindex", "Groq", "LlamaIndex", "llama_index.llms.groq.Groq", "groq",
        llama_groq, _llama_chain, _llama_call, _llama_stream, "llama_index.llms.groq",
        amember=llama_groq, acall=_llama_acall, astream=_llama_astream,
    ),
    # Ollama (``surfaces_ollama``): its native /api/chat, streamed as NDJSON.
    Row(
        "ollama-sdk", "Ollama", "SDK", "ollama.Client", "ollama", ollama_sdk, _core_chain,
        ollama_sdk_call, ollama_sdk_stream, "ollama", amember=async_ollama_sdk,
        acall=ollama_sdk_acall, astream=ollama_sdk_astream,
    ),
    Row(
        "ollama-langchain", "Ollama", "LangChain", "ChatOllama", "ollama", chat_ollama,
        _langchain_chain, _langchain_call, _langchain_stream, "langchain_ollama",
        amember=chat_ollama, acall=_langchain_acall, astream=_langchain_astream,
    ),
    Row(
        "ollama-llamaindex", "Ollama", "LlamaIndex", "llama_index.llms.ollama.Ollama", "ollama",
        llama_ollama, _llama_chain, _llama_call, _llama_stream, "llama_index.llms.ollama",
        amember=llama_ollama, acall=_llama_acall, astream=_llama_astream,
    ),
    # Cohere (``surfaces_cohere``): its v2 Chat API (LlamaIndex's Cohere: v1's).
    Row(
        "cohere-sdk", "Cohere", "SDK", "cohere.ClientV2", "cohere",
        cohere_sdk, _core_chain, cohere_sdk_call, cohere_sdk_stream, "cohere",
        amember=async_cohere_sdk, acall=cohere_sdk_acall, astream=cohere_sdk_astream,
    ),
    Row(
        "cohere-langchain", "Cohere", "LangChain", "ChatCohere", "cohere",
        chat_cohere, cohere_langchain_chain, _langchain_call, _langchain_stream,
        "langchain_cohere", amember=chat_cohere, acall=_langchain_acall,
        astream=_langchain_astream,
    ),
    # No async: its astream_chat iterates the sync client's stream with ``async for``
    # (a TypeError on every call, llama-index-llms-cohere 0.9.0).
    Row(
        "cohere-llamaindex", "Cohere", "LlamaIndex", "llama_index.llms.cohere.Cohere",
        "cohere", llama_cohere, _llama_chain, _llama_call, _llama_stream,
        "llama_index.llms.cohere", amember=None, acall=None, astream=None,
    ),
)  # fmt: skip
