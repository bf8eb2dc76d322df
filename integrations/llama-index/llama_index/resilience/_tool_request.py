"""A ``chat_with_tools`` call that each member of a ``FallbackLLM`` prepares its own way.

OpenAI and Anthropic tool schemas differ, so ``FallbackLLM._prepare_chat_with_tools``
does not prepare the tools: it returns the messages (for the wrapper's own events) and a
`ToolRequest` under `TOOL_REQUEST_KEY`, and each attempt hands it to its
member's own ``_prepare_chat_with_tools``, with a fresh copy of the chat history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import BaseModel, ConfigDict, field_serializer
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import LLM

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = ["TOOL_REQUEST_KEY", "ToolRequest", "function_calling"]

#: The chat kwarg that carries a tool request from ``_prepare_chat_with_tools`` to the
#: attempts, where each member prepares the tools its own way.
TOOL_REQUEST_KEY = "fallback_tool_request"


class ToolRequest(BaseModel):
    """A ``chat_with_tools`` call, kept whole until a member prepares it its own way.

    It travels in the wrapper's chat kwargs, so it shows in the wrapper's event payloads;
    as a pydantic model it serialises there (tools by name).
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    tools: tuple[Any, ...]
    user_msg: str | ChatMessage | None
    chat_history: tuple[ChatMessage, ...]
    verbose: bool
    allow_parallel_tool_calls: bool
    tool_required: bool
    kwargs: dict[str, Any]

    @field_serializer("tools")
    def _tool_names(self, tools: tuple[BaseTool, ...]) -> list[str | None]:
        return [tool.metadata.name for tool in tools]

    def prepare(self, member: LLM, index: int) -> dict[str, Any]:
        # A fresh history list per member: some integrations append user_msg in place.
        return function_calling(member, index)._prepare_chat_with_tools_compat(
            list(self.tools),
            user_msg=self.user_msg,
            chat_history=list(self.chat_history),
            verbose=self.verbose,
            allow_parallel_tool_calls=self.allow_parallel_tool_calls,
            tool_required=self.tool_required,
            **self.kwargs,
        )

    def __repr__(self) -> str:
        # Shown in event payloads; names and counts only, never message text.
        names = [tool.metadata.name for tool in self.tools]
        return f"ToolRequest(tools={names}, messages={len(self.chat_history)})"

    @classmethod
    def deferred(
        cls,
        tools: Sequence[BaseTool],
        *,
        user_msg: str | ChatMessage | None,
        chat_history: list[ChatMessage] | None,
        verbose: bool,
        allow_parallel_tool_calls: bool,
        tool_required: bool,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """What ``_prepare_chat_with_tools`` returns: the messages, and the request."""
        history = list(chat_history or [])
        message = (
            ChatMessage(role=MessageRole.USER, content=user_msg)
            if isinstance(user_msg, str)
            else user_msg
        )
        request = cls(
            tools=tuple(tools),
            user_msg=user_msg,
            chat_history=tuple(history),
            verbose=verbose,
            allow_parallel_tool_calls=allow_parallel_tool_calls,
            tool_required=tool_required,
            kwargs=kwargs,
        )
        return {
            "messages": [*history, message] if message is not None else history,
            TOOL_REQUEST_KEY: request,
        }


def function_calling(member: LLM, index: int) -> FunctionCallingLLM:
    """``member`` (``llms[index]``) as the ``FunctionCallingLLM`` a tool call needs.

    Raises ``TypeError`` naming ``llms[index]`` when it is not one.
    """
    if not isinstance(member, FunctionCallingLLM):
        raise TypeError(
            f"llms[{index}] ({type(member).__name__}) is not a FunctionCallingLLM and "
            "cannot take tools"
        )
    return member
