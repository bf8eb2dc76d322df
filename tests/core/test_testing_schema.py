"""The JSON-schema sampler every fake answers tool calls and structured output with
(``llm_resilience.testing.schema``), and the OpenAI wire's use of it."""

from __future__ import annotations

from typing import Any

import pytest

from llm_resilience.testing._wire import WIRES
from llm_resilience.testing.schema import sample_instance

_CITY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "note": {"type": "string"},
    },
    "required": ["city", "days"],
}


def test_the_instance_validates_against_a_tricky_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema: dict[str, Any] = {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string", "minLength": 6, "maxLength": 8},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
                "required": ["label"],
            },
        },
        "type": "object",
        "properties": {
            "root": {"$ref": "#/$defs/Node"},
            "when": {"type": "string", "format": "date-time"},
            "count": {"type": "integer", "exclusiveMinimum": 3, "maximum": 9},
            "ratio": {"type": ["number", "null"], "minimum": 0.5},
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}]},
            "choice": {"anyOf": [{"type": "null"}, {"const": "yes"}]},
            "mixed": {"allOf": [{"$ref": "#/$defs/Node"}, {"required": ["children"]}]},
            "many": {"type": "array", "items": {"type": "integer"}, "minItems": 3},
            "none": {"type": "array", "maxItems": 0},
            "free": {},
        },
        "required": [
            "root",
            "when",
            "count",
            "ratio",
            "pair",
            "choice",
            "mixed",
            "many",
            "none",
            "free",
        ],
    }
    value = sample_instance(schema)
    jsonschema.validate(value, schema)
    assert value["count"] == 4
    assert value["ratio"] == 0.5
    assert value["choice"] == "yes"
    assert len(value["many"]) == 3
    assert value["none"] == []


def test_without_a_prompt_only_required_properties_get_placeholders() -> None:
    assert sample_instance(_CITY) == {"city": "test", "days": 1}


def test_numbers_and_proper_names_of_the_prompt_fill_the_instance_in_order() -> None:
    prompt = "What is the weather in San Francisco for the next 3 days?"
    assert sample_instance(_CITY, prompt=prompt) == {"city": "San Francisco", "days": 3}


def test_quoted_text_comes_before_proper_names_and_numbers_are_clamped() -> None:
    prompt = "Book 'Le Petit Bistro' in Paris for 12 days."
    assert sample_instance(_CITY, prompt=prompt) == {"city": "Le Petit Bistro", "days": 7}


def test_a_schema_that_is_not_a_mapping_gives_an_empty_object_or_none() -> None:
    assert sample_instance(None) == {}
    assert sample_instance(False) is None


def test_only_openai_json_schema_requests_get_structured_content() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    json_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    openai, anthropic = WIRES["openai"], WIRES["anthropic"]
    assert openai.structured_content({"response_format": json_schema}) == '{"a": "test"}'
    assert openai.structured_content({"response_format": {"type": "text"}}) is None
    assert openai.structured_content({}) is None
    assert anthropic.structured_content({"response_format": json_schema}) is None
