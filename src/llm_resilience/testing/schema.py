"""A small value valid for a JSON schema: what the fakes answer a tool call or a
structured-output request with.

Examples:
    >>> from llm_resilience.testing.schema import sample_instance
    >>> schema = {
    ...     "type": "object",
    ...     "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    ...     "required": ["city", "days"],
    ... }
    >>> sample_instance(schema)
    {'city': 'test', 'days': 0}
    >>> sample_instance(schema, prompt="The weather in San Francisco for 3 days?")
    {'city': 'San Francisco', 'days': 3}

Both the fake server (``FaultInjectingServer``) and the adapters' fake models
(LangChain's ``ScriptedChatModel``, LlamaIndex's ``FakeFunctionCallingLLM``) build their
tool arguments and structured answers here, so one schema gets one answer everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["sample_instance"]

#: A string with no format, no prompt text left and no length bound.
SAMPLE_TEXT = "test"
#: The sample for each string ``format`` a schema may name.
STRING_FORMATS: Mapping[str, str] = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00",
    "email": "test@example.com",
    "uri": "https://example.com",
    "url": "https://example.com",
    "uuid": "00000000-0000-4000-8000-000000000000",
}
# Deep enough for any real schema; stops a recursive one that requires itself.
_MAX_DEPTH = 16
# Straight and typographic quotes, written as escapes so the source stays ASCII-clear.
_QUOTED = re.compile("(?<!\\w)[\"'\u201c\u2018]([^\"'\u201d\u2019]+)[\"'\u201d\u2019](?!\\w)")
_BRACKETS_AND_QUOTES = "()[]{}\"'\u201c\u201d\u2018\u2019"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def sample_instance(schema: object, *, prompt: str = "") -> Any:
    """A small value that satisfies JSON ``schema``, filled from ``prompt`` where it can.

    The first choice of every alternative (``enum``, ``anyOf``/``oneOf``: the first that
    is not ``null``), each required property of an object (and only those), at least one
    item per array (``minItems``, ``maxItems`` and ``prefixItems`` honoured), local
    ``$ref`` resolved, ``allOf`` merged. Numbers are the prompt's numbers in order (0
    once none is left), moved into the schema's bounds; strings the prompt's quoted text,
    then its proper names ("San Francisco"), in order, then ``"test"`` (or a sample of
    the string's ``format``), cut or padded to its length bounds; booleans ``True``.
    A schema that is not a mapping gives ``{}`` (``False`` gives ``None``). Never raises.
    """
    return _Sampler(prompt, schema).value(schema, 0)


class _Sampler:
    """Fills one schema from one prompt: each number and string of it used once."""

    def __init__(self, prompt: str, root: object) -> None:
        self._root: Mapping[str, Any] = root if isinstance(root, Mapping) else {}
        self._numbers = [float(n) for n in _NUMBER.findall(prompt)]
        self._strings: list[str] = [*_QUOTED.findall(prompt), *_proper_names(prompt)]

    def value(self, schema: object, depth: int) -> Any:
        if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
            return None if isinstance(schema, bool) and not schema else {}
        if "$ref" in schema:
            target = self._resolve(str(schema["$ref"]))
            siblings = {k: v for k, v in schema.items() if k != "$ref"}
            return self.value({**target, **siblings} if siblings else target, depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        for keyword in ("anyOf", "oneOf"):
            options = schema.get(keyword)
            if isinstance(options, list) and options:
                usable = [
                    o for o in options if not (isinstance(o, dict) and o.get("type") == "null")
                ]
                return self.value((usable or options)[0], depth + 1)
        if isinstance(schema.get("allOf"), list):
            return self.value(self._merged(schema), depth + 1)
        kind = _kind(schema)
        if kind == "object":
            properties = schema.get("properties") or {}
            return {
                name: self.value(properties.get(name, {}), depth + 1)
                for name in schema.get("required") or []
                if isinstance(name, str)
            }
        if kind == "array":
            return self._array(schema, depth)
        if kind in ("integer", "number"):
            return self._number(schema, integer=kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return self._string(schema)

    def _merged(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if isinstance(part, dict) and "$ref" in part:
                part = self._resolve(str(part["$ref"]))
            if isinstance(part, dict):
                merged.setdefault("properties", {}).update(part.get("properties") or {})
                merged["required"] = [*merged.get("required", []), *part.get("required", [])]
                rest = {k: v for k, v in part.items() if k not in ("properties", "required")}
                merged.update(rest)
        return merged

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        items: list[Any] = []
        if isinstance(prefix, list):
            items = [self.value(item, depth + 1) for item in prefix]
        wanted = max(1, int(schema.get("minItems", 1)))
        if isinstance(schema.get("maxItems"), int):
            wanted = min(wanted, schema["maxItems"])
        while len(items) < wanted:
            items.append(self.value(schema.get("items", {}), depth + 1))
        return items

    def _number(self, schema: Mapping[str, Any], *, integer: bool) -> int | float:
        """The prompt's next number (else 0), moved into the bounds the schema sets."""
        value: float = self._numbers.pop(0) if self._numbers else 0
        if isinstance(schema.get("minimum"), int | float):
            value = max(value, schema["minimum"])
        if isinstance(schema.get("exclusiveMinimum"), int | float):
            value = max(value, schema["exclusiveMinimum"] + 1)
        if isinstance(schema.get("maximum"), int | float):
            value = min(value, schema["maximum"])
        if isinstance(schema.get("exclusiveMaximum"), int | float):
            value = min(value, schema["exclusiveMaximum"] - 1)
        if integer or float(value).is_integer():
            return int(value)
        return value

    def _string(self, schema: Mapping[str, Any]) -> str:
        known = STRING_FORMATS.get(str(schema.get("format")))
        if known is not None:
            text = known
        elif self._strings:
            text = self._strings.pop(0)
        else:
            text = SAMPLE_TEXT
        minimum, maximum = schema.get("minLength"), schema.get("maxLength")
        if isinstance(minimum, int) and len(text) < minimum:
            text += "x" * (minimum - len(text))
        if isinstance(maximum, int) and len(text) > maximum:
            text = text[:maximum]
        return text

    def _resolve(self, reference: str) -> dict[str, Any]:
        """The schema a local ``$ref`` (``#/$defs/Name``, ``#/definitions/Name``) points to."""
        if not reference.startswith("#"):
            return {}
        node: object = self._root
        for part in reference[1:].split("/"):
            if not part:
                continue
            key = part.replace("~1", "/").replace("~0", "~")
            node = node.get(key) if isinstance(node, Mapping) else None
        return dict(node) if isinstance(node, Mapping) else {}


def _is_null(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "null"


def _kind(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        if "properties" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        return "string"
    return str(kind)


def _proper_names(text: str) -> list[str]:
    """Runs of capitalised words that do not start a sentence ("San Francisco, CA")."""
    names: list[str] = []
    run: list[str] = []
    sentence_start = True
    for raw in text.split():
        word = raw.strip(_BRACKETS_AND_QUOTES).rstrip(".?!:;")
        if run and raw.startswith(("(", "[", "{")):
            names.append(" ".join(run).rstrip(","))
            run = []
        if word[:1].isupper() and not sentence_start:
            run.append(word)
            if raw.endswith((".", "?", "!", ":", ";")):
                names.append(" ".join(run).rstrip(","))
                run = []
        elif run:
            names.append(" ".join(run).rstrip(","))
            run = []
        sentence_start = raw.endswith((".", "?", "!"))
    if run:
        names.append(" ".join(run).rstrip(","))
    return names
