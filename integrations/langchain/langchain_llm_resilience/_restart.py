"""The stream-restart event: how a fallback chain's restart reaches a stream's callbacks.

LangChain's ``stream``/``astream`` do not hand ``_stream`` its run manager, so the
outermost layer of a stack names the run itself and passes a `RestartSink` down
through the call's keyword arguments (under `SINK_KWARG`, which every layer keeps
out of traced parameters and out of what a provider receives). The
``FallbackChatModel`` below sends `STREAM_RESTART_EVENT` through it (or, with no
sink, to its own run's handlers): `restart_hook` and `arestart_hook` are the
chain's ``on_restart`` hooks. The event's data is the core's
[`payload`][llm_resilience.StreamRestart.payload], wrapped and nothing more.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from uuid import UUID

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
)
from langchain_core.callbacks.manager import ahandle_event, handle_event
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig, ensure_config
from langchain_core.utils.uuid import uuid7

from llm_resilience.fallback import StreamRestart

__all__ = ["SINK_KWARG", "STREAM_RESTART_EVENT", "RestartSink", "arestart_hook", "restart_hook"]

#: Name of the custom callback event sent when a stream restarts on the next model.
#: Its data is ``{"failed_client": int, "next_client": int, "chunks": int,
#: "error_type": str, "continued": bool}``; unless ``continued``, a consumer should drop
#: what it accumulated so far.
STREAM_RESTART_EVENT = "llm_resilience.stream_restart"


SINK_KWARG = "_llm_resilience_restart_sink"


class RestartSink:
    """Sends the restart event to the callbacks of one stream call, under its run id."""

    __slots__ = ("_config", "_context", "_model", "_run_id")

    def __init__(
        self,
        model: BaseChatModel,
        config: RunnableConfig,
        run_id: UUID,
        context: contextvars.Context | None = None,
    ) -> None:
        self._model = model
        self._config = config
        self._run_id = run_id
        #: The caller's context when the stream was asked for: the config is completed
        #: (``ensure_config``) in it, only when an event is sent.
        self._context = context

    def __repr__(self) -> str:  # shown nowhere user-facing; keep it free of callbacks
        return "RestartSink()"

    @classmethod
    def attach(
        cls, model: BaseChatModel, config: RunnableConfig | None
    ) -> tuple[RunnableConfig, RestartSink]:
        # The id LangChain would give the run itself (a UUIDv7, which also costs half a
        # uuid4): naming it here moves that work, it adds none. The config is completed
        # by LangChain's ``stream`` for the run, and by the sink in the caller's context
        # only when a restart sends the event (most streams never do).
        run_id = (config.get("run_id") if config else None) or uuid7()
        named: RunnableConfig = {**config, "run_id": run_id} if config else {"run_id": run_id}
        return named, cls(model, named, run_id, contextvars.copy_context())

    def _configure(self, manager_cls: Any) -> Any:
        model = self._model
        context = self._context
        config = (
            ensure_config(self._config)
            if context is None
            else context.run(ensure_config, self._config)
        )
        return manager_cls.configure(
            config.get("callbacks"),
            model.callbacks,
            model.verbose,
            config.get("tags"),
            model.tags,
            config.get("metadata"),
            model.metadata,
        )

    def emit(self, data: Mapping[str, Any]) -> None:
        manager = self._configure(CallbackManager)
        manager.on_custom_event(STREAM_RESTART_EVENT, data, run_id=self._run_id)

    async def aemit(self, data: Mapping[str, Any]) -> None:
        manager = self._configure(AsyncCallbackManager)
        await manager.on_custom_event(STREAM_RESTART_EVENT, data, run_id=self._run_id)


def restart_hook(
    kwargs: Mapping[str, Any], run_manager: CallbackManagerForLLMRun | None
) -> Callable[[StreamRestart], None]:
    """A sync stream's ``on_restart``: the event to the sink in ``kwargs``, else to the run."""
    sink: RestartSink | None = kwargs.get(SINK_KWARG)

    def restarted(restart: StreamRestart) -> None:
        if sink is not None:
            sink.emit(restart.payload())
        elif run_manager is not None and run_manager.handlers:
            args, options = _run_event(run_manager, restart)
            handle_event(*args, **options)

    return restarted


def arestart_hook(
    kwargs: Mapping[str, Any], run_manager: AsyncCallbackManagerForLLMRun | None
) -> Callable[[StreamRestart], Awaitable[None]]:
    """An async stream's ``on_restart``, as `restart_hook`."""
    sink: RestartSink | None = kwargs.get(SINK_KWARG)

    async def restarted(restart: StreamRestart) -> None:
        if sink is not None:
            await sink.aemit(restart.payload())
        elif run_manager is not None and run_manager.handlers:
            args, options = _run_event(run_manager, restart)
            await ahandle_event(*args, **options)

    return restarted


def _run_event(
    run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun, restart: StreamRestart
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of LangChain's ``(a)handle_event`` for the event on the run's handlers."""
    args = (run_manager.handlers, "on_custom_event", "ignore_custom_event")
    options = {
        "run_id": run_manager.run_id,
        "tags": run_manager.tags,
        "metadata": run_manager.metadata,
    }
    return (*args, STREAM_RESTART_EVENT, restart.payload()), options
