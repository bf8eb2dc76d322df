"""The AWS Bedrock rows of the provider matrix: ``boto3``'s ``bedrock-runtime`` client on
the core ``FallbackChain``, ``langchain-aws``'s ``ChatBedrockConverse`` and LlamaIndex's
``BedrockConverse``, each calling Converse and streaming ConverseStream (a binary AWS event
stream) from the fault server.

Each builder takes the member's endpoint (anything with a ``root`` URL), its timeout and
``max_retries`` (None: the package's own default), as ``provider_surfaces.Row.member``
does. The question and the model id are ``provider_surfaces``'s, which imports this module
for its rows, so they are read from it at call time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, Protocol


class _Endpoint(Protocol):
    @property
    def root(self) -> str: ...


#: Fake AWS credentials: botocore signs every request, so it needs some.
AWS_KEY_ID = "sk-FAKE-aws-access-key-id"
AWS_SECRET = "sk-FAKE-aws-secret-access-key"


def _question() -> str:
    from provider_surfaces import QUESTION

    return QUESTION


def _model() -> str:
    from provider_surfaces import BEDROCK_MODEL

    return BEDROCK_MODEL


def _boto3_client(endpoint: _Endpoint, *, timeout: float, retries: dict[str, Any]) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "bedrock-runtime",
        endpoint_url=endpoint.root,
        region_name="us-east-1",
        aws_access_key_id=AWS_KEY_ID,
        aws_secret_access_key=AWS_SECRET,
        config=Config(retries=retries, connect_timeout=timeout, read_timeout=timeout),
    )


# -- boto3 on the core FallbackChain ----------------------------------------------------


def bedrock_sdk(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    # botocore counts attempts: ``total_max_attempts`` is the first request plus the
    # retries (its ``max_attempts`` counts retries only). None keeps its default mode.
    retries = {} if max_retries is None else {"total_max_attempts": max_retries + 1}
    return _boto3_client(endpoint, timeout=timeout, retries={"mode": "standard", **retries})


def _messages() -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"text": _question()}]}]


def _bedrock_events(client: Any) -> Any:
    # botocore's EventStream: each message decoded to ``{event-type: payload}``; an
    # exception message raises ``EventStreamError`` there.
    return client.converse_stream(modelId=_model(), messages=_messages())["stream"]


def _bedrock_text(event: Any) -> str:
    delta = event.get("contentBlockDelta") if isinstance(event, dict) else None
    return str(delta["delta"].get("text") or "") if isinstance(delta, dict) else ""


def bedrock_sdk_call(chain: Any) -> str:
    reply = chain.invoke(
        lambda _index, client: client.converse(modelId=_model(), messages=_messages())
    )
    return "".join(block.get("text", "") for block in reply["output"]["message"]["content"])


def bedrock_sdk_stream(chain: Any) -> Iterator[str]:
    events: Iterable[Any] = chain.stream(
        lambda _index, client: _bedrock_events(client),
        is_content=lambda event: bool(_bedrock_text(event)),
    )
    return (text for text in map(_bedrock_text, events) if text)


# -- LangChain: ChatBedrockConverse -----------------------------------------------------


def chat_bedrock(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from langchain_aws import ChatBedrockConverse

    # Given a boto3 client, ChatBedrockConverse calls through it as built: botocore's
    # ``max_attempts`` counts retries. None keeps botocore's default (``standard``, 3
    # attempts in all). Its async methods run the sync client in an executor.
    retries = {} if max_retries is None else {"max_attempts": max_retries}
    client = _boto3_client(endpoint, timeout=timeout, retries={"mode": "standard", **retries})
    return ChatBedrockConverse(model=_model(), client=client, region_name="us-east-1")


# ChatBedrockConverse streams its text as content blocks (``[{"type": "text", ...}]``);
# ``.text`` joins them.
def langchain_text_stream(chain: Any) -> Iterator[str]:
    return (str(chunk.text) for chunk in chain.stream(_question()) if chunk.text)


async def langchain_text_astream(chain: Any) -> AsyncIterator[str]:
    async for chunk in chain.astream(_question()):
        if chunk.text:
            yield str(chunk.text)


# -- LlamaIndex: BedrockConverse --------------------------------------------------------


def llama_bedrock(endpoint: _Endpoint, *, timeout: float, max_retries: int | None = 0) -> Any:
    from botocore.config import Config
    from llama_index.llms.bedrock_converse import BedrockConverse

    # BedrockConverse retries twice over: its ``max_retries`` (default 10, at least 1) is
    # the attempts of its own tenacity loop (on throttling, internal-server, unavailable
    # and model-timeout errors, 4 to 10 s apart), and it also builds its client with
    # ``Config(retries={"max_attempts": max_retries})``, botocore's retries. One request
    # takes ``max_retries=1`` and a ``botocore_config`` of one attempt. None keeps its
    # defaults. Without aioboto3 its async methods run the sync client in a thread.
    if max_retries is None:
        retries: dict[str, Any] = {"timeout": timeout}
    else:
        config = Config(
            retries={"total_max_attempts": 1}, connect_timeout=timeout, read_timeout=timeout
        )
        retries = {"max_retries": max_retries + 1, "botocore_config": config}
    return BedrockConverse(
        model=_model(),
        endpoint_url=endpoint.root,
        aws_access_key_id=AWS_KEY_ID,
        aws_secret_access_key=AWS_SECRET,
        region_name="us-east-1",
        **retries,
    )
