"""The stream-restart event: how a fallback chain's restart reaches a stream's callbacks.

LangChain's ``stream``/``astream`` do not hand ``_stream`` its run manager, so the
outermost layer of a stack names the run itself and passes a :class:`RestartSink` down
through the call's keyword arguments (under :data:`SINK_KWARG`, which every layer keeps
out of traced parameters and out of what a provider receives). The
``FallbackChatModel`` below sends :data:`STREAM_RESTART_EVENT` through it.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

from langchain_core.callbacks import AsyncCallbackManager, CallbackManager
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig, ensure_config

__all__ = ["SINK_KWARG", "STREAM_RESTART_EVENT", "RestartSink"]

#: Name of the custom callback event sent when a stream restarts on the next model.
#: Its data is ``{"failed_client": int, "next_client": int, "chunks": int,
#: "error_type": str}``; a consumer should drop what it accumulated so far.
STREAM_RESTART_EVENT = "llm_resilience.stream_restart"


SINK_KWARG = "_llm_resilience_restart_sink"


class RestartSink:
    """Sends the restart event to the callbacks of one stream call, under its run id."""

    __slots__ = ("_config", "_model", "_run_id")

    def __init__(self, model: BaseChatModel, config: RunnableConfig, run_id: UUID) -> None:
        self._model = model
        self._config = config
        self._run_id = run_id

    def __repr__(self) -> str:  # shown nowhere user-facing; keep it free of callbacks
        return "RestartSink()"

    @classmethod
    def attach(
        cls, model: BaseChatModel, config: RunnableConfig | None
    ) -> tuple[RunnableConfig, RestartSink]:
        config = ensure_config(config)
        run_id = config.get("run_id") or uuid4()
        config = {**config, "run_id": run_id}
        return config, cls(model, config, run_id)

    def _configure(self, manager_cls: Any) -> Any:
        config, model = self._config, self._model
        return manager_cls.configure(
            config.get("callbacks"),
            model.callbacks,
            model.verbose,
            config.get("tags"),
            model.tags,
            config.get("metadata"),
            model.metadata,
        )

    def emit(self, data: dict[str, Any]) -> None:
        manager = self._configure(CallbackManager)
        manager.on_custom_event(STREAM_RESTART_EVENT, data, run_id=self._run_id)

    async def aemit(self, data: dict[str, Any]) -> None:
        manager = self._configure(AsyncCallbackManager)
        await manager.on_custom_event(STREAM_RESTART_EVENT, data, run_id=self._run_id)
