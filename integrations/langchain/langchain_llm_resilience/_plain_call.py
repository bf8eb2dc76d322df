"""A member's ``_generate_with_cache`` without its per-call probing, when the call is plain.

Every layer calls the model it wraps through that model's ``_generate_with_cache``, so
the model's cache, ``rate_limiter`` and response metadata still apply. For most calls
the method does little: no cache is configured, nothing asks for streaming, and it calls
``_generate`` and stamps the run's message id and the generation's metadata. Yet it
probes all of that on every call, ``inspect.signature(self._generate)`` included (about
a tenth of a call to an instant model; ``docs/benchmarks.md``). `plain_generate` does
what the method does on that path, with the per-class facts computed once, and hands
every call it cannot prove plain to the method itself, so the result is the same object
LangChain would build.

A call is plain when the model has no cache (``cache`` is False, or None with no global
LLM cache set), keeps LangChain's default message format (``output_version`` not
``"v1"``), is not asked to stream (no ``stream=True`` argument, no ``streaming=True``
field set, no streaming callback handler on the run) and its class defines
``_generate``/``_agenerate`` as a plain function.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.globals import get_llm_cache
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.chat_models import _gen_info_and_msg_metadata
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.tracers import _streaming
from langchain_core.utils.utils import LC_ID_PREFIX

__all__ = ["aplain_generate", "plain_generate"]

#: Handlers whose presence makes LangChain stream an ``invoke``: the v1 protocol's, and
#: the v2 protocol's where this langchain-core has it (1.0 does not).
_STREAMING_HANDLERS: tuple[type, ...] = tuple(
    handler
    for handler in (
        getattr(_streaming, "_StreamingCallbackHandler", None),
        getattr(_streaming, "_V2StreamingCallbackHandler", None),
    )
    if handler is not None
)


@functools.cache
def _takes_run_manager(cls: type[BaseChatModel], name: str) -> bool | None:
    """Whether ``cls.<name>`` takes ``run_manager`` (as LangChain asks on every call);
    None when it is not a plain function (a descriptor: leave the call to LangChain)."""
    function = inspect.getattr_static(cls, name, None)
    if not inspect.isfunction(function):
        return None
    return "run_manager" in inspect.signature(function).parameters


def _is_plain(
    model: BaseChatModel,
    run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
    kwargs: dict[str, Any],
) -> bool:
    cache = model.cache
    if cache is not False and (cache is not None or get_llm_cache() is not None):
        return False
    if model.output_version == "v1" or kwargs.get("stream"):
        return False
    if "streaming" in model.model_fields_set and getattr(model, "streaming", None) is True:
        return False
    if run_manager is not None:
        for handler in run_manager.handlers:
            if isinstance(handler, _STREAMING_HANDLERS):
                return False
    return True


def _stamped(
    result: ChatResult,
    run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
) -> ChatResult:
    """The result with the run's message ids and the merged response metadata, as
    ``_generate_with_cache`` leaves it."""
    for index, generation in enumerate(result.generations):
        message = generation.message
        if run_manager is not None and message.id is None:
            message.id = f"{LC_ID_PREFIX}-{run_manager.run_id}-{index}"
        message.response_metadata = _gen_info_and_msg_metadata(generation)
    if len(result.generations) == 1 and result.llm_output is not None:
        message = result.generations[0].message
        message.response_metadata = {**result.llm_output, **message.response_metadata}
    return result


def plain_generate(
    model: BaseChatModel,
    messages: list[BaseMessage],
    stop: list[str] | None,
    run_manager: CallbackManagerForLLMRun | None,
    kwargs: dict[str, Any],
) -> ChatResult:
    """``model._generate_with_cache(messages, stop=stop, run_manager=run_manager,
    **kwargs)``, skipping its probes when the call is plain (see the module)."""
    takes_run_manager = _takes_run_manager(type(model), "_generate")
    if takes_run_manager is None or not _is_plain(model, run_manager, kwargs):
        return model._generate_with_cache(messages, stop=stop, run_manager=run_manager, **kwargs)
    if model.rate_limiter:
        model.rate_limiter.acquire(blocking=True)
    if takes_run_manager:
        result = model._generate(messages, stop=stop, run_manager=run_manager, **kwargs)
    else:
        result = model._generate(messages, stop=stop, **kwargs)
    return _stamped(result, run_manager)


async def aplain_generate(
    model: BaseChatModel,
    messages: list[BaseMessage],
    stop: list[str] | None,
    run_manager: AsyncCallbackManagerForLLMRun | None,
    kwargs: dict[str, Any],
) -> ChatResult:
    """Async `plain_generate` (``_agenerate_with_cache``)."""
    takes_run_manager = _takes_run_manager(type(model), "_agenerate")
    if takes_run_manager is None or not _is_plain(model, run_manager, kwargs):
        return await model._agenerate_with_cache(
            messages, stop=stop, run_manager=run_manager, **kwargs
        )
    if model.rate_limiter:
        await model.rate_limiter.aacquire(blocking=True)
    if takes_run_manager:
        result = await model._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)
    else:
        result = await model._agenerate(messages, stop=stop, **kwargs)
    return _stamped(result, run_manager)
