"""``with_structured_output`` on a real ``ChatOpenAI`` against the fault-injecting server.

A request with ``response_format={"type": "json_schema", ...}`` (LangChain's default method)
gets JSON content that satisfies the schema: required properties, one item per array, the
first enum value, numbers inside their bounds. So structured output runs offline, through
the fallback chain too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import Enum
from typing import Any, Literal

import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from langchain_llm_resilience import FallbackChatModel
from llm_resilience.testing import Fault, FaultInjectingServer


class Colour(Enum):
    RED = "red"
    GREEN = "green"


class City(BaseModel):
    name: str
    population: int = Field(ge=1)
    area_km2: float
    capital: bool


class Answer(BaseModel):
    """A structured answer with the shapes schemas usually have."""

    city: City
    neighbours: list[City]
    tags: list[str] = Field(min_length=2)
    colour: Colour
    kind: Literal["fact", "opinion"]
    note: str | None
    score: float = Field(gt=0, le=10)


@pytest.fixture
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer(reply="plain text, not JSON", name="structured") as running:
        yield running


def _chat(server: FaultInjectingServer, model: str = "gpt-4o-mini") -> ChatOpenAI:
    return ChatOpenAI(
        model=model,
        base_url=server.openai_base_url,
        api_key="sk-FAKE-structured",  # type: ignore[arg-type]
        max_retries=0,
        timeout=10,
    )


def _check(answer: Any) -> None:
    assert isinstance(answer, Answer)
    assert answer.city.population >= 1
    assert len(answer.neighbours) == 1
    assert len(answer.tags) == 2
    assert answer.colour is Colour.RED
    assert answer.kind == "fact"
    assert 0 < answer.score <= 10


def test_invoke_parses_a_pydantic_schema(server: FaultInjectingServer) -> None:
    structured = _chat(server).with_structured_output(Answer)
    _check(structured.invoke("Tell me about Paris."))
    (request,) = server.requests
    assert request.provider == "openai"
    assert not request.tool_call


async def test_ainvoke_parses_a_pydantic_schema(server: FaultInjectingServer) -> None:
    structured = _chat(server).with_structured_output(Answer)
    _check(await structured.ainvoke("Tell me about Paris."))


# langchain-openai serializes the parsed object into a field typed None; not ours to fix.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_stream_yields_the_parsed_object(server: FaultInjectingServer) -> None:
    structured = _chat(server).with_structured_output(Answer)
    chunks = list(structured.stream("Tell me about Paris."))
    assert chunks
    _check(chunks[-1])


def test_a_json_schema_dict_gets_a_dict_with_the_required_keys(
    server: FaultInjectingServer,
) -> None:
    schema = {
        "title": "weather",
        "description": "A weather report.",
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "celsius": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["city", "celsius", "tags"],
        "additionalProperties": False,
    }
    result = _chat(server).with_structured_output(schema).invoke("How warm is it?")
    assert result == {"city": "test", "celsius": 0, "tags": ["test"]}


def test_include_raw_reports_no_parsing_error(server: FaultInjectingServer) -> None:
    structured = _chat(server).with_structured_output(Answer, include_raw=True)
    result: Any = structured.invoke("Tell me about Paris.")
    assert result["parsing_error"] is None
    _check(result["parsed"])
    assert json.loads(result["raw"].content) == result["parsed"].model_dump(mode="json")


def test_a_request_without_response_format_still_gets_the_reply(
    server: FaultInjectingServer,
) -> None:
    assert _chat(server).invoke("Hello").content == "plain text, not JSON"


def test_structured_output_through_the_fallback_chain_after_a_429() -> None:
    with (
        FaultInjectingServer(name="primary") as primary,
        FaultInjectingServer(name="secondary") as secondary,
    ):
        primary.script(Fault.status(429))
        chain = FallbackChatModel(
            models=[_chat(primary), _chat(secondary, "gpt-4.1-mini")], per_client_timeout=10
        )
        _check(chain.with_structured_output(Answer).invoke("Tell me about Paris."))
        assert [r.fault.kind for r in primary.requests] == ["status"]
        assert len(secondary.requests) == 1
