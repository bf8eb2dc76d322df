"""The fallback engine: try clients in order, move on at once when one fails transiently.

The engine knows nothing about LangChain or LlamaIndex. It is handed the clients and,
per call, an *attempt*: a function of ``(index, client)`` that performs the request
against one client (returning a result, an awaitable, an iterable of chunks or an
async iterable of chunks). The adapters supply the attempt; every rule lives here.

Examples:
    >>> chain = FallbackChain(["primary", "secondary"], per_client_timeout=30)
    >>> chain.invoke(lambda index, client: f"answered by {client}")
    'answered by primary'

Rules, in short (``docs/fallback.md`` has the long form):

* each client is tried once, in order; a transient failure (see
  `llm_resilience.transient`) moves on at once, with no delay; anything else
  propagates at once; when every client failed, the last client's own exception object
  is raised;
* ``per_client_timeout`` bounds each attempt, ``first_token_timeout`` the wait for a
  stream's first content (a call's whole response) and ``idle_timeout`` each silence
  once a stream's content started; all count only waits on the client, never time the
  consumer holds a chunk. When one fires the attempt counts as transient; if it was the
  last client the caller gets [`PerClientTimeoutError`][] (a
  ``TimeoutError`` naming the limit). The caller's own cancellation is never rerouted;
* a stream that fails after yielding chunks is restarted from the beginning on the next
  client; chunks already yielded stay yielded and ``on_restart`` hooks are told. With
  ``mid_stream="continue"`` a next client that accepts an assistant prefill
  (``MemberProfile.assistant_prefill``) carries on from the text delivered instead
  (see `_continuation`); with ``mid_stream="raise"`` a
  stream that fails after content raises
  [`StreamInterruptedError`][] (carrying what was delivered);
* with ``hedge_after``, a client that has produced no content within it is joined by
  the next client on the same request; the first to produce content wins and the other
  is cancelled (a sync call's loser runs to its end on its worker, its result discarded);
* an optional [`Cooldown`][] skips, for a while, a client that keeps failing, then
  gives it one trial call before using it again; when every client that can take a
  request is cooling down, the one of them back soonest is tried anyway.
  [`FallbackChain.health`][] reads each client's circuit (`MemberHealth`), which
  [`FallbackChain.variant`][] (the chain bound to tools or an output format) shares.
  With ``Cooldown(shared=RedisCircuitStore(...))`` the circuits are the fleet's: every
  worker counts, opens, probes and closes a member together (`_shared_breaker`).

The package holds one job per module: ``_options`` (``Cooldown``, ``StreamRestart``),
``_breaker`` (the cooldown breaker), ``_shared_breaker``, ``_circuit_store`` and
``_circuit_script`` (the breaker shared by a fleet through [`RedisCircuitStore`][]: its
decisions, the store's round trips, the Lua script), ``_capabilities`` (what a member,
and so the chain, can do: `member_profile`, `merge_capabilities`), ``_attributes`` (a chain's
unknown attributes read from its first member: `read_from_primary`), ``_routing``
(``MemberProfile``, ``RequestNeeds``: which member may take a request, where a prompt
too long goes), ``_continuation``
(``mid_stream="continue"``: prefill, whitespace, a rejected prefill), ``_engine``
(``FallbackChain``), ``_deadlines`` (the time limits of one attempt), ``_sources`` and
``_workers`` (sync attempts under a deadline, on reused threads), ``_member_retry``
(``member_retry=``: short waits on the same member), ``_hedge`` and ``_hedge_stream``
(``hedge_after=``: a slow first token also starts the request on the next member) and
``_hedge_inbox`` (how a loser's reported usage reaches the cost layer, which
[`Meter`][llm_resilience.metering.Meter] opens). Import from ``llm_resilience.fallback``.
What retries by itself (a member that would delay failover) is
[`llm_resilience.self_retry`][]'s, shared with the retry wrappers.
"""

from llm_resilience.fallback._attributes import read_from_primary
from llm_resilience.fallback._breaker import MemberHealth
from llm_resilience.fallback._capabilities import (
    content_without_cache_control,
    is_server_tool,
    member_profile,
    merge_capabilities,
    of_classes,
    same_provider,
    without_cache_control,
)
from llm_resilience.fallback._circuit_store import RedisCircuitStore
from llm_resilience.fallback._continuation import is_prefill_rejection
from llm_resilience.fallback._engine import FallbackChain
from llm_resilience.fallback._hedge import LoserUsage
from llm_resilience.fallback._options import Classifier as Classifier
from llm_resilience.fallback._options import Cooldown, StreamRestart
from llm_resilience.fallback._options import RestartHook as RestartHook
from llm_resilience.fallback._routing import (
    MemberProfile,
    RequestNeeds,
    context_limit_of,
    is_context_overflow,
)

__all__ = [
    "Cooldown",
    "FallbackChain",
    "LoserUsage",
    "MemberProfile",
    "MemberHealth",
    "RedisCircuitStore",
    "RequestNeeds",
    "StreamRestart",
    "content_without_cache_control",
    "context_limit_of",
    "is_context_overflow",
    "is_prefill_rejection",
    "is_server_tool",
    "member_profile",
    "merge_capabilities",
    "of_classes",
    "read_from_primary",
    "same_provider",
    "without_cache_control",
]
