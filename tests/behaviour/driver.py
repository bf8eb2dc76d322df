"""How to drive each adapter, so a behaviour both frameworks share is written once.

A test in ``tests/behaviour/`` takes the ``driver`` fixture (one :class:`Driver` per
adapter: LangChain and LlamaIndex) and, where the behaviour holds for every call shape,
the ``mode`` fixture (``call``, ``acall``, ``stream``, ``astream``: LangChain's
``invoke``/``ainvoke``/``stream``/``astream``, LlamaIndex's
``chat``/``achat``/``stream_chat``/``astream_chat``). It builds models, chains and
layers through the driver and calls them through :meth:`Driver.run`, so the same lines
run against both adapters. What only one framework has stays in its own tree.

Concerns extend the base as mixins in modules of their own (``fallback_driver.py``:
fallback, streams, time limits; ``cost_driver.py``: budgets, limits, retries, the
builder); ``conftest.py`` combines them into one driver per framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

Mode = Literal["call", "acall", "stream", "astream"]
MODES: tuple[Mode, ...] = ("call", "acall", "stream", "astream")
STREAMS: tuple[Mode, ...] = ("stream", "astream")
PROMPT = "What is the capital of France?"


@dataclass
class Reply:
    """What one call gave back: the answer's text and the framework's own objects (one
    message or response for a call, every chunk for a stream)."""

    text: str
    responses: list[Any] = field(default_factory=list)


class Driver:
    """The adapter-neutral face of one framework. Subclasses fill in every method."""

    #: ``"langchain"`` or ``"llamaindex"``: the test id.
    name: ClassVar[str]

    # -- building ---------------------------------------------------------------------

    def answering(self, text: str = "Paris is the capital.", *, model: str = "fake-model") -> Any:
        """An offline model that answers ``text`` (streams it word by word) and reports
        its usage and its model name ``model``."""
        raise NotImplementedError

    def failing(
        self,
        error: BaseException | None = None,
        *,
        model: str = "failing-model",
        hang_seconds: float | None = None,
        chunks_before_error: int = 0,
    ) -> Any:
        """An offline model whose every request fails with a fresh copy of ``error``
        (default: the framework's fake HTTP 429), after hanging ``hang_seconds`` and,
        for a stream, after ``chunks_before_error`` chunks."""
        raise NotImplementedError

    def rate_limit_error(self) -> BaseException:
        """A provider's HTTP 429 as this framework's fakes raise it."""
        raise NotImplementedError

    def calls(self, fake: Any) -> int:
        """How many requests reached ``fake`` (a model from :meth:`answering`/:meth:`failing`)."""
        return int(fake.calls)

    def fallback(self, members: Sequence[Any], **options: Any) -> Any:
        """``FallbackChatModel(models=...)`` / ``FallbackLLM(llms=...)`` with ``options``."""
        raise NotImplementedError

    def rate_limited(self, inner: Any, **options: Any) -> Any:
        """``RateLimitedChatModel`` / ``RateLimitedLLM`` over ``inner``."""
        raise NotImplementedError

    def cost_tracked(self, inner: Any, **options: Any) -> Any:
        """``CostTrackedChatModel`` / ``CostTrackedLLM`` over ``inner``."""
        raise NotImplementedError

    # -- calling ----------------------------------------------------------------------

    def message_of(self, reply: Reply) -> Any:
        """The whole answer of a call (a stream's chunks merged where the framework can)."""
        return reply.responses[-1]

    async def run(self, model: Any, mode: Mode, prompt: str = PROMPT, **kwargs: Any) -> Reply:
        """Call ``model`` once in ``mode`` (sync modes run in this thread) with ``kwargs``."""
        raise NotImplementedError


class LangChainDriver(Driver):
    name = "langchain"

    def answering(self, text: str = "Paris is the capital.", *, model: str = "fake-model") -> Any:
        from langchain_llm_resilience.testing import ScriptedChatModel

        return ScriptedChatModel(model=model, responses=[text])

    def failing(
        self,
        error: BaseException | None = None,
        *,
        model: str = "failing-model",
        hang_seconds: float | None = None,
        chunks_before_error: int = 0,
    ) -> Any:
        from langchain_llm_resilience.testing import FailingChatModel

        options: dict[str, Any] = {"model": model, "chunks_before_error": chunks_before_error}
        if error is not None:
            options["error"] = error
        if hang_seconds is not None:
            options["hang_seconds"] = hang_seconds
        return FailingChatModel(**options)

    def rate_limit_error(self) -> BaseException:
        from langchain_llm_resilience.testing import rate_limit_error

        return rate_limit_error()

    def fallback(self, members: Sequence[Any], **options: Any) -> Any:
        from langchain_llm_resilience import FallbackChatModel

        return FallbackChatModel(models=list(members), **options)

    def rate_limited(self, inner: Any, **options: Any) -> Any:
        from langchain_llm_resilience import RateLimitedChatModel

        return RateLimitedChatModel(inner=inner, **options)

    def cost_tracked(self, inner: Any, **options: Any) -> Any:
        from langchain_llm_resilience import CostTrackedChatModel

        return CostTrackedChatModel(inner=inner, **options)

    def message_of(self, reply: Reply) -> Any:
        if len(reply.responses) == 1:
            return reply.responses[0]
        merged = reply.responses[0]
        for chunk in reply.responses[1:]:
            merged = merged + chunk
        return merged

    async def run(self, model: Any, mode: Mode, prompt: str = PROMPT, **kwargs: Any) -> Reply:
        if mode == "call":
            message = model.invoke(prompt, **kwargs)
            return Reply(message.text, [message])
        if mode == "acall":
            message = await model.ainvoke(prompt, **kwargs)
            return Reply(message.text, [message])
        if mode == "stream":
            chunks = list(model.stream(prompt, **kwargs))
        else:
            chunks = [chunk async for chunk in model.astream(prompt, **kwargs)]
        return Reply("".join(chunk.text for chunk in chunks), chunks)


class LlamaIndexDriver(Driver):
    name = "llamaindex"

    def answering(self, text: str = "Paris is the capital.", *, model: str = "fake-model") -> Any:
        from llama_index.resilience.testing import FakeFunctionCallingLLM

        return FakeFunctionCallingLLM(model_name=model, text=text)

    def failing(
        self,
        error: BaseException | None = None,
        *,
        model: str = "failing-model",
        hang_seconds: float | None = None,
        chunks_before_error: int = 0,
    ) -> Any:
        from llama_index.resilience.testing import FakeFunctionCallingLLM

        return FakeFunctionCallingLLM(
            model_name=model,
            error=error if error is not None else self.rate_limit_error(),
            hang_seconds=hang_seconds,
            fail_after_chunks=chunks_before_error,
        )

    def rate_limit_error(self) -> BaseException:
        from llama_index.resilience.testing import rate_limit_error

        return rate_limit_error()

    def fallback(self, members: Sequence[Any], **options: Any) -> Any:
        from llama_index.resilience import FallbackLLM

        return FallbackLLM(llms=list(members), **options)

    def rate_limited(self, inner: Any, **options: Any) -> Any:
        from llama_index.resilience import RateLimitedLLM

        return RateLimitedLLM(inner=inner, **options)

    def cost_tracked(self, inner: Any, **options: Any) -> Any:
        from llama_index.resilience import CostTrackedLLM

        return CostTrackedLLM(inner=inner, **options)

    async def run(self, model: Any, mode: Mode, prompt: str = PROMPT, **kwargs: Any) -> Reply:
        from llama_index.core.base.llms.types import ChatMessage, MessageRole

        messages = [ChatMessage(role=MessageRole.USER, content=prompt)]
        if mode == "call":
            response = model.chat(messages, **kwargs)
            return Reply(response.message.content or "", [response])
        if mode == "acall":
            response = await model.achat(messages, **kwargs)
            return Reply(response.message.content or "", [response])
        if mode == "stream":
            chunks = list(model.stream_chat(messages, **kwargs))
        else:
            stream = await model.astream_chat(messages, **kwargs)
            chunks = [chunk async for chunk in stream]
        return Reply("".join(chunk.delta or "" for chunk in chunks), chunks)
