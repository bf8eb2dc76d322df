"""What the fallback behaviours need of each framework, as mixins over ``driver.py``'s drivers.

Besides the base's fakes and chains: where a chain says which member served and under
which model name, its stream restarts as one neutral :class:`Restart` record each, a
member with a rate limiter, attributes or a retry setting of its own, real provider
clients pointed at a local ``FaultInjectingServer``, and a request with a tool bound.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, NamedTuple

import pytest
from driver import PROMPT, STREAMS, Mode, Reply
from langchain_core.language_models import FakeListChatModel
from llama_index.core.llms import MockLLM
from pydantic import BaseModel

from llm_resilience.testing import FaultInjectingServer

WAIT = 10.0


Servers = tuple[FaultInjectingServer, FaultInjectingServer]
#: Which wire format a primary fails in and which one its secondary answers in. LlamaIndex's
#: Anthropic does not run against the installed SDK: it runs the first pair only.
PAIRS = ("openai-openai", "openai-anthropic", "anthropic-openai")


@contextmanager
def serving(primary_reply: str, secondary_reply: str) -> Iterator[Servers]:
    """A fault server for a primary and one for its secondary, fresh for each test (the
    provider packages cache async HTTP clients per base URL)."""
    with (
        FaultInjectingServer(reply=primary_reply, name="primary") as primary,
        FaultInjectingServer(reply=secondary_reply, name="secondary") as secondary,
    ):
        yield primary, secondary


def wire_pair(request: pytest.FixtureRequest) -> tuple[str, str]:
    """A ``PAIRS`` parameter as ``(primary's wire, secondary's wire)``."""
    first, second = str(request.param).split("-")
    return first, second


class Capital(BaseModel):
    """A country's capital city, as a structured-output request asks for it."""

    city: str


class Restart(NamedTuple):
    """One stream restart a chain reported, in either framework's event."""

    failed_client: int
    next_client: int
    chunks: int
    error_type: str
    continued: bool


def status_error(status: int, message: str | None = None) -> Exception:
    """An HTTP ``status`` error as the ``openai`` SDK raises it (both frameworks' fakes
    raise openai errors): ``BadRequestError`` for 400, ``InternalServerError`` for 5xx."""
    import httpx
    import openai

    request = httpx.Request("POST", "https://api.example.invalid/v1/chat/completions")
    response = httpx.Response(status, request=request)
    kinds: dict[int, type[openai.APIStatusError]] = {
        400: openai.BadRequestError,
        429: openai.RateLimitError,
    }
    kind = kinds.get(status, openai.InternalServerError if status >= 500 else openai.APIStatusError)
    return kind(message or f"Error code: {status}", response=response, body=None)


class RestartLog:
    """The restarts a chain reported so far, read afresh each time it is looked at."""

    def __init__(self, read: Callable[[], list[Restart]]) -> None:
        self._read = read

    def __iter__(self) -> Iterator[Restart]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    def __getitem__(self, index: int) -> Restart:
        return self._read()[index]

    def __eq__(self, other: object) -> bool:
        return self._read() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._read())


class CountingLimiter:
    """Counts the permits a member takes (wrapped in each framework's limiter type)."""

    def __init__(self) -> None:
        self.taken = 0


class LangChainFallback:
    """LangChain's side of the fallback behaviours."""

    #: The option that holds a chain's members.
    members_option: ClassVar[str] = "models"
    #: How a construction error names the type a member must have.
    member_type: ClassVar[str] = "LangChain chat model (BaseChatModel)"
    #: A field of the framework's base model a user may set on a chain, and a value.
    own_field: ClassVar[tuple[str, Any]] = ("verbose", True)
    #: The attribute a provider client names its model by.
    model_attribute: ClassVar[str] = "model_name"

    @property
    def fallback_type(self) -> type[Any]:
        from langchain_llm_resilience import FallbackChatModel

        return FallbackChatModel

    def members_of(self, chain: Any) -> list[Any]:
        return list(chain.models)

    # -- reading a reply ----------------------------------------------------------------

    def served_by(self, reply: Reply) -> int:
        """The index, in the outermost chain, of the member that served ``reply``."""
        return int(self.message_of(reply).response_metadata["fallback_served_by"][0])

    def model_name_of(self, reply: Reply) -> str:
        return str(self.message_of(reply).response_metadata["model_name"])

    def streamed_model_name(self, wire: str, model: str) -> str | None:
        """The model name a stream of ``wire``'s client names: LangChain's clients all
        pass on the provider's name."""
        return model

    def passes_opening_events(self, wire: str) -> bool:
        """Whether ``wire``'s client yields a chunk for the provider's opening (non-text)
        events: LangChain's do (OpenAI's role chunk, Anthropic's ``message_start``)."""
        return True

    def output_tokens_of(self, reply: Reply) -> int:
        usage = self.message_of(reply).usage_metadata
        return int(usage["output_tokens"]) if usage else 0

    def input_tokens_of(self, reply: Reply) -> int:
        usage = self.message_of(reply).usage_metadata
        return int(usage["input_tokens"]) if usage else 0

    def whole_text(self, reply: Reply) -> str:
        """The answer as the framework assembles it (a stream's chunks merged)."""
        return str(self.message_of(reply).text)

    def finish_reason_of(self, reply: Reply) -> str | None:
        return self.message_of(reply).response_metadata.get("finish_reason")

    def identifying_params(self, chain: Any) -> dict[str, Any] | None:
        """What LangChain keys its cache on (LlamaIndex has no such thing: None)."""
        return dict(chain._identifying_params)

    # -- restarts -------------------------------------------------------------------------

    @contextmanager
    def restarts(self, model: Any) -> Iterator[tuple[Any, RestartLog]]:
        """``model`` as it must be called to be watched, and the restarts it reports."""
        from langchain_llm_resilience.testing import RestartEvents

        handler = RestartEvents()
        log = RestartLog(
            lambda: [
                Restart(
                    e["failed_client"],
                    e["next_client"],
                    e["chunks"],
                    e["error_type"],
                    e["continued"],
                )
                for e in handler.events
            ]
        )
        yield model.with_config(callbacks=[handler]), log

    @contextmanager
    def reported_answers(self, model: Any) -> Iterator[tuple[Any, list[str]]]:
        """``model`` as it must be called to be watched, and the answer text of each
        model run the framework reports as ended (LangChain's ``on_llm_end``)."""
        from langchain_core.callbacks import BaseCallbackHandler

        answers: list[str] = []

        class Ends(BaseCallbackHandler):
            def on_llm_end(self, response: Any, **kwargs: Any) -> None:
                answers.append(response.generations[0][0].text)

        yield model.with_config(callbacks=[Ends()]), answers

    # -- members --------------------------------------------------------------------------

    def cut_stream(self, text: str, *, after: int, model: str = "cut-model", **options: Any) -> Any:
        """A member that streams ``after`` chunks and then fails with a 429 (or hangs
        ``hang_seconds`` first); a call (not a stream) fails at once."""
        from langchain_llm_resilience.testing import FailingChatModel

        return FailingChatModel(model=model, chunks_before_error=after, **options)

    def limited(self, fake: Any, limiter: CountingLimiter) -> Any:
        """``fake`` taking a permit from ``limiter`` before each request of its own."""
        from langchain_core.rate_limiters import BaseRateLimiter

        class Counting(BaseRateLimiter):
            def acquire(self, *, blocking: bool = True) -> bool:
                limiter.taken += 1
                return True

            async def aacquire(self, *, blocking: bool = True) -> bool:
                limiter.taken += 1
                return True

        fake.rate_limiter = Counting()
        return fake

    def self_retrying(self, model: str, retries: int) -> Any:
        """A member that retries by itself ``retries`` times."""
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(model=model, api_key="sk-FAKE", max_retries=retries)  # type: ignore[arg-type]

    def with_attribute(self, foo: int, text: str = "from the primary") -> Any:
        """A picklable member with a field ``foo`` of its own that answers ``text``."""
        return LangChainFooModel(foo=foo, responses=[text])

    def plain(self, text: str = "from the secondary") -> Any:
        """A picklable member without ``foo`` that answers ``text``."""
        from langchain_core.language_models import FakeListChatModel

        return FakeListChatModel(responses=[text])

    # -- real clients ---------------------------------------------------------------------

    def openai_member(
        self,
        server: FaultInjectingServer,
        model: str = "gpt-4o-mini",
        *,
        stream_usage: bool = False,
        http_clients: tuple[Any, Any] | None = None,
        **options: Any,
    ) -> Any:
        """A real OpenAI client on ``server`` (no retries of its own, a 10 s timeout unless
        ``options`` say otherwise), asking for a stream's usage if ``stream_usage``, over
        the ``(sync, async)`` httpx clients ``http_clients`` if given."""
        from langchain_openai import ChatOpenAI

        if http_clients is not None:
            options["http_client"], options["http_async_client"] = http_clients
        return ChatOpenAI(
            model=model,
            base_url=server.openai_base_url,
            api_key="sk-FAKE-test",  # type: ignore[arg-type]
            **({"stream_usage": True} if stream_usage else {}),
            **{"max_retries": 0, "timeout": WAIT, **options},
        )

    def anthropic_member(
        self, server: FaultInjectingServer, model: str = "claude-haiku-4-5"
    ) -> Any:
        from langchain_anthropic import ChatAnthropic

        return ChatAnthropic(  # type: ignore[call-arg]
            model_name=model,
            base_url=server.anthropic_base_url,
            api_key="sk-FAKE-test",  # type: ignore[arg-type]
            max_retries=0,
            timeout=WAIT,
            stop=None,
        )

    def other_wire_member(self, server: FaultInjectingServer) -> tuple[Any, str]:
        """A real client of a second provider (``ChatAnthropic``) and its model name."""
        from langchain_anthropic import ChatAnthropic

        member = ChatAnthropic(  # type: ignore[call-arg]
            model_name="claude-sonnet-4-5",
            base_url=server.anthropic_base_url,
            api_key="sk-FAKE-test",  # type: ignore[arg-type]
            max_retries=0,
            default_request_timeout=15.0,
            stop=None,
        )
        return member, "claude-sonnet-4-5"

    def member(self, provider: str, server: FaultInjectingServer, **options: Any) -> Any:
        """A real ``provider`` (``"openai"`` or ``"anthropic"``) client on ``server``."""
        if provider == "openai":
            return self.openai_member(server, **options)
        return self.anthropic_member(server)

    def warm(self, member: Any) -> None:
        """One sync call, so the SDK client is built before a time limit is measured."""
        member.invoke("warm up")

    def built_chain(self, members: Sequence[Any], **options: Any) -> Any:
        """The fallback chain ``ResilienceBuilder().use_fallback_chain(members, **options)``
        builds (a builder error is raised as is)."""
        from langchain_llm_resilience import ResilienceBuilder

        stack = ResilienceBuilder().use_fallback_chain(list(members), **options).build()
        return stack.chat.find_layer(self.fallback_type)

    # -- tools ----------------------------------------------------------------------------

    async def run_with_tool(self, chain: Any, mode: Mode, prompt: str) -> tuple[Reply, list[str]]:
        """``chain`` asked ``prompt`` with a ``get_weather`` tool: the reply and the names
        of the tools it called."""
        from langchain_core.tools import tool

        @tool
        def get_weather(city: str) -> str:
            """The weather in ``city``."""
            return f"sunny in {city}"

        reply = await self.run(chain.bind_tools([get_weather]), mode, prompt)  # type: ignore[attr-defined]
        calls = getattr(self.message_of(reply), "tool_calls", [])
        return reply, [call["name"] for call in calls]

    def tool_calling(self, tool_name: str, arguments: dict[str, Any], text: str) -> Any:
        """A member that calls ``tool_name`` when offered it (LangChain's scripted fake
        reads the ``arguments`` from the prompt, which must name the tool and hold them)
        and answers after the tool's result."""
        return self.answering(text)

    async def run_structured(self, chain: Any, mode: Mode, prompt: str) -> Any:
        """``chain`` asked ``prompt`` for a :class:`Capital` through a structured-output
        variant made for this one request (``with_structured_output``): the parsed answer."""
        structured = chain.with_structured_output(Capital)
        if mode == "call":
            return structured.invoke(prompt)
        if mode == "acall":
            return await structured.ainvoke(prompt)
        if mode == "stream":
            return list(structured.stream(prompt))[-1]
        return [parsed async for parsed in structured.astream(prompt)][-1]

    def structured_member(self) -> Any:
        """A member that answers a :class:`Capital` request (the scripted fake fills any
        schema from the prompt)."""
        return self.answering()

    async def run_agent(self, chain: Any, mode: Mode, prompt: str, tool: Callable[..., Any]) -> str:
        """An agent over ``chain`` with ``tool`` (a function), run on ``prompt`` to its end:
        LangChain's ``create_agent``, run by ``invoke``/``ainvoke``/``stream``/``astream``
        (the last state streamed). Returns the agent's last message's text."""
        from langchain.agents import create_agent
        from langchain_core.messages import HumanMessage
        from langchain_core.tools import tool as as_tool

        agent = create_agent(chain, tools=[as_tool(tool)])
        request = {"messages": [HumanMessage(prompt)]}
        if mode == "call":
            state = agent.invoke(request)
        elif mode == "acall":
            state = await agent.ainvoke(request)
        elif mode == "stream":
            state = list(agent.stream(request, stream_mode="values"))[-1]
        else:
            state = [step async for step in agent.astream(request, stream_mode="values")][-1]
        return str(state["messages"][-1].text)

    # -- streams not yet read -------------------------------------------------------------

    def text_of(self, chunk: Any) -> str:
        """The text one streamed chunk carries."""
        return str(chunk.text)

    async def read_stream(self, model: Any, mode: Mode, received: list[str]) -> None:
        """Stream ``model`` as a plain consumer, each chunk's text into ``received`` as it
        arrives (so what was read before an error is kept)."""
        if mode == "stream":
            for chunk in model.stream(PROMPT):
                received.append(chunk.text)
        else:
            async for chunk in model.astream(PROMPT):
                received.append(chunk.text)

    async def opened(self, model: Any, mode: Mode) -> Any:
        """A stream opened but not read (``stream``/``astream``)."""
        if mode == "stream":
            return self.sync_stream(model)
        return model.astream(PROMPT)

    def sync_stream(self, model: Any, prompt: str = PROMPT) -> Any:
        """A sync stream opened but not read, for a thread of its own."""
        return model.stream(prompt)


class LangChainFooModel(FakeListChatModel):
    """A member with a field ``foo`` of its own (picklable: it holds no lock)."""

    foo: int = 0


class LlamaIndexFooLLM(MockLLM):
    """A picklable member with a field ``foo`` of its own."""

    foo: int = 0


class LlamaIndexFallback:
    """LlamaIndex's side of the fallback behaviours."""

    members_option: ClassVar[str] = "llms"
    member_type: ClassVar[str] = "LlamaIndex LLM (llama_index.core.llms.LLM)"
    own_field: ClassVar[tuple[str, Any]] = ("system_prompt", "Answer in French.")
    model_attribute: ClassVar[str] = "model"

    @property
    def fallback_type(self) -> type[Any]:
        from llama_index.resilience import FallbackLLM

        return FallbackLLM

    def members_of(self, chain: Any) -> list[Any]:
        return list(chain.llms)

    # -- reading a reply ----------------------------------------------------------------

    def served_by(self, reply: Reply) -> int:
        from llama_index.resilience import SERVED_BY_KEY

        return int(reply.responses[-1].additional_kwargs[SERVED_BY_KEY][0])

    def model_name_of(self, reply: Reply) -> str | None:
        raw = reply.responses[-1].raw
        named = raw.get("model") if isinstance(raw, dict) else getattr(raw, "model", None)
        return None if named is None else str(named)

    def streamed_model_name(self, wire: str, model: str) -> str | None:
        """The model name a stream of ``wire``'s client names: LlamaIndex's ``Anthropic``
        yields no ``message_start`` event, so its streams name none (its calls do)."""
        return None if wire == "anthropic" else model

    def passes_opening_events(self, wire: str) -> bool:
        """Whether ``wire``'s client yields a chunk for the provider's opening (non-text)
        events: LlamaIndex's ``OpenAI`` does (the role chunk), its ``Anthropic`` does not
        (``message_start`` is read, never yielded), so a failure right after it is one
        before streaming."""
        return wire != "anthropic"

    def _usage(self, reply: Reply, fake_key: str, sdk_field: str, anthropic_field: str) -> int:
        # The shipped fake puts its usage in additional_kwargs; the OpenAI SDK's in raw;
        # LlamaIndex's Anthropic stream in its message_delta event's raw["usage"].
        for response in reversed(reply.responses):
            if fake_key in response.additional_kwargs:
                return int(response.additional_kwargs[fake_key])
            raw = response.raw
            usage = raw.get("usage") if isinstance(raw, dict) else getattr(raw, "usage", None)
            if usage is not None:
                found = getattr(usage, sdk_field, None)
                return int(found if found is not None else getattr(usage, anthropic_field))
        return 0

    def output_tokens_of(self, reply: Reply) -> int:
        return self._usage(reply, "completion_tokens", "completion_tokens", "output_tokens")

    def input_tokens_of(self, reply: Reply) -> int:
        return self._usage(reply, "prompt_tokens", "prompt_tokens", "input_tokens")

    def whole_text(self, reply: Reply) -> str:
        """The answer as LlamaIndex assembles it: the last response's message."""
        return str(reply.responses[-1].message.content or "")

    def finish_reason_of(self, reply: Reply) -> str | None:
        for response in reversed(reply.responses):
            for choice in getattr(response.raw, "choices", None) or ():
                if choice.finish_reason is not None:
                    return str(choice.finish_reason)
        return None

    def identifying_params(self, chain: Any) -> dict[str, Any] | None:
        return None

    # -- restarts -------------------------------------------------------------------------

    @contextmanager
    def restarts(self, model: Any) -> Iterator[tuple[Any, RestartLog]]:
        from llama_index.resilience.testing import restart_events

        with restart_events() as handler:
            yield (
                model,
                RestartLog(
                    lambda: [
                        Restart(e.failed_client, e.next_client, e.chunks, e.error_type, e.continued)
                        for e in handler.events
                    ]
                ),
            )

    @contextmanager
    def reported_answers(self, model: Any) -> Iterator[tuple[Any, list[str]]]:
        """(LlamaIndex's ``LLMChatEndEvent`` on the root dispatcher.)"""
        from llama_index.core.instrumentation import get_dispatcher
        from llama_index.core.instrumentation.event_handlers import BaseEventHandler
        from llama_index.core.instrumentation.events import BaseEvent
        from llama_index.core.instrumentation.events.llm import LLMChatEndEvent

        answers: list[str] = []

        class Ends(BaseEventHandler):
            @classmethod
            def class_name(cls) -> str:
                return "Ends"

            def handle(self, event: BaseEvent, **kwargs: Any) -> None:
                if isinstance(event, LLMChatEndEvent) and event.response is not None:
                    answers.append(str(event.response.message.content))

        handler = Ends()
        dispatcher = get_dispatcher()
        dispatcher.add_event_handler(handler)
        try:
            yield model, answers
        finally:
            dispatcher.event_handlers.remove(handler)

    # -- members --------------------------------------------------------------------------

    def cut_stream(self, text: str, *, after: int, model: str = "cut-model", **options: Any) -> Any:
        from llama_index.resilience.testing import FakeFunctionCallingLLM, rate_limit_error

        return FakeFunctionCallingLLM(
            model_name=model,
            text=text,
            error=rate_limit_error(),
            fail_after_chunks=after,
            **options,
        )

    def limited(self, fake: Any, limiter: CountingLimiter) -> Any:
        class Counting:
            def acquire(self) -> None:
                limiter.taken += 1

            async def async_acquire(self) -> None:
                limiter.taken += 1

        fake.rate_limiter = Counting()
        return fake

    def self_retrying(self, model: str, retries: int) -> Any:
        from llama_index.resilience.testing import FakeFunctionCallingLLM

        return FakeFunctionCallingLLM(model_name=model, max_retries=retries)

    def with_attribute(self, foo: int, text: str = "from the primary") -> Any:
        llm = LlamaIndexFooLLM()
        llm.foo = foo  # MockLLM's __init__ takes only its own options
        return llm

    def plain(self, text: str = "from the secondary") -> Any:
        from llama_index.core.llms import MockLLM

        return MockLLM()

    # -- real clients ---------------------------------------------------------------------

    def openai_member(
        self,
        server: FaultInjectingServer,
        model: str = "gpt-4o-mini",
        *,
        stream_usage: bool = False,
        http_clients: tuple[Any, Any] | None = None,
        **options: Any,
    ) -> Any:
        from llama_index.llms.openai import OpenAI

        if http_clients is not None:
            options["http_client"], options["async_http_client"] = http_clients
        if stream_usage:
            options["additional_kwargs"] = {"stream_options": {"include_usage": True}}
        return OpenAI(
            model=model,
            api_base=server.openai_base_url,
            api_key="sk-FAKE-test",
            **{"max_retries": 0, "timeout": WAIT, **options},
        )

    def anthropic_member(
        self, server: FaultInjectingServer, model: str = "claude-haiku-4-5"
    ) -> Any:
        from llama_index.llms.anthropic import Anthropic

        return Anthropic(
            model=model,
            base_url=server.anthropic_base_url,
            api_key="sk-FAKE-test",
            max_retries=0,
            timeout=WAIT,
        )

    def other_wire_member(self, server: FaultInjectingServer) -> tuple[Any, str]:
        """LlamaIndex's Anthropic cannot run here: a second OpenAI model stands in."""
        return self.openai_member(server, "gpt-4o", timeout=15.0), "gpt-4o"

    def member(self, provider: str, server: FaultInjectingServer, **options: Any) -> Any:
        if provider == "openai":
            return self.openai_member(server, **options)
        return self.anthropic_member(server)

    def warm(self, member: Any) -> None:
        from llama_index.core.base.llms.types import ChatMessage, MessageRole

        member.chat([ChatMessage(role=MessageRole.USER, content="warm up")])

    def built_chain(self, members: Sequence[Any], **options: Any) -> Any:
        from llama_index.resilience import ResilienceBuilder

        stack = ResilienceBuilder().use_fallback_chain(list(members), **options).build()
        return stack.chat.find_layer(self.fallback_type)

    # -- tools ----------------------------------------------------------------------------

    async def run_with_tool(self, chain: Any, mode: Mode, prompt: str) -> tuple[Reply, list[str]]:
        from llama_index.core.tools import FunctionTool

        def get_weather(city: str) -> str:
            """The weather in ``city``."""
            return f"sunny in {city}"

        tools = [FunctionTool.from_defaults(fn=get_weather)]
        if mode == "call":
            responses = [chain.chat_with_tools(tools, user_msg=prompt)]
        elif mode == "acall":
            responses = [await chain.achat_with_tools(tools, user_msg=prompt)]
        elif mode == "stream":
            responses = list(chain.stream_chat_with_tools(tools, user_msg=prompt))
        else:
            stream = await chain.astream_chat_with_tools(tools, user_msg=prompt)
            responses = [chunk async for chunk in stream]
        reply = Reply(responses[-1].message.content or "", responses)
        calls = chain.get_tool_calls_from_response(responses[-1], error_on_no_tool_call=False)
        return reply, [call.tool_name for call in calls]

    def tool_calling(self, tool_name: str, arguments: dict[str, Any], text: str) -> Any:
        from llama_index.core.llms.llm import ToolSelection
        from llama_index.resilience.testing import FakeFunctionCallingLLM

        call = ToolSelection(tool_id="call_1", tool_name=tool_name, tool_kwargs=arguments)
        return FakeFunctionCallingLLM(tool_call=call, text=text)

    async def run_structured(self, chain: Any, mode: Mode, prompt: str) -> Any:
        """(``as_structured_llm``, called in ``mode``: the last response's ``raw``.)"""
        reply = await self.run(chain.as_structured_llm(Capital), mode, prompt)
        return reply.responses[-1].raw

    def structured_member(self) -> Any:
        return self.tool_calling("Capital", {"city": "Paris"}, "Paris.")

    async def run_agent(self, chain: Any, mode: Mode, prompt: str, tool: Callable[..., Any]) -> str:
        """(A ``FunctionAgent``, whose run is async in every mode: streaming in the stream
        modes.)"""
        from llama_index.core.agent.workflow import FunctionAgent
        from llama_index.core.tools import FunctionTool

        agent = FunctionAgent(
            tools=[FunctionTool.from_defaults(fn=tool)], llm=chain, streaming=mode in STREAMS
        )
        result = await agent.run(prompt)
        return str(result.response.content)

    # -- streams not yet read -------------------------------------------------------------

    def text_of(self, chunk: Any) -> str:
        return str(chunk.delta or "")

    async def read_stream(self, model: Any, mode: Mode, received: list[str]) -> None:
        stream = await self.opened(model, mode)
        if mode == "stream":
            for response in stream:
                received.append(response.delta or "")
        else:
            async for response in stream:
                received.append(response.delta or "")

    async def opened(self, model: Any, mode: Mode) -> Any:
        from llama_index.core.base.llms.types import ChatMessage, MessageRole

        if mode == "stream":
            return self.sync_stream(model)
        return await model.astream_chat([ChatMessage(role=MessageRole.USER, content=PROMPT)])

    def sync_stream(self, model: Any, prompt: str = PROMPT) -> Any:
        from llama_index.core.base.llms.types import ChatMessage, MessageRole

        return model.stream_chat([ChatMessage(role=MessageRole.USER, content=prompt)])


def clones(chain: Any) -> Sequence[Any]:
    """A shallow copy, a deep copy and a pickle round trip of ``chain``."""
    import pickle

    return (copy.copy(chain), copy.deepcopy(chain), pickle.loads(pickle.dumps(chain)))
