"""One Lua script's round trip for a store that degrades when Redis is away.

[`RedisCircuitStore`][] and [`RedisRetryBudgetStore`][] decide in one script call each;
both skip Redis while it is failing (`Outage`) and answer None then, so their
callers decide locally. The sync call waits for one of the client's connection slots
(``gate``); the async one for its loop's client and slots, bounded by
``operation_timeout``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from llm_resilience._redis._clients import LoopClients
from llm_resilience._redis._outage import Outage

__all__ = ["arun_script", "run_script"]


def run_script(
    outage: Outage,
    gate: threading.BoundedSemaphore,
    client: Any,
    errors: tuple[type[BaseException], ...],
    no_script: type[BaseException],
    script: tuple[str, str],
    keys: list[str],
    args: list[object],
) -> Any:
    """``script`` (its text and SHA) with ``keys`` and ``args``; None while Redis is
    away (a failure is noted in ``outage``, a success ends it)."""
    text, sha = script
    if outage.skipping():
        return None
    failures_seen = outage.failures
    with gate:
        if outage.skipping(failures_seen):
            return None
        try:
            try:
                raw = client.evalsha(sha, len(keys), *keys, *args)
            except no_script:
                raw = client.eval(text, len(keys), *keys, *args)
        except errors as exc:
            outage.note_failure(exc)
            return None
    outage.note_success()
    return raw


async def arun_script(
    outage: Outage,
    clients: LoopClients,
    operation_timeout: float,
    errors: tuple[type[BaseException], ...],
    no_script: type[BaseException],
    script: tuple[str, str],
    keys: list[str],
    args: list[object],
) -> Any:
    """Async [`run_script`][] on the running loop's client, bounded by ``operation_timeout``."""
    text, sha = script
    if outage.skipping():
        return None
    failures_seen = outage.failures
    try:
        client, gate = await clients.get()
        async with gate:
            if outage.skipping(failures_seen):
                return None
            async with asyncio.timeout(operation_timeout):
                try:
                    raw = await client.evalsha(sha, len(keys), *keys, *args)
                except no_script:
                    raw = await client.eval(text, len(keys), *keys, *args)
    except errors as exc:
        outage.note_failure(exc)
        return None
    outage.note_success()
    return raw
