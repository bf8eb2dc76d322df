"""``FallbackLLM``: a LlamaIndex ``FunctionCallingLLM`` over [`llm_resilience.FallbackChain`][].

The adapter only translates. Which LLM is tried, what counts as transient, timeouts,
the circuit breaker, the log lines and stream restarts are the core engine's
(`llm_resilience.fallback`); this module turns LlamaIndex calls into engine
attempts and engine results back into LlamaIndex responses.

Three translation rules are worth knowing:

* **Which LLM served.** Every response and streamed chunk is a shallow copy of the
  member's, with ``additional_kwargs["fallback_served_by"]`` set to the path of indexes
  that served it (``[1]``: ``llms[1]``; ``[1, 0]``: ``llms[1].llms[0]`` when a member is
  itself a ``FallbackLLM``). ``get_tool_calls_from_response`` and
  ``_validate_chat_with_tools_response`` are dispatched along that path, so the member
  that produced the tool calls parses them. A response without the key (built by hand,
  or the empty placeholder an agent uses for an empty stream) is offered to each member
  in turn and the first non-empty parse wins. The key sits on the response, never on
  ``response.message``, so it is not sent back to a provider with the chat history.
* **Tools are prepared per member.** ``chat_with_tools`` and its async and streaming
  siblings hand each attempt's member the original tools and messages, and the member
  builds its own request with its own ``_prepare_chat_with_tools`` (OpenAI and Anthropic
  tool schemas differ). Each member gets its own copy of the chat history
  (`llama_index.resilience._tool_request`).
* **One event pair per call.** The wrapper's public methods carry LlamaIndex's
  ``llm_chat_callback``/``llm_completion_callback`` and the dispatcher's span, so one user
  call emits one ``CBEventType.LLM`` start/end pair and one ``LLMChatStartEvent`` /
  ``LLMChatEndEvent`` (or completion) pair. Members are called *below* their own
  decorators, their ``rate_limiter`` still applied
  (`llama_index.resilience._delegate.undecorated_call`, shared by every layer).
"""

from __future__ import annotations

import inspect
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from datetime import timedelta
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar, cast

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    TextBlock,
)
from llama_index.core.bridge.pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
)
from llama_index.core.instrumentation import get_dispatcher  # type: ignore[attr-defined]
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import LLM, ToolSelection
from llama_index.resilience._delegate import aclose_stream, undecorated_call
from llama_index.resilience._tool_request import TOOL_REQUEST_KEY, ToolRequest, function_calling
from llama_index.resilience.events import FallbackStreamRestartEvent

from llm_resilience.budget import served_model
from llm_resilience.checks import KnownKeywords
from llm_resilience.fallback import (
    Cooldown,
    FallbackChain,
    LoserUsage,
    MemberHealth,
    MemberProfile,
    RequestNeeds,
    StreamRestart,
    member_profile,
    merge_capabilities,
    read_from_primary,
)
from llm_resilience.layers import Probeable
from llm_resilience.redact import redacted_fields
from llm_resilience.retry import RetryPolicy
from llm_resilience.retry_budget import RetryBudget
from llm_resilience.served import SERVED_BY_KEY, served_mark
from llm_resilience.usage import StreamUsage, Usage, reported_usage

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = ["SERVED_BY_KEY", "FallbackLLM"]

dispatcher = get_dispatcher(__name__)


_ResponseT = TypeVar("_ResponseT", ChatResponse, CompletionResponse)
_LayerT = TypeVar("_LayerT")


def _option(description: str, exclude: bool = False) -> Any:
    """A constructor option: None by default, fixed once the chain is built."""
    return Field(default=None, frozen=True, exclude=exclude, description=description)


class FallbackLLM(FunctionCallingLLM, Probeable, KnownKeywords):
    """Try ``llms`` in order; move to the next one at once when one fails transiently.

    Example:

    ```python
    from llama_index.core import Settings
    from llama_index.llms.anthropic import Anthropic
    from llama_index.llms.openai import OpenAI
    from llama_index.resilience import FallbackLLM

    Settings.llm = FallbackLLM(
        llms=[OpenAI(model="gpt-4o", max_retries=0), Anthropic(model="claude-sonnet-4-5")],
        per_client_timeout=30,
    )  # query engines, agents and structured_predict now fail over
    ```

    ``llms`` needs at least 2 LlamaIndex ``LLM`` objects, tried in that order, each once
    per call, under the rules of [`llm_resilience.FallbackChain`][] (what is
    transient, the time limits, restarts, cooldown, routing: ``docs/fallback.md``). Every
    option defaults to None (off) but ``mid_stream`` (``"restart"``):

    * ``per_client_timeout``, ``first_token_timeout``, ``idle_timeout``, ``hedge_after``:
      seconds > 0 as a number or a ``timedelta``, read back as seconds as float. A sync
      call that times out abandons its attempt on a worker thread, which runs on until
      the provider returns (as does a sync ``chat``'s hedged loser);
    * ``mid_stream``: a stream that fails after chunks restarts on the next LLM from the
      beginning (chunks already yielded stay yielded; a
      [`FallbackStreamRestartEvent`][] is dispatched);
      ``"raise"`` raises [`StreamInterruptedError`][llm_resilience.StreamInterruptedError] instead;
      ``"continue"`` has a ``stream_chat`` go on from the text delivered, sent as a last
      assistant ``ChatMessage`` to the next LLM that takes an assistant prefill
      (LlamaIndex's ``Anthropic``, or one declared ``MemberProfile(assistant_prefill=True)``);
    * ``cooldown`` ([`llm_resilience.Cooldown`][]), ``classifier`` (replaces the
      transient rule), ``member_retry`` ([`llm_resilience.RetryPolicy`][]: retry an LLM
      that answered 429 or a 5xx before moving on);
    * ``member_profiles=[MemberProfile(...), None]`` declares or overrides what is known
      per LLM beyond its ``metadata`` (``context_window``; ``is_function_calling_model``
      of a ``FunctionCallingLLM``): a prompt too long goes to the next LLM known to be
      larger, a ``chat_with_tools`` call (or images) skips the LLMs known not to take them.

    Attributes the chain does not have are read from the first LLM (``llm.model``,
    ``llm.temperature``); writes stay on the chain. Members that retry by themselves
    (LlamaIndex's ``OpenAI`` defaults to ``max_retries=3``) are warned about once.

    Raises ``ValueError``/``TypeError`` naming the option: fewer than 2 ``llms``, a
    member that is not an ``LLM``, a bad time limit, ``cooldown`` or ``classifier``, or
    a keyword it does not take (naming the closest).
    """

    llms: tuple[LLM, ...] = Field(frozen=True, description="The LLMs, in the order they are tried.")
    per_client_timeout: float | None = _option(
        "Seconds each attempt may take, as float (None: unbounded)."
    )
    first_token_timeout: float | None = _option(
        "Seconds to wait for a stream's first content, or a call's reply, as float (None: off)."
    )
    idle_timeout: float | None = _option(
        "Seconds a stream may stay silent once content started, as float (None: off)."
    )
    cooldown: Any | None = _option("llm_resilience.Cooldown circuit breaker, or None.", True)
    classifier: Any | None = _option(
        "Transient-error predicate replacing llm_resilience.is_transient.", True
    )
    member_retry: Any | None = _option(
        "llm_resilience.RetryPolicy retrying a member on 429/5xx first, or None.", True
    )
    retry_budget: Any | None = _option(
        "llm_resilience.RetryBudget the chain's retries and hedges draw from, or None.", True
    )
    member_profiles: Any | None = _option(
        "Per LLM, a MemberProfile (or None) overriding what its metadata says.", True
    )
    hedge_after: float | None = _option(
        "Seconds, as float, without a first token before the next LLM also gets the request; "
        "the first to produce content wins (None: off)."
    )
    mid_stream: str = Field(
        default="restart",
        frozen=True,
        description=(
            'A stream that fails after content: "restart" on the next LLM (with the '
            'event), "continue" from the delivered text on an LLM that takes an '
            'assistant prefill, or "raise" StreamInterruptedError.'
        ),
    )

    _chain: FallbackChain[LLM] = PrivateAttr()
    #: The members' facts, ``member_profiles``, and `metadata`'s fields and dump as they
    #: were last merged.
    _merged_metadata: tuple[Any, Any, dict[str, Any], dict[str, Any]] | None = PrivateAttr(
        default=None
    )

    def __init__(
        self,
        *,
        llms: Sequence[LLM],
        per_client_timeout: float | timedelta | None = None,
        first_token_timeout: float | timedelta | None = None,
        idle_timeout: float | timedelta | None = None,
        cooldown: Cooldown | None = None,
        classifier: Callable[[BaseException], bool] | None = None,
        member_profiles: Sequence[MemberProfile | None] | None = None,
        member_retry: RetryPolicy | None = None,
        mid_stream: str = "restart",
        hedge_after: float | timedelta | None = None,
        retry_budget: RetryBudget | None = None,
        **kwargs: Any,
    ) -> None:
        # The engine validates first, so its errors (naming the option and the allowed
        # values) reach the user instead of a pydantic ValidationError.
        chain: FallbackChain[LLM] = FallbackChain(
            llms,
            per_client_timeout=per_client_timeout,
            first_token_timeout=first_token_timeout,
            idle_timeout=idle_timeout,
            classifier=classifier,
            cooldown=cooldown,
            on_restart=_announce_restart,
            mid_stream=mid_stream,
            clients_option="llms",
            member_profiles=member_profiles,
            profile_of=_known_profile,
            member_retry=member_retry,
            hedge_after=hedge_after,
            retry_budget=retry_budget,
        )
        for position, member in enumerate(chain.clients):
            if not isinstance(member, LLM):
                raise TypeError(
                    f"llms[{position}] must be a LlamaIndex LLM (llama_index.core.llms.LLM); "
                    f"got {type(member).__module__}.{type(member).__qualname__}"
                )
        super().__init__(
            llms=chain.clients,
            cooldown=cooldown,
            classifier=classifier,
            member_profiles=member_profiles,
            member_retry=member_retry,
            retry_budget=retry_budget,
            mid_stream=chain.mid_stream,
            **chain.durations,
            **kwargs,
        )
        self._chain = chain

    @classmethod
    def class_name(cls) -> str:
        return "FallbackLLM"

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # repr(), str() and rich output are built from these: no member's credentials.
        return redacted_fields(super().__repr_args__())

    @property
    def inner(self) -> tuple[LLM, ...]:
        """The wrapped LLMs, in the order they are tried (same as ``llms``)."""
        return self.llms

    def layers_below(self) -> tuple[LLM, ...]:
        """What this layer wraps directly: its members, in the order they are tried."""
        return tuple(self.llms)

    def health(self) -> tuple[MemberHealth, ...]:
        """Each member's circuit (see
        [`FallbackChain.health`][llm_resilience.FallbackChain.health]), in ``llms`` order."""
        return _chain_of(self).health()

    def __getattr__(self, name: str) -> Any:
        """Reads the chain cannot answer go to its first member (``llm.model``,
        ``llm.temperature``, a custom attribute). Private and dunder names never do, and
        writes stay on the chain."""
        try:
            return super().__getattr__(name)  # type: ignore[misc]  # pydantic's privates
        except AttributeError as missing:
            return read_from_primary(self, name, self.__dict__.get("llms"), missing)

    @property
    def metadata(self) -> LLMMetadata:
        """What every member can do (`llm_resilience.fallback.merge_capabilities`).

        ``context_window`` and ``num_output``: the smallest positive value among the
        members (non-positive values mean "unknown", as OpenAI's ``num_output=-1``; -1
        when no member states one), a ``member_profiles`` declaration winning over a
        member's own ``context_window`` and ``is_function_calling_model``.
        ``is_chat_model``/``is_function_calling_model``: true only if true for every
        member. ``model_name``: ``"fallback(a,b)"``. ``system_role``: the first member's.
        """
        return LLMMetadata(**self._merged_metadata_fields()[0])

    def to_payload(self) -> dict[str, Any]:
        """What LlamaIndex's events carry of this LLM: LlamaIndex's own payload (the class
        name and the `metadata`), its dump kept while the members' facts stay the same."""
        return {"class_name": self.class_name(), **self._merged_metadata_fields()[1]}

    def _merged_metadata_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """`metadata`'s fields and their dump. Read on every call (LlamaIndex's events
        carry them): the members' facts are read each time, merged again only when they
        changed."""
        members = list(map(_metadata_of, self.llms))
        facts = (tuple(map(_member_facts, members)), members[0].system_role)
        declared = self.member_profiles
        known = _private(self)["_merged_metadata"]
        if known is not None and known[0] == facts and known[1] is declared:
            return known[2], known[3]
        merged = merge_capabilities(
            [dict(zip(_MERGED_METADATA, values, strict=False)) for values in facts[0]],
            declared,
            {"context_window": "context_window", "tool_calling": "is_function_calling_model"},
        )
        fields = {
            "context_window": merged.get("context_window", -1),
            "num_output": merged.get("num_output", -1),
            "is_chat_model": merged.get("is_chat_model", False),
            "is_function_calling_model": merged.get("is_function_calling_model", False),
            "model_name": f"fallback({','.join(m.model_name for m in members)})",
            "system_role": members[0].system_role,
        }
        dumped = LLMMetadata(**fields).model_dump()
        self._merged_metadata = (facts, declared, fields, dumped)
        return fields, dumped

    # -- chat ---------------------------------------------------------------------
    # Without a tool request or a prefill, a member gets the call as LlamaIndex's own
    # decorator would hand it (``messages`` positional); its chunks are marked by the
    # chain's loop (``mark=_served``), with no generator of ours around its stream.

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        tool_request = kwargs.pop(TOOL_REQUEST_KEY, None)

        def attempt(index: int, member: LLM) -> ChatResponse:
            call = undecorated_call(member, "chat", is_async=False)
            if tool_request is None:
                response: ChatResponse = call(messages, **kwargs)
            else:
                response = call(**_chat_kwargs(member, index, messages, kwargs, tool_request))
            return _served(response, index)

        chain = _chain_of(self)
        return chain.invoke(
            attempt,
            needs=_needs(chain, messages, tool_request, kwargs),
            hedge_usage=None if chain.hedge_after is None else _loser_usage(self, messages),
        )

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        tool_request = kwargs.pop(TOOL_REQUEST_KEY, None)

        async def attempt(index: int, member: LLM) -> ChatResponse:
            call = undecorated_call(member, "achat", is_async=True)
            if tool_request is None:
                response: ChatResponse = await call(messages, **kwargs)
            else:
                response = await call(**_chat_kwargs(member, index, messages, kwargs, tool_request))
            return _served(response, index)

        chain = _chain_of(self)
        return await chain.ainvoke(
            attempt,
            needs=_needs(chain, messages, tool_request, kwargs),
            hedge_usage=None if chain.hedge_after is None else _loser_usage(self, messages),
        )

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        tool_request = kwargs.pop(TOOL_REQUEST_KEY, None)

        def attempt(index: int, member: LLM, prefill: str | None = None) -> Iterable[ChatResponse]:
            # Called by the chain as it pulls the first chunk: the request starts then.
            call = undecorated_call(member, "stream_chat", is_async=False)
            if tool_request is None and prefill is None:
                stream: Iterable[ChatResponse] = call(messages, **kwargs)
                return stream
            prepared = _chat_kwargs(member, index, messages, kwargs, tool_request, prefill)
            if prefill is None:
                with_tools: Iterable[ChatResponse] = call(**prepared)
                return with_tools
            return _prefilled(lambda: call(**prepared), prefill)

        # The engine's stream is a generator (LlamaIndex's callback wraps generators
        # only to emit the end event) and starts no request before the first chunk.
        chain = _chain_of(self)
        stream = chain.stream(
            attempt,
            is_content=_carries_content,
            needs=_needs(chain, messages, tool_request, kwargs),
            text_of=_text_of,
            continue_attempt=attempt,
            drop_text=_drop_text,
            hedge_usage=None if chain.hedge_after is None else _loser_usage(self, messages),
            mark=_served,
        )
        return cast(ChatResponseGen, stream)

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        tool_request = kwargs.pop(TOOL_REQUEST_KEY, None)

        def attempt(
            index: int, member: LLM, prefill: str | None = None
        ) -> Awaitable[AsyncIterable[ChatResponse]] | AsyncIterable[ChatResponse]:
            # The chain awaits the member's coroutine as it pulls the first chunk.
            call = undecorated_call(member, "astream_chat", is_async=True)
            if tool_request is None and prefill is None:
                opened: Awaitable[AsyncIterable[ChatResponse]] = call(messages, **kwargs)
                return opened
            prepared = _chat_kwargs(member, index, messages, kwargs, tool_request, prefill)
            if prefill is None:
                with_tools: Awaitable[AsyncIterable[ChatResponse]] = call(**prepared)
                return with_tools
            return _aprefilled(lambda: call(**prepared), prefill)

        chain = _chain_of(self)
        stream = chain.astream(
            attempt,
            is_content=_carries_content,
            needs=_needs(chain, messages, tool_request, kwargs),
            text_of=_text_of,
            continue_attempt=attempt,
            drop_text=_drop_text,
            hedge_usage=None if chain.hedge_after is None else _loser_usage(self, messages),
            mark=_served,
        )
        return cast(ChatResponseAsyncGen, stream)

    # -- completion ---------------------------------------------------------------

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        def attempt(index: int, member: LLM) -> CompletionResponse:
            call = undecorated_call(member, "complete", is_async=False)
            response: CompletionResponse = call(prompt, formatted=formatted, **kwargs)
            return _served(response, index)

        chain = _chain_of(self)
        return chain.invoke(
            attempt, hedge_usage=None if chain.hedge_after is None else _loser_usage(self, prompt)
        )

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        async def attempt(index: int, member: LLM) -> CompletionResponse:
            call = undecorated_call(member, "acomplete", is_async=True)
            response: CompletionResponse = await call(prompt, formatted=formatted, **kwargs)
            return _served(response, index)

        chain = _chain_of(self)
        return await chain.ainvoke(
            attempt, hedge_usage=None if chain.hedge_after is None else _loser_usage(self, prompt)
        )

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        def attempt(index: int, member: LLM) -> Iterable[CompletionResponse]:
            call = undecorated_call(member, "stream_complete", is_async=False)
            stream: Iterable[CompletionResponse] = call(prompt, formatted=formatted, **kwargs)
            return stream

        chain = _chain_of(self)
        stream = chain.stream(
            attempt,
            is_content=_carries_content,
            text_of=_text_of,
            hedge_usage=None if chain.hedge_after is None else _loser_usage(self, prompt),
            mark=_served,
        )
        return cast(CompletionResponseGen, stream)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        def attempt(
            index: int, member: LLM
        ) -> Awaitable[AsyncIterable[CompletionResponse]] | AsyncIterable[CompletionResponse]:
            call = undecorated_call(member, "astream_complete", is_async=True)
            opened: Awaitable[AsyncIterable[CompletionResponse]] = call(
                prompt, formatted=formatted, **kwargs
            )
            return opened

        chain = _chain_of(self)
        stream = chain.astream(
            attempt,
            is_content=_carries_content,
            text_of=_text_of,
            hedge_usage=None if chain.hedge_after is None else _loser_usage(self, prompt),
            mark=_served,
        )
        return cast(CompletionResponseAsyncGen, stream)

    # -- function calling -----------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Defer tool preparation to the member that gets each attempt.

        Returns the messages (for the wrapper's own events) and a tool request that
        ``chat``/``achat``/``stream_chat``/``astream_chat`` hand to each member's
        ``_prepare_chat_with_tools``.
        """
        return ToolRequest.deferred(
            tools,
            user_msg=user_msg,
            chat_history=chat_history,
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            **kwargs,
        )

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        """Let the member that served ``response`` validate it (see the module docs)."""
        routed = self._route(response)
        if routed is None:
            return response
        _, member, own = routed
        if not isinstance(member, FunctionCallingLLM):
            return response
        validated: ChatResponse = member._validate_chat_with_tools_response(
            own, tools, allow_parallel_tool_calls=allow_parallel_tool_calls, **kwargs
        )
        path = response.additional_kwargs[SERVED_BY_KEY]
        return validated.model_copy(
            update={"additional_kwargs": {**validated.additional_kwargs, SERVED_BY_KEY: path}}
        )

    def get_tool_calls_from_response(
        self,
        response: ChatResponse,
        error_on_no_tool_call: bool = True,
        **kwargs: Any,
    ) -> list[ToolSelection]:
        """Parse tool calls with the member that produced ``response``.

        The member is found through ``additional_kwargs["fallback_served_by"]``. An
        unmarked response is offered to each member in turn; the first non-empty parse
        wins. Raises ``ValueError`` when no tool call is found and
        ``error_on_no_tool_call`` is true, as LlamaIndex's own LLMs do.
        """
        routed = self._route(response)
        if routed is not None:
            index, member, own = routed
            return function_calling(member, index).get_tool_calls_from_response(
                own, error_on_no_tool_call=error_on_no_tool_call, **kwargs
            )
        for member in self.llms:
            if not isinstance(member, FunctionCallingLLM):
                continue
            try:
                calls = member.get_tool_calls_from_response(
                    response, error_on_no_tool_call=False, **kwargs
                )
            except Exception:
                # A member may not understand another provider's response shape.
                continue
            if calls:
                return calls
        if error_on_no_tool_call:
            raise ValueError("Expected at least one tool call, but got 0 tool calls.")
        return []

    def _route(self, response: ChatResponse) -> tuple[int, LLM, ChatResponse] | None:
        """Index and member that served ``response``, and the response as it made it."""
        path = response.additional_kwargs.get(SERVED_BY_KEY)
        if not isinstance(path, list) or not path:
            return None
        index = path[0]
        if isinstance(index, bool) or not isinstance(index, int):
            return None
        if not 0 <= index < len(self.llms):
            return None
        below = {k: v for k, v in response.additional_kwargs.items() if k != SERVED_BY_KEY}
        if len(path) > 1:
            below[SERVED_BY_KEY] = list(path[1:])
        return index, self.llms[index], response.model_copy(update={"additional_kwargs": below})


# -- helpers ------------------------------------------------------------------------


#: The metadata fields merged over the members (the rest is named below).
_MERGED_METADATA = ("context_window", "num_output", "is_chat_model", "is_function_calling_model")
#: A member's metadata facts `FallbackLLM.metadata` merges, and its model name, in one
#: C call (read on every call: LlamaIndex's events carry the metadata).
_member_facts = attrgetter(*_MERGED_METADATA, "model_name")
_metadata_of = attrgetter("metadata")

#: The LlamaIndex classes known to take an assistant prefill: ``Anthropic`` speaks the
#: Messages API, which does.
_PREFILL_CLASSES = (("llama_index.llms.anthropic", "Anthropic"),)


def _private(llm: FallbackLLM) -> dict[str, Any]:
    r"""``llm``'s private attributes, for reads on a call's hot path: ``llm._chain`` fails
    the normal lookup and goes through pydantic's ``__getattr__`` and ours (about 2 µs)."""
    state = llm.__pydantic_private__
    assert state is not None  # set in __init__
    return state


def _chain_of(llm: FallbackLLM) -> FallbackChain[LLM]:
    chain: FallbackChain[LLM] = llm.__pydantic_private__["_chain"]  # type: ignore[index]
    return chain


def _known_profile(member: object) -> MemberProfile | None:
    """What a member's LlamaIndex metadata says, in the core's terms."""
    if not isinstance(member, LLM):
        return None  # FallbackLLM names the problem
    try:
        metadata: LLMMetadata | None = member.metadata
    except Exception:
        metadata = None  # some integrations raise for a model name they do not know
    return member_profile(
        member,
        context_window=metadata.context_window if metadata else None,
        tool_calling=(
            isinstance(member, FunctionCallingLLM) and metadata.is_function_calling_model
            if metadata
            else None
        ),
        prefill_classes=_PREFILL_CLASSES,
    )


def _needs(
    chain: FallbackChain[LLM],
    messages: Sequence[ChatMessage],
    tool_request: ToolRequest | None,
    kwargs: dict[str, Any],
) -> RequestNeeds | None:
    """What the request carries that a member is known to lack; None when nothing (the
    chain then skips routing). Only the needs some member lacks are looked for
    (``chain.routed_needs``): the others would keep every member."""
    routed = chain.routed_needs
    if not routed:
        return None
    tools = "tool_calling" in routed and (
        (tool_request is not None and bool(tool_request.tools))
        or ("tools" in kwargs and bool(kwargs["tools"]))
    )
    images = "image_inputs" in routed and any(
        getattr(block, "block_type", None) == "image"
        for message in messages
        for block in message.blocks
    )
    if not images and not tools:
        return None
    return RequestNeeds(tool_calling=tools, image_inputs=images)


def _chat_kwargs(
    member: LLM,
    index: int,
    messages: Sequence[ChatMessage],
    kwargs: dict[str, Any],
    tool_request: ToolRequest | None,
    prefill: str | None = None,
) -> dict[str, Any]:
    if tool_request is None:
        prepared = {"messages": messages, **kwargs}
    else:
        prepared = {**tool_request.prepare(member, index), **kwargs}
    if prefill is not None:
        # mid_stream="continue": the text delivered, as the assistant's unfinished turn.
        prefilled = ChatMessage(role=MessageRole.ASSISTANT, content=prefill)
        prepared["messages"] = [*prepared["messages"], prefilled]
    return prepared


def _served(response: _ResponseT, index: int) -> _ResponseT:
    """A shallow copy of ``response`` that records the member path that served it.

    What ``response.model_copy(update={"additional_kwargs": ...})`` builds, built
    directly: pydantic's copy goes through ``copy.copy`` of each of its parts, which cost
    about 1.7 µs more per streamed chunk (a stream sends one response per chunk). The
    chain's stream loop calls it on every chunk (``mark``).
    """
    extra = response.additional_kwargs
    path = served_mark(index, extra[SERVED_BY_KEY]) if SERVED_BY_KEY in extra else [index]
    cls = type(response)
    copied = cls.__new__(cls)
    _assign(
        copied,
        "__dict__",
        {**response.__dict__, "additional_kwargs": {**extra, SERVED_BY_KEY: path}},
    )
    _set_fields_set(copied, response.__pydantic_fields_set__ | _MARKED_FIELD)
    extra_fields = response.__pydantic_extra__
    _set_extra(copied, None if extra_fields is None else dict(extra_fields))
    private = response.__pydantic_private__
    _set_private(copied, None if private is None else dict(private))
    return copied


#: The field `_served` sets on its copy.
_MARKED_FIELD = frozenset({"additional_kwargs"})
#: How `_served` fills its copy: pydantic's own ``__setattr__`` validates, so the slots
#: (and ``__dict__``) are set as ``BaseModel.__copy__`` sets them.
_assign = object.__setattr__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _prefilled(
    open_stream: Callable[[], Iterable[_ResponseT]], prefill: str
) -> Iterator[_ResponseT]:
    """A continuing member's stream (``mid_stream="continue"``), each chunk's message
    starting with the text already delivered (`_after_prefill`)."""
    # A generator, so the member's request starts when the engine pulls the first chunk.
    stream = open_stream()
    try:
        for chunk in stream:
            yield _after_prefill(chunk, prefill)
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


async def _aprefilled(
    open_stream: Callable[[], Awaitable[AsyncIterable[_ResponseT]] | AsyncIterable[_ResponseT]],
    prefill: str,
) -> AsyncIterator[_ResponseT]:
    """Async `_prefilled`."""
    opened = open_stream()
    stream = await opened if inspect.isawaitable(opened) else opened
    try:
        async for chunk in stream:
            yield _after_prefill(chunk, prefill)
    finally:
        await aclose_stream(stream)


def _carries_content(chunk: ChatResponse | CompletionResponse) -> bool:
    """Whether a streamed chunk counts as a token in the mid-stream log line.

    Text deltas and tool-call deltas count; role-only and finish/usage chunks do not.
    LlamaIndex chunks carry the tool calls accumulated so far, so once a tool call has
    begun every later chunk counts.
    """
    if chunk.delta:
        return True
    message = getattr(chunk, "message", None)
    if message is None:
        return False
    if message.additional_kwargs.get("tool_calls"):
        return True
    return any(getattr(block, "block_type", None) == "tool_call" for block in message.blocks)


def _text_of(chunk: ChatResponse | CompletionResponse) -> str:
    return chunk.delta or ""


def _after_prefill(chunk: _ResponseT, prefill: str | None) -> _ResponseT:
    """A continuing member's chunk whose accumulated message starts with the prefill.

    LlamaIndex chunks carry the message so far; a continuation's own starts after the
    prefill, so the prefill is put in front: the last chunk's message is the answer.
    """
    message = getattr(chunk, "message", None)
    if prefill is None or not isinstance(message, ChatMessage):
        return chunk
    blocks = list(message.blocks)
    if blocks and isinstance(blocks[0], TextBlock):
        blocks[0] = TextBlock(text=prefill + blocks[0].text)
    else:
        blocks.insert(0, TextBlock(text=prefill))
    return chunk.model_copy(update={"message": message.model_copy(update={"blocks": blocks})})


def _drop_text(chunk: ChatResponse, count: int) -> ChatResponse:
    """``chunk`` without the first ``count`` characters of its delta (whitespace the
    consumer already holds); its accumulated message is left whole."""
    return chunk.model_copy(update={"delta": (chunk.delta or "")[count:]})


def _loser_usage(llm: FallbackLLM, request: Sequence[ChatMessage] | str) -> LoserUsage | None:
    """Reads a hedged attempt that lost: the usage its provider reported, if any (None
    when the chain does not hedge: there is no loser to read)."""
    if _chain_of(llm).hedge_after is None:
        return None
    # ``_usage`` reads this module's SERVED_BY_KEY, so it is imported when first needed.
    from llama_index.resilience._usage import (
        prompt_pairs,
        raw_model,
        reported_details,
        reported_tokens,
    )

    prompt = prompt_pairs(request)

    def read(index: int, outcome: Any) -> tuple[Usage, str | None] | None:
        if isinstance(outcome, list):  # a stream's chunks before it lost
            tally = StreamUsage()
            model = None
            for chunk in outcome:
                tally.add(*reported_tokens(chunk), reported_details(chunk))
                model = model or raw_model(chunk)
            counts, details = (tally.input_tokens, tally.output_tokens), tally.details
        else:
            counts, model = reported_tokens(outcome), raw_model(outcome)
            details = reported_details(outcome)
        usage = reported_usage(*counts, prompt=prompt, details=details)
        if usage is None:
            return None
        return usage, served_model(model, llm.llms[index].metadata.model_name)

    return read


def _announce_restart(restart: StreamRestart) -> None:
    dispatcher.event(FallbackStreamRestartEvent(**restart.payload()))
