"""The table of wire formats the fake server speaks: a provider's name to its ``Wire``.

Each provider's format lives in its own module (``_wire_openai``, ``_wire_anthropic``,
``_wire_gemini``, ``_wire_bedrock``, ``_wire_mistral``, ``_wire_groq``, ``_wire_ollama``,
``_wire_cohere``), over the shared parts in ``_wire_base``. The server finds the wire
of a request by its path (``wire_for_path``) and asks it for every body, stream and
error; a new provider is one module and one entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from llm_resilience.testing._wire_anthropic import ANTHROPIC
from llm_resilience.testing._wire_base import Provider, Route, Wire
from llm_resilience.testing._wire_bedrock import BEDROCK
from llm_resilience.testing._wire_cohere import COHERE
from llm_resilience.testing._wire_gemini import GEMINI
from llm_resilience.testing._wire_groq import GROQ
from llm_resilience.testing._wire_mistral import MISTRAL
from llm_resilience.testing._wire_ollama import OLLAMA
from llm_resilience.testing._wire_openai import OPENAI

__all__ = ["WIRES", "wire_for_path"]

#: Every wire format by provider name, in the order a request's path is matched: Mistral's
#: path and Groq's end like OpenAI's, so both come before it.
WIRES: Mapping[Provider, Wire] = MappingProxyType(
    {
        wire.name: wire
        for wire in (MISTRAL, GROQ, OPENAI, ANTHROPIC, BEDROCK, OLLAMA, COHERE, GEMINI)
    }
)


def wire_for_path(path: str) -> tuple[Wire, Route] | None:
    """The wire serving ``path`` and what the path says, or None for an unknown path."""
    for wire in WIRES.values():
        route = wire.route(path)
        if route is not None:
            return wire, route
    return None
