"""Reading LlamaIndex requests and responses for the core's token and cost rules.

Translation only: what counts as reported usage, and how to estimate what is missing,
is `llm_resilience.usage`'s. This module finds the numbers where LlamaIndex
integrations put them:

* OpenAI-shaped: ``response.raw.usage`` (``prompt_tokens``/``completion_tokens``, the
  ``openai`` SDK object or a dict), and the same counts copied into
  ``response.additional_kwargs`` by ``llama-index-llms-openai``;
* Anthropic-shaped: ``response.raw["usage"]`` (``input_tokens``/``output_tokens``) or
  ``response.message.additional_kwargs["usage"]``;
* Gemini-shaped: ``response.raw["usage_metadata"]`` (``llama-index-llms-google-genai``):
  ``prompt_token_count`` (cached part included, ``cached_content_token_count``) in, and
  ``candidates_token_count`` plus ``thoughts_token_count`` out (Google bills the
  thoughts as output; the ``completion_tokens`` it copies into ``additional_kwargs``
  leave them out);
* Bedrock-shaped: Converse's ``usage`` (``llama-index-llms-bedrock-converse``), in
  ``response.raw["usage"]`` of a call and ``raw["metadata"]["usage"]`` of a stream's
  last chunk: ``inputTokens`` (cache reads and writes left out, as Anthropic's),
  ``cacheReadInputTokens``, ``cacheWriteInputTokens`` (split by lifetime in
  ``cacheDetails``) and ``outputTokens`` (the model's thinking included). The counts it
  copies into ``additional_kwargs`` keep the input and cache counts, not the lifetimes.
* Mistral-shaped (``llama-index-llms-mistralai``): OpenAI's counts, in ``raw["usage"]``
  of a call and, for a stream, in the last chunk's ``raw``, the SDK's
  ``CompletionEvent``, whose ``data`` is the chunk (``raw.data.usage``, ``raw.data.model``).
* Cohere-shaped: the v1 Chat API's ``meta.billed_units`` (``llama-index-llms-cohere``),
  in ``response.raw["meta"]`` of a call and ``raw["response"].meta`` of a stream's
  ``stream-end`` chunk: ``input_tokens`` and ``output_tokens``, what Cohere bills, sent
  as whole floats.

Cache and reasoning counts (`reported_details`) come from the raw usage: OpenAI's
``prompt_tokens_details.cached_tokens`` and ``completion_tokens_details.reasoning_tokens``
(both already inside ``prompt_tokens``/``completion_tokens``; the Responses API's
``input_tokens_details``/``output_tokens_details`` alike), Anthropic's
``cache_read_input_tokens``, ``cache_creation_input_tokens`` (split by lifetime in
``cache_creation``) and ``output_tokens_details.thinking_tokens``. Anthropic's
``input_tokens`` leaves its cache reads and writes out, so they are added back: the
core's input count is every input token billed in some form.

Groq (``llama-index-llms-groq``, an ``OpenAILike``) reports a stream's usage, OpenAI-shaped,
in its last chunk's ``raw.x_groq.usage`` without being asked (``stream_options`` adds
OpenAI's usage chunk too; the largest total counts, so never twice); its cached tokens
and reasoning tokens are inside ``prompt_tokens``/``completion_tokens`` as OpenAI's.

Anthropic's server-side compaction bills its summarising step apart from the counts
above, as a ``"compaction"`` entry of ``usage.iterations``: the raw usage
(``raw["usage"]`` of a call and of a stream's ``message_delta`` chunk) goes to the core
(`with_billed_apart`), which adds it.

The serving model is ``raw.model`` when the provider reports it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
)

from llm_resilience.served import SERVED_BY_KEY
from llm_resilience.usage import (
    NO_DETAILS,
    StreamUsage,
    TokenDetails,
    token_count,
    with_billed_apart,
)

__all__ = [
    "StreamTally",
    "llm_name",
    "num_output",
    "plain_report",
    "prompt_pairs",
    "raw_model",
    "reported",
    "reported_details",
    "reported_tokens",
]

_INPUT_KEYS = ("prompt_tokens", "input_tokens")
_OUTPUT_KEYS = ("completion_tokens", "output_tokens")


def prompt_pairs(request: Sequence[ChatMessage] | str) -> list[tuple[str, str]]:
    """``(role, text)`` pairs of chat messages, or one user turn for a completion prompt."""
    if isinstance(request, str):
        return [("user", request)]
    return [(_role(message), message.content or "") for message in request]


def response_text(response: ChatResponse | CompletionResponse) -> str:
    """The answer's text, tool calls included (they are billed as output too)."""
    if isinstance(response, CompletionResponse):
        return response.text or ""
    message = response.message
    parts = [message.content or ""]
    calls = []
    for block in message.blocks:  # a loop, not a comprehension: no call for a plain answer
        if getattr(block, "block_type", None) == "tool_call":
            calls.append(block)
    if calls:
        parts.extend(
            f"{getattr(call, 'tool_name', '')}{_json(getattr(call, 'tool_kwargs', ''))}"
            for call in calls
        )
    else:
        listed = message.additional_kwargs.get("tool_calls")
        if not listed:  # the usual answer: its text alone
            return parts[0]
        parts.extend(_tool_call_text(call) for call in listed)
    return "".join(parts)


def reported_tokens(response: ChatResponse | CompletionResponse) -> tuple[int | None, int | None]:
    """The provider's ``(input, output)`` token counts; None for a count not reported.

    Looks in ``raw.usage``, then ``additional_kwargs`` (flat counts, then its ``usage``),
    then ``message.additional_kwargs["usage"]``; the first place with both counts wins,
    else the first with one.
    """
    reported_in, reported_out, _ = reported(response)
    return reported_in, reported_out


def reported_details(response: ChatResponse | CompletionResponse) -> TokenDetails:
    """The provider's cache and reasoning counts, from the same places as
    `reported_tokens` (the first that has any); None where not reported."""
    return reported(response)[2]


def reported(
    response: ChatResponse | CompletionResponse,
) -> tuple[int | None, int | None, TokenDetails]:
    """`reported_tokens` and `reported_details` of ``response`` at once: every place
    they read is looked up once (a call reads both; each alone probed ~40 places)."""
    if _reports_nothing(response):
        return None, None, NO_DETAILS
    return _probed(response)


#: The keys of a plain OpenAI-shaped usage (Chat Completions'): the two counts and their
#: total, no details (`plain_report`).
_PLAIN_USAGE_KEYS = frozenset({"prompt_tokens", "completion_tokens", "total_tokens"})
#: The keys of a dict ``raw`` that `_probed` reads besides ``usage`` (Bedrock's stream
#: metadata, Gemini's, Cohere's, Groq's).
_OTHER_RAW_KEYS = frozenset({"metadata", "usage_metadata", "meta", "response", "x_groq"})


def plain_report(response: ChatResponse | CompletionResponse) -> tuple[int, int, str | None] | None:
    """`reported`'s counts and `raw_model` of a ``response`` whose only report is a plain
    OpenAI-shaped usage dict in a dict ``raw`` (no other place `_probed` reads holds
    anything, and ``additional_kwargs`` are empty, its message's too), else None.

    Exact: `_probed` then finds no Bedrock, Gemini or Cohere shape, reads these two counts
    from ``raw["usage"]`` first, finds no detail anywhere (``raw["usage"]`` has none, and
    every other place is empty) and nothing billed apart (no ``iterations``): it returns
    the two counts and `NO_DETAILS`, as this does without the ~100 calls; and a dict
    ``raw`` names its model under ``"model"`` alone (`raw_model`). The response's fields
    are read from its ``__dict__`` at once: every attribute read on a pydantic model goes
    through its ``__getattr__`` hook.
    """
    fields = response.__dict__
    raw = fields.get("raw")
    if type(raw) is not dict or not _OTHER_RAW_KEYS.isdisjoint(raw):
        return None
    usage = raw.get("usage")
    if type(usage) is not dict or not _PLAIN_USAGE_KEYS.issuperset(usage):
        return None
    given, made = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if type(given) is not int or type(made) is not int or given < 0 or made < 0:
        return None
    if fields.get("additional_kwargs"):
        return None
    message = fields.get("message")
    if message is not None and message.additional_kwargs:
        return None
    model = raw.get("model")
    return given, made, model if isinstance(model, str) and model else None


def _probed(
    response: ChatResponse | CompletionResponse,
) -> tuple[int | None, int | None, TokenDetails]:
    """`reported` of a ``response`` that has somewhere a count could be."""
    plain = plain_report(response)
    if plain is not None:  # the one OpenAI-shaped report, alone
        return plain[0], plain[1], NO_DETAILS
    raw = response.raw
    raw_usage = _field(raw, "usage")
    bedrock = _bedrock_usage(raw, raw_usage)
    if bedrock is not None:
        return (*_bedrock_counts(bedrock), _bedrock_details(bedrock))
    gemini = _field(raw, "usage_metadata")
    gemini_counts = _gemini_counts(gemini)
    places = _usage_places(response, raw, raw_usage)
    return (
        *_tokens(response, raw_usage, gemini_counts, places),
        _details_of(raw_usage, gemini, gemini_counts, places),
    )


def _usage_places(
    response: ChatResponse | CompletionResponse, raw: Any, raw_usage: Any
) -> list[Any]:
    """Where a usage may sit, in the order it is looked for: ``raw.usage``, Groq's, the
    ``additional_kwargs``' ``usage``, the message's, a Mistral event's."""
    places: list[Any] = [
        raw_usage,
        _field(_field(raw, "x_groq"), "usage"),
        _field(response.additional_kwargs, "usage"),
    ]
    if isinstance(response, ChatResponse):
        places.append(_field(response.message.additional_kwargs, "usage"))
    places.append(_field(_event_data(raw), "usage"))
    return places


def _tokens(
    response: ChatResponse | CompletionResponse,
    raw_usage: Any,
    gemini: tuple[int | None, int | None] | None,
    places: list[Any],
) -> tuple[int | None, int | None]:
    cohere = _cohere_counts(response)
    if cohere is not None:
        return cohere
    if gemini is not None and None not in gemini:
        return gemini
    # The flat counts of ``additional_kwargs`` come before its ``usage``.
    ordered = [*places[:2], response.additional_kwargs, *places[2:]]
    partial: tuple[int | None, int | None] | None = gemini
    found: tuple[int | None, int | None] = (None, None)
    for place in ordered:
        if place is None:  # nowhere to look (`_counts` gives None)
            continue
        counts = _counts(place)
        if counts is None:
            continue
        if None not in counts:
            found = counts
            break
        partial = partial or counts
    else:
        found = partial or found
    # Anthropic bills a compaction step in ``raw["usage"].iterations``, apart from the
    # counts above: the core adds it.
    billed_in, billed_out, _ = with_billed_apart(*found, None, raw_usage)
    return billed_in, billed_out


def _details_of(
    raw_usage: Any,
    gemini: Any,
    gemini_counts: tuple[int | None, int | None] | None,
    places: list[Any],
) -> TokenDetails:
    if gemini_counts is not None:
        return TokenDetails(
            cache_read_tokens=token_count(_field(gemini, "cached_content_token_count")),
            reasoning_tokens=token_count(_field(gemini, "thoughts_token_count")),
        )
    found = _NONE
    for place in places:
        if place is None:  # nowhere to look (`_details` gives none)
            continue
        details = _details(place)
        if details is not _NONE and details != _NONE:  # the first place with any count
            found = details
            break
    _, _, billed = with_billed_apart(0, 0, found, raw_usage)
    return billed if billed is not None else _NONE


def _reports_nothing(response: ChatResponse | CompletionResponse) -> bool:
    """Whether ``response`` has nowhere a count could be: no ``raw`` and no
    ``additional_kwargs`` (its message's neither), as a model that reports no usage
    answers; every place `reported_tokens` looks is then empty."""
    if response.raw is not None or response.additional_kwargs:
        return False
    return not isinstance(response, ChatResponse) or not response.message.additional_kwargs


def raw_model(response: ChatResponse | CompletionResponse) -> str | None:
    """The model the provider says served (``raw.model``), if it says so."""
    raw = response.raw
    if raw is None:  # no raw answer (a mock, a framework's own): nothing names a model
        return None
    model = _field(raw, "model") or _field(_event_data(raw), "model")
    return model if isinstance(model, str) and model else None


def _event_data(raw: Any) -> Any:
    """The chunk inside a mistralai ``CompletionEvent`` (a Mistral stream chunk's raw)."""
    if raw is None or type(raw) is dict or isinstance(raw, Mapping):
        return None
    return getattr(raw, "data", None)


def llm_name(llm: object) -> object:
    """The name a LlamaIndex LLM gives itself (``metadata.model_name``), if it has one."""
    return getattr(getattr(llm, "metadata", None), "model_name", None)


def num_output(llm: object) -> object:
    """The output LlamaIndex reserves for ``llm`` (``metadata.num_output``; -1: unknown)."""
    return getattr(getattr(llm, "metadata", None), "num_output", None)


class StreamTally:
    """What a stream reported, chunk by chunk: text deltas, usage, the serving model.

    A LlamaIndex chunk's usage is what its provider put in ``raw`` (a running total, or
    one piece of the usage); the core's `StreamUsage` adds
    them up.
    """

    __slots__ = ("_deltas", "_member", "_usage", "model")

    def __init__(self) -> None:
        self._deltas: list[str] = []
        self._usage = StreamUsage()
        # The fallback member the chunks come from (``fallback_served_by``), if marked.
        self._member: object = None
        #: The last model a chunk's ``raw`` named, or None.
        self.model: str | None = None

    @property
    def input_tokens(self) -> int | None:
        """The stream's input count so far (`StreamUsage`), or None."""
        return self._usage.input_tokens

    @property
    def output_tokens(self) -> int | None:
        """The stream's output count so far (`StreamUsage`), or None."""
        return self._usage.output_tokens

    @property
    def details(self) -> TokenDetails:
        """The stream's cache and reasoning counts so far (`StreamUsage`)."""
        return self._usage.details

    @property
    def started(self) -> bool:
        """Whether any chunk was added."""
        return bool(self._deltas)

    @property
    def deltas(self) -> tuple[str, ...]:
        """Each added chunk's text delta, in order (``""`` for a chunk without one)."""
        return tuple(self._deltas)

    def add(self, chunk: ChatResponse | CompletionResponse) -> None:
        self._deltas.append(chunk.delta or "")
        # Most chunks have nowhere a count could be: they add nothing (`reported`).
        if not _reports_nothing(chunk):
            self._usage.add(*_probed(chunk))
        member = chunk.additional_kwargs.get(SERVED_BY_KEY)
        if member != self._member:
            # A fallback chain restarted the stream on another member: the name the
            # failed member gave is not the serving one's.
            self._member, self.model = member, None
        if chunk.raw is not None:  # a chunk without ``raw`` names no model (`raw_model`)
            self.model = raw_model(chunk) or self.model

    def text(self, last: ChatResponse | CompletionResponse) -> str:
        """The streamed answer: the last chunk's accumulated text, or the joined deltas."""
        joined = "".join(self._deltas)
        final = response_text(last)
        return final if len(final) >= len(joined) else joined


def _role(message: ChatMessage) -> str:
    role = message.role
    if type(role) is MessageRole:  # the usual role: its text, without the enum's property
        return role._value_  # type: ignore[no-any-return]
    return str(getattr(role, "value", role))


def _field(container: Any, key: str) -> Any:
    if container is None:
        return None
    if type(container) is dict:  # the usual raw answer: no ABC check (~0.2 µs each)
        return container.get(key)
    if isinstance(container, Mapping):
        return container.get(key)
    return getattr(container, key, None)


def _counts(place: Any) -> tuple[int | None, int | None] | None:
    if place is None:
        return None
    # The first key of each that holds a count (loops: no generator frames per place).
    found_in = found_out = None
    for key in _INPUT_KEYS:
        found_in = token_count(_field(place, key))
        if found_in is not None:
            break
    for key in _OUTPUT_KEYS:
        found_out = token_count(_field(place, key))
        if found_out is not None:
            break
    if found_in is None and found_out is None:
        return None
    if found_in is not None:
        # Anthropic counts its cache reads and writes apart from ``input_tokens``.
        details = _anthropic_details(place)
        if details is not None:
            found_in += (details.cache_read_tokens or 0) + (details.cache_write_tokens or 0)
    return found_in, found_out


_NONE = NO_DETAILS


def _gemini_counts(place: Any) -> tuple[int | None, int | None] | None:
    """Gemini's ``(input, output)``: the prompt, and the candidates plus the thoughts."""
    if place is None:
        return None
    prompt = token_count(_field(place, "prompt_token_count"))
    candidates = token_count(_field(place, "candidates_token_count"))
    thoughts = token_count(_field(place, "thoughts_token_count"))
    if prompt is None and candidates is None:
        return None
    output = (
        None if candidates is None and thoughts is None else (candidates or 0) + (thoughts or 0)
    )
    return prompt, output


def _cohere_counts(response: ChatResponse | CompletionResponse) -> tuple[int, int] | None:
    """Cohere v1's billed ``(input, output)``: ``meta.billed_units`` of a call's raw
    answer or of the ``response`` a stream's ``stream-end`` carries; None otherwise."""
    raw = response.raw
    for meta in (_field(raw, "meta"), _field(_field(raw, "response"), "meta")):
        if meta is None:
            continue
        billed = _field(meta, "billed_units")
        # The SDK declares them floats: whole numbers only.
        found_in, found_out = (
            token_count(_field(billed, key), whole_float=True)
            for key in ("input_tokens", "output_tokens")
        )
        if found_in is not None and found_out is not None:
            return found_in, found_out
    return None


def _bedrock_usage(raw: Any, raw_usage: Any) -> Any:
    """Bedrock Converse's ``usage`` of a call (``raw["usage"]``, given as ``raw_usage``) or
    a stream's ``metadata`` event (``raw["metadata"]["usage"]``), or None when not so
    shaped."""
    for usage in (raw_usage, _field(_field(raw, "metadata"), "usage")):
        # A plain dict or None first: no ABC check for either.
        if usage is None or (type(usage) is not dict and not isinstance(usage, Mapping)):
            continue
        counts = (token_count(usage.get("inputTokens")), token_count(usage.get("outputTokens")))
        if counts != (None, None):
            return usage
    return None


def _bedrock_counts(usage: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """Bedrock's ``(input, output)``: ``inputTokens`` with the cache reads and writes
    added back, and ``outputTokens``."""
    found_in = token_count(usage.get("inputTokens"))
    if found_in is not None:
        details = _bedrock_details(usage)
        found_in += (details.cache_read_tokens or 0) + (details.cache_write_tokens or 0)
    return found_in, token_count(usage.get("outputTokens"))


def _bedrock_details(usage: Mapping[str, Any]) -> TokenDetails:
    written = token_count(usage.get("cacheWriteInputTokens"))
    lifetimes = usage.get("cacheDetails")
    one_hour: int | None = None
    if isinstance(lifetimes, list) and lifetimes:
        counts = [
            (item.get("ttl"), token_count(item.get("inputTokens")) or 0)
            for item in lifetimes
            if isinstance(item, Mapping)
        ]
        by_lifetime = sum(count for _ttl, count in counts)
        if by_lifetime > 0:
            written = by_lifetime
            one_hour = sum(count for ttl, count in counts if ttl == "1h")
    return TokenDetails(
        cache_read_tokens=token_count(usage.get("cacheReadInputTokens")),
        cache_write_tokens=written,
        cache_write_1h_tokens=one_hour,
    )


def _details(place: Any) -> TokenDetails:
    if place is None:
        return _NONE
    anthropic = _anthropic_details(place)
    if anthropic is not None:
        return anthropic
    # OpenAI: Chat Completions, then the Responses API's names.
    into = _field(place, "prompt_tokens_details") or _field(place, "input_tokens_details")
    out = _field(place, "completion_tokens_details") or _field(place, "output_tokens_details")
    if into is None and out is None:
        return _NONE
    return TokenDetails(
        cache_read_tokens=token_count(_field(into, "cached_tokens")),
        cache_write_tokens=token_count(_field(into, "cache_write_tokens")),
        reasoning_tokens=token_count(_field(out, "reasoning_tokens")),
    )


def _anthropic_details(place: Any) -> TokenDetails | None:
    """Anthropic's cache and thinking counts, or None when ``place`` is not shaped so."""
    read = token_count(_field(place, "cache_read_input_tokens"))
    created = token_count(_field(place, "cache_creation_input_tokens"))
    lifetimes = _field(place, "cache_creation")
    if read is None and created is None and lifetimes is None:
        return None
    five_minutes = token_count(_field(lifetimes, "ephemeral_5m_input_tokens"))
    one_hour = token_count(_field(lifetimes, "ephemeral_1h_input_tokens"))
    by_lifetime = (five_minutes or 0) + (one_hour or 0)
    return TokenDetails(
        cache_read_tokens=read,
        cache_write_tokens=by_lifetime if by_lifetime > 0 else created,
        cache_write_1h_tokens=one_hour if by_lifetime > 0 else None,
        reasoning_tokens=token_count(
            _field(_field(place, "output_tokens_details"), "thinking_tokens")
        ),
    )


def _json(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def _tool_call_text(call: Any) -> str:
    if isinstance(call, Mapping):
        return _json(dict(call))
    function = getattr(call, "function", None)
    if function is not None:
        return f"{getattr(function, 'name', '') or ''}{getattr(function, 'arguments', '') or ''}"
    return str(call)
