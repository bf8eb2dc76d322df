"""What retries by itself: the models and SDK clients that retry on their own, and the
one warning each such object gets.

A model that retries by itself delays every failover of a fallback chain by its whole
retry schedule, and multiplies the calls a ``Retrying*`` wrapper makes. Both layers ask
here: [`self_retry_setting`][] reads the setting, [`warn_if_self_retrying`][] (the
fallback chain) and [`warn_of_multiplied_retries`][] (the retry wrappers) warn once per
object, through one registry, so an object is warned about once whichever layer saw it.

Examples:
    >>> class Model:
    ...     max_retries = 2
    >>> self_retry_setting(Model())
    ('max_retries', 2)
"""

from __future__ import annotations

import logging
from typing import Protocol

from llm_resilience._warned import WarnedOnce
from llm_resilience.layers import layers_below, leaves

__all__ = ["self_retry_setting", "warn_if_self_retrying", "warn_of_multiplied_retries"]

# Each warning logs under the layer that noticed it (both names are documented).
_FALLBACK_LOGGER = logging.getLogger("llm_resilience.fallback")
_RETRY_LOGGER = logging.getLogger("llm_resilience.retry")


_CLIENT_ATTRIBUTES = ("root_client", "client", "_client", "root_async_client", "async_client")


#: Objects already warned about, by either layer: each is warned about once.
_warned = WarnedOnce()

# Attempts in all by botocore's retry modes when no count is configured.
_BOTOCORE_DEFAULT_ATTEMPTS = {"legacy": 5, "standard": 3, "adaptive": 3}
_BOTOCORE_SETTING = "retries.total_max_attempts"


def _botocore_retries(model: object) -> int | None:
    """Retries (attempts after the first) of a boto3/botocore client, else None.

    A botocore client keeps its effective retry settings in ``meta.config.retries``:
    ``total_max_attempts`` (``Config(retries={"max_attempts": N})`` is stored as
    ``N + 1`` there), else its ``mode``'s default: 3 attempts in ``standard`` and
    ``adaptive``, 5 in ``legacy``.
    """
    if not any(k.__module__.partition(".")[0] == "botocore" for k in type(model).__mro__):
        return None
    try:
        retries = model.meta.config.retries  # type: ignore[attr-defined]
    except Exception:
        return None
    if not isinstance(retries, dict):
        return None
    total = retries.get("total_max_attempts")
    if not isinstance(total, int) or isinstance(total, bool):
        total = _BOTOCORE_DEFAULT_ATTEMPTS.get(str(retries.get("mode") or "standard"))
    return None if total is None else max(0, total - 1)


_GENAI_DEFAULT_ATTEMPTS = 5  # google-genai's attempts when HttpRetryOptions gives none
_GENAI_SETTING = "http_options.retry_options.attempts"


# The LangChain packages whose ``max_retries`` counts attempts in all (1: no retry).
_ATTEMPTS_IN_ALL = frozenset({"langchain_google_genai", "langchain_mistralai"})


def _top_package(model: object) -> str:
    return type(model).__module__.partition(".")[0]


def _genai_attempts(model: object) -> int | None:
    """Attempts in all of a google-genai ``Client``/``AsyncClient``, else None.

    The client retries only when its ``HttpOptions`` carry ``retry_options``: then
    ``attempts`` in all (0 counts as 1, unset as google-genai's default of 5). With no
    ``retry_options`` it makes one attempt.
    """
    klass = type(model)
    if klass.__module__ != "google.genai.client" or klass.__name__ not in (
        "Client",
        "AsyncClient",
    ):
        return None
    try:
        options = model._api_client._http_options.retry_options  # type: ignore[attr-defined]
    except Exception:
        return None
    if options is None:
        return 1
    attempts = getattr(options, "attempts", None)
    if not isinstance(attempts, int) or isinstance(attempts, bool):
        return _GENAI_DEFAULT_ATTEMPTS
    return max(1, attempts)


_MISTRAL_SETTING = "retry_config.backoff.max_elapsed_time"
_LLAMA_MISTRAL_SETTING = "additional_kwargs.retries.backoff.max_elapsed_time"


def _mistral_backoff_ms(config: object) -> int:
    """The retry budget (ms) of a mistralai ``RetryConfig``: 0 unless its strategy is
    ``"backoff"``. The SDK retries (on 429, 500, 502, 503, 504) until that much time has
    passed, so the budget, not a count, is its setting."""
    if getattr(config, "strategy", None) != "backoff":
        return 0
    budget = getattr(getattr(config, "backoff", None), "max_elapsed_time", None)
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else 0


def _is_mistral(model: object) -> bool:
    """The ``mistralai`` client, or LlamaIndex's ``MistralAI`` over it."""
    klass = type(model)
    return (
        klass.__module__.startswith("mistralai.") and klass.__name__ == "Mistral"
    ) or klass.__module__.startswith("llama_index.llms.mistralai")


def _mistral_retries(model: object) -> tuple[str, int] | None:
    """A Mistral model's (`_is_mistral`) retry setting as ``(name, milliseconds)``,
    or None when it makes one attempt.

    The ``mistralai`` client (``Mistral``) retries only with a ``RetryConfig``
    (``retry_config=``; one attempt by default). LlamaIndex's ``MistralAI`` passes its
    ``max_retries`` to every call as ``retries=``, which overrides the client's config
    and turns retrying on only when it is a ``RetryConfig``: an int means one attempt,
    unless ``additional_kwargs["retries"]`` holds a ``RetryConfig``.
    """
    klass = type(model)
    if klass.__module__.startswith("mistralai.") and klass.__name__ == "Mistral":
        try:
            config = model.sdk_configuration.retry_config  # type: ignore[attr-defined]
        except Exception:
            return None
        budget = _mistral_backoff_ms(config)
        return (_MISTRAL_SETTING, budget) if budget > 0 else None
    if klass.__module__.startswith("llama_index.llms.mistralai"):
        extra = getattr(model, "additional_kwargs", None)
        config = extra.get("retries") if isinstance(extra, dict) else None
        budget = _mistral_backoff_ms(config)
        return (_LLAMA_MISTRAL_SETTING, budget) if budget > 0 else None
    return None


_HTTPX_SETTING = "transport.retries"
# Where ChatOllama and LlamaIndex's Ollama keep their async ollama client, which can be
# built with a transport of its own (``async_client_kwargs``).
_OLLAMA_ASYNC_CLIENT = "_async_client"


def _httpx_transport_retries(client: object) -> int | None:
    """The connect retries of an httpx client's transport (``HTTPTransport(retries=N)``),
    else None. httpx retries only a connection that failed to open (refused, DNS, connect
    timeout), never a status; the ``ollama`` SDK, which has no retries of its own, hands
    its keyword arguments (``transport=...``) to the httpx client it builds."""
    if not any(
        k.__module__.partition(".")[0] == "httpx" and k.__name__ in ("Client", "AsyncClient")
        for k in type(client).__mro__
    ):
        return None
    pool = _client_of(_client_of(client, "_transport"), "_pool")
    retries = _client_of(pool, "_retries")
    return retries if isinstance(retries, int) and not isinstance(retries, bool) else None


def _ollama_retries(model: object) -> tuple[str, int] | None:
    """An ``ollama.Client``/``AsyncClient``'s retries: its httpx transport's, if any."""
    retries = _httpx_transport_retries(_client_of(model, "_client"))
    return (f"_client.{_HTTPX_SETTING}", retries) if retries else None


# The cohere SDK (Fern-generated) retries each call by itself (streams never) on 408, 409,
# 429 and 5xx: twice unless that call's ``request_options`` say ``max_retries``. Its
# clients have no setting for it, so a client is reported with that per-call default.
_COHERE_DEFAULT_RETRIES = 2
_COHERE_SETTING = "request_options.max_retries"


def _is_cohere_client(model: object) -> bool:
    return any(
        klass.__module__ == "cohere.base_client"
        and klass.__name__ in ("BaseCohere", "AsyncBaseCohere")
        for klass in type(model).__mro__
    )


def _is_llama_cohere(model: object) -> bool:
    """LlamaIndex's ``Cohere``, whose ``max_retries`` counts its own attempts."""
    return type(model).__module__.startswith("llama_index.llms.cohere")


def _cohere_retries(model: object) -> tuple[str, int] | None:
    """How a cohere client, or a model calling through one, retries: ``(setting,
    retries)``, retries 0 when it does not; None for anything else.

    A bare client (``ClientV2``, ``AsyncClientV2``, v1's ``Client``) retries each call
    twice. LlamaIndex's ``Cohere`` retries in a loop of its own (``max_retries``
    attempts in all, 1: none) around calls its client retries unless its
    ``additional_kwargs`` carry ``request_options`` with ``max_retries``; any other model
    over a cohere client (LangChain's ``ChatCohere``: ``client``) sends no request
    options, so its client's default holds.
    """
    if _is_cohere_client(model):
        return (_COHERE_SETTING, _COHERE_DEFAULT_RETRIES)
    if _is_llama_cohere(model):
        own = getattr(model, "max_retries", None)
        if isinstance(own, int) and not isinstance(own, bool) and own > 1:
            return ("max_retries", own)
        extra = getattr(model, "additional_kwargs", None)
        options = extra.get("request_options") if isinstance(extra, dict) else None
        per_call = options.get("max_retries") if isinstance(options, dict) else None
        if not isinstance(per_call, int) or isinstance(per_call, bool):
            per_call = _COHERE_DEFAULT_RETRIES
        return (f"additional_kwargs.{_COHERE_SETTING}", max(0, per_call))
    for attribute in _CLIENT_ATTRIBUTES:
        if _is_cohere_client(_client_of(model, attribute)):
            return (f"{attribute}.{_COHERE_SETTING}", _COHERE_DEFAULT_RETRIES)
    return None


def self_retry_setting(model: object) -> tuple[str, int] | None:
    """The setting through which ``model`` retries on its own, as ``(name, retries)``.

    Looks at the model's ``max_retries`` and, when that is unset, at the
    ``max_retries`` of the SDK client it holds (``ChatOpenAI(max_retries=None)`` leaves
    the openai client's default of 2 in force). Returns None when no retrying is found,
    and for a wrapper of ours (a layer with layers below it): it retries only through
    what it wraps, which is checked on its own (a chain would otherwise answer with
    its primary's ``max_retries``, which it forwards). A boto3 client (Bedrock) retries
    through ``meta.config.retries``: ``("retries.total_max_attempts", attempts)`` when it
    makes more than one attempt; a model over one (``ChatBedrockConverse``'s ``client``,
    LlamaIndex ``BedrockConverse``'s ``_client``) through its client's:
    ``("client.retries.total_max_attempts", attempts)``. LlamaIndex's ``BedrockConverse``
    also retries in a loop of its own, ``max_retries`` attempts in all (1: no retry).
    A google-genai client retries through its
    ``HttpOptions.retry_options``: ``("http_options.retry_options.attempts", attempts)``;
    ``ChatGoogleGenerativeAI``'s ``max_retries`` counts attempts in all (1: no retry),
    and so does ``ChatMistralAI``'s (its tenacity loop, on transport errors). A
    ``mistralai`` client retries through its ``RetryConfig`` for a time budget:
    ``("retry_config.backoff.max_elapsed_time", milliseconds)``; LlamaIndex's
    ``MistralAI`` only through a ``RetryConfig`` in ``additional_kwargs["retries"]``
    (its ``max_retries`` reaches the SDK as ``retries=<int>``, which retries nothing).
    An ``ollama`` client has no retries of its own: only its httpx transport's connect
    retries count, ``("_client.transport.retries", N)``; a model over one (``ChatOllama``,
    LlamaIndex's ``Ollama``) through its client's, the attribute named first.
    A cohere client retries each call twice unless the call's ``request_options`` say
    otherwise, which no client setting can: ``("request_options.max_retries", 2)``, and
    ``("client.request_options.max_retries", 2)`` for LangChain's ``ChatCohere``;
    LlamaIndex's ``Cohere`` reports its own loop's ``max_retries`` (attempts in all),
    else ``additional_kwargs.request_options.max_retries`` (2 when unset).
    """
    if layers_below(model):
        return None
    if _top_package(model) == "ollama":
        return _ollama_retries(model)
    botocore_retries = _botocore_retries(model)
    if botocore_retries is not None:
        # Reported as the attempts in all, the setting's own unit.
        return (_BOTOCORE_SETTING, botocore_retries + 1) if botocore_retries > 0 else None
    genai_attempts = _genai_attempts(model)
    if genai_attempts is not None:
        return (_GENAI_SETTING, genai_attempts) if genai_attempts > 1 else None
    if _is_mistral(model):
        return _mistral_retries(model)
    cohere = _cohere_retries(model)
    if cohere is not None:
        return cohere if cohere[1] > 0 else None
    own = getattr(model, "max_retries", None)
    if _top_package(model) in _ATTEMPTS_IN_ALL and isinstance(own, int):
        # Attempts in all: passed on as google-genai's HttpRetryOptions(attempts=...),
        # where 0 counts as 1; ChatMistralAI's tenacity stop_after_attempt alike.
        return ("max_retries", own) if own > 1 else None
    counted = own if isinstance(own, int) and not isinstance(own, bool) else None
    if _is_llama_bedrock(model):
        # The attempts of its own retry loop: 1 is no retry (and its least).
        if counted is not None and counted > 1:
            return ("max_retries", counted)
    elif counted is not None and counted > 0:
        return ("max_retries", counted)
    for attribute in _CLIENT_ATTRIBUTES:
        # A model over a boto3 client (langchain-aws, LlamaIndex's Bedrock classes)
        # retries through the client's own retry config, whatever it was built with.
        retries = _botocore_retries(_client_of(model, attribute))
        if retries is not None:
            return (f"{attribute}.{_BOTOCORE_SETTING}", retries + 1) if retries > 0 else None
    if counted is not None:
        return None
    for attribute in (*_CLIENT_ATTRIBUTES, _OLLAMA_ASYNC_CLIENT):
        client = _client_of(model, attribute)
        if client is not None and _top_package(client) == "ollama":
            found = _ollama_retries(client)
            if found is not None:
                return (f"{attribute}.{found[0]}", found[1])
            continue
        if attribute == _OLLAMA_ASYNC_CLIENT:
            continue
        retries = getattr(client, "max_retries", None) if client is not None else None
        if isinstance(retries, int) and not isinstance(retries, bool) and retries > 0:
            return (f"{attribute}.max_retries", retries)
    return None


def _client_of(model: object, attribute: str) -> object:
    try:
        return getattr(model, attribute, None)
    except Exception:
        return None


def _is_llama_bedrock(model: object) -> bool:
    """LlamaIndex's ``BedrockConverse``, whose ``max_retries`` counts its own attempts."""
    return type(model).__module__.startswith("llama_index.llms.bedrock_converse")


def warn_if_self_retrying(model: object, *, position: int, role: str = "fallback chain") -> None:
    """Warn once per model object that its own retries delay failover: ``model``
    itself, or the providers at the bottom of it when it is a wrapper (a rate-limited
    member, a nested chain). Logged on ``llm_resilience.fallback``."""
    for leaf in leaves(model):
        setting = self_retry_setting(leaf)
        if setting is None or not _warned.first(leaf):
            continue
        name, retries = setting
        label = getattr(leaf, "model_name", None) or getattr(leaf, "model", None) or ""
        described = f"{type(leaf).__name__}({label})" if label else type(leaf).__name__
        _FALLBACK_LOGGER.warning(
            "Client %d of the %s, %s, retries by itself (%s=%d): each failure waits out its "
            "whole retry schedule before failover. %s",
            position,
            role,
            described,
            name,
            retries,
            _advice(leaf, name),
        )


class _Attempts(Protocol):
    """What the retry warning reads of a policy ([`RetryPolicy`][])."""

    @property
    def max_attempts(self) -> int | None: ...


def warn_of_multiplied_retries(wrapped: object, policy: _Attempts, *, wrapper: str) -> None:
    """Warn once per object when something under ``wrapper`` retries by itself, naming
    the worst-case number of provider calls one call may make. Logged on
    ``llm_resilience.retry``.

    Looks at ``wrapped``, at every layer below it (``inner``, a chain's members) and at
    the embeddings model a vector store holds, for a ``max_retries`` of their own or of
    the SDK client they hold. With a policy of 4 attempts around a client with
    ``max_retries=2``, one failing call reaches the provider up to 4 x (1 + 2) = 12 times.
    """
    for candidate in _stack(wrapped):
        setting = self_retry_setting(candidate)
        if setting is None or not _warned.first(candidate):
            continue
        name, retries = setting
        attempts = policy.max_attempts
        calls = _calls_per_attempt(candidate, name, retries)
        if calls is None:
            tries = "the custom retry configuration's" if attempts is None else str(attempts)
            worst = f"{tries} attempts, each retried for up to {retries} ms"
        elif attempts is None:
            worst = f"{calls} times per attempt of the custom retry configuration"
        elif calls == 1 + retries:
            worst = f"{attempts} x (1 + {retries}) = {attempts * calls} times"
        else:
            worst = f"{attempts} x {calls} = {attempts * calls} times"
        where = "" if candidate is wrapped else f" (under the wrapped {type(wrapped).__name__})"
        _RETRY_LOGGER.warning(
            "%s wraps %s%s, which retries by itself (%s=%d): one failing call may reach "
            "the provider up to %s. %s",
            wrapper,
            type(candidate).__name__,
            where,
            name,
            retries,
            worst,
            _advice(candidate, name),
        )


_HELD_MODELS = ("embeddings", "embedding", "embed_model")
_MAX_STACK = 64


def _stack(top: object) -> list[object]:
    """``top``, the layers below it and the embeddings models they hold, each once."""
    found: list[object] = []
    pending: list[object] = [top]
    seen: set[int] = set()
    while pending and len(found) < _MAX_STACK:
        current = pending.pop(0)
        if id(current) in seen or isinstance(current, (str, bytes, int, float)):
            continue
        seen.add(id(current))
        found.append(current)
        below = list(layers_below(current))
        for attribute in _HELD_MODELS:
            try:
                held = getattr(current, attribute, None)
            except Exception:
                continue
            if held is not None:
                below.append(held)
        pending[0:0] = below
    return found


def _calls_per_attempt(model: object, name: str, value: int) -> int | None:
    """How many provider calls one call to ``model`` may make, given its setting ``name``
    of ``value`` ([`self_retry_setting`][]): ``1 + retries`` for a retry count, the
    value itself for a count of attempts in all, None for Mistral's time budget (ms)."""
    if name in (_MISTRAL_SETTING, _LLAMA_MISTRAL_SETTING):
        return None
    attempts_in_all = (
        name.endswith(_BOTOCORE_SETTING)
        or name == _GENAI_SETTING
        or (
            name == "max_retries"
            and (
                _top_package(model) in _ATTEMPTS_IN_ALL
                or _is_llama_bedrock(model)
                or _is_llama_cohere(model)
            )
        )
    )
    return value if attempts_in_all else 1 + value


def _advice(model: object, name: str) -> str:
    """How to build ``model`` so it makes one attempt, for its setting ``name``."""
    if name == _BOTOCORE_SETTING:
        return 'Build it with Config(retries={"total_max_attempts": 1}).'
    if _is_llama_bedrock(model):
        return (
            "Build it with max_retries=1 (its own attempts) and botocore_config="
            'Config(retries={"total_max_attempts": 1}) (its client\'s).'
        )
    if name.endswith(_BOTOCORE_SETTING):
        return 'Build its boto3 client with Config(retries={"total_max_attempts": 1}).'
    if name == _GENAI_SETTING:
        return "Build it with HttpOptions(retry_options=HttpRetryOptions(attempts=1))."
    if name.endswith(_HTTPX_SETTING):
        return "Build its httpx transport with retries=0 (httpx.HTTPTransport(retries=0))."
    if _top_package(model) in _ATTEMPTS_IN_ALL:
        return "Build it with max_retries=1 (its attempts in all)."
    if name in (_MISTRAL_SETTING, _LLAMA_MISTRAL_SETTING):
        return "Build it without a backoff RetryConfig (the SDK then makes one attempt)."
    if _is_llama_cohere(model):
        return (
            "Build it with max_retries=1 (its own attempts) and additional_kwargs="
            '{"request_options": {"max_retries": 0}} (its client\'s).'
        )
    if name.endswith(_COHERE_SETTING):
        return (
            'Pass request_options={"max_retries": 0} with each call: the cohere client '
            "has no setting for it."
        )
    return "Build it with max_retries=0."
