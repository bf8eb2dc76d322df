"""A healthy sixty-second answer through a fallback chain with the recommended limits.

Run as a program by ``test_time_limits.py``: the conftest starts it when the suite's
collection ends, so its minute of mostly sleeping runs beside the rest of the suite, and
the test reads the JSON it prints. Real ``ChatOpenAI`` members against two local
fault-injecting servers; the primary sends one token every 2 s for 60 s.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI

from langchain_llm_resilience import STREAM_RESTART_EVENT, FallbackChatModel
from llm_resilience.testing import Fault, FaultInjectingServer

TICKS = 30
TICK_SECONDS = 2.0
#: The limits docs/fallback.md recommends scaled to this stream: neither may cut it.
FIRST_TOKEN_TIMEOUT = 5.0
IDLE_TIMEOUT = 5.0


class _Restarts(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == STREAM_RESTART_EVENT:
            self.events.append(data)


async def _run() -> dict[str, Any]:
    reply = " ".join(f"t{tick}" for tick in range(TICKS))
    with (
        FaultInjectingServer(reply=reply, default_fault=Fault.slow(TICK_SECONDS)) as primary,
        FaultInjectingServer(reply="the secondary answered") as secondary,
    ):
        members: list[BaseChatModel] = [
            ChatOpenAI(
                model=name,
                base_url=server.openai_base_url,
                api_key="test",  # type: ignore[arg-type]
                max_retries=0,
                timeout=120,
            )
            for name, server in (("gpt-4o-mini", primary), ("gpt-4.1-mini", secondary))
        ]
        model = FallbackChatModel(
            models=members, first_token_timeout=FIRST_TOKEN_TIMEOUT, idle_timeout=IDLE_TIMEOUT
        )
        restarts = _Restarts()
        began = time.monotonic()
        text = "".join(
            [
                str(chunk.content)
                async for chunk in model.astream("Count.", {"callbacks": [restarts]})
            ]
        )
        return {
            "seconds": time.monotonic() - began,
            "whole": text == reply,
            "restarts": len(restarts.events),
            "secondary_requests": len(secondary.requests),
        }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_run())))
