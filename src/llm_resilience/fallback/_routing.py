"""Which member may take a request, and where a prompt too long for one member goes next.

Two errors are not transient yet have a right next move, and both depend on what the
chain knows of each member ([`MemberProfile`][]):

* **A prompt too long for a member** (`is_context_overflow`) is sent, unchanged, to
  the next member in the order whose context window is known to be larger than the
  failing member's. The failing member's window is its profile's ``context_window``,
  else the maximum its error states ("maximum context length is 128000 tokens",
  "prompt is too long: 210000 tokens > 200000 maximum"). A member whose window is
  unknown, equal or smaller is skipped; with no larger member the original error
  propagates at once. It never goes back to the member that refused it.
* **A request that needs tools, images or structured output** ([`RequestNeeds`][])
  skips the members known not to support them. A member whose capability is unknown
  is tried as before; when every member is known to lack something the request needs,
  [`NoCapableMemberError`][] says what, before any call.

Examples:
    >>> routing = _Routing([MemberProfile(context_window=128_000), None], size=2)
    >>> routing.eligible([0, 1], RequestNeeds())
    [0, 1]
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

from llm_resilience.checks import OptionTypeError, whole
from llm_resilience.errors import NoCapableMemberError
from llm_resilience.transient import status_code_of

__all__ = [
    "MemberProfile",
    "RequestNeeds",
    "context_limit_of",
    "is_context_overflow",
    "resolve_member_profiles",
]

# Every part of the fallback chain logs as ``llm_resilience.fallback`` (a documented name).
logger = logging.getLogger("llm_resilience.fallback")

#: Largest context window accepted, in tokens: far above any model's, far below overflow.
MAX_CONTEXT_WINDOW = 1_000_000_000

_CAPABILITIES = ("tool_calling", "image_inputs", "structured_output")


@dataclass(frozen=True, slots=True)
class MemberProfile:
    """What a fallback chain knows of one member; None means "unknown" for every field.

    The names follow LangChain's model profiles, which the LangChain adapter reads; a
    field declared here overrides the framework's value for that member.

    Examples:
        >>> MemberProfile(context_window=128_000, image_inputs=False).over(
        ...     MemberProfile(context_window=200_000, image_inputs=True, tool_calling=True)
        ... )  # doctest: +NORMALIZE_WHITESPACE
        MemberProfile(context_window=128000, tool_calling=True, image_inputs=False,
                      structured_output=None, assistant_prefill=None)
    """

    #: Tokens of input the member accepts (an int from 1 to 1e9), or None.
    context_window: int | None = None
    #: Whether the member accepts tools (function calling), or None.
    tool_calling: bool | None = None
    #: Whether the member accepts images in its input, or None.
    image_inputs: bool | None = None
    #: Whether the member supports a native structured-output mode, or None.
    structured_output: bool | None = None
    #: Whether the member accepts a final assistant message as the start of its answer
    #: (an assistant prefill), or None. True lets ``mid_stream="continue"`` send it the
    #: text already delivered; the adapters set it for Anthropic clients.
    assistant_prefill: bool | None = None

    def __post_init__(self) -> None:
        if self.context_window is not None:
            whole(
                "MemberProfile.context_window",
                self.context_window,
                minimum=1,
                maximum=MAX_CONTEXT_WINDOW,
            )
        for name in (*_CAPABILITIES, "assistant_prefill"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise OptionTypeError(
                    f"MemberProfile.{name} must be True, False or None (unknown); got {value!r}"
                )

    def over(self, known: MemberProfile | None) -> MemberProfile:
        """This profile's declared fields, the others taken from ``known``."""
        if known is None:
            return self
        values = {}
        for field in fields(self):
            mine = getattr(self, field.name)
            values[field.name] = mine if mine is not None else getattr(known, field.name)
        return MemberProfile(**values)


@dataclass(frozen=True, slots=True)
class RequestNeeds:
    """What one request carries that not every member supports.

    Examples:
        >>> RequestNeeds(tool_calling=True).names()
        ('tool_calling',)
    """

    #: The request binds tools.
    tool_calling: bool = False
    #: The request's messages hold images.
    image_inputs: bool = False
    #: The request asks for native structured output (a JSON schema response format).
    structured_output: bool = False

    def names(self) -> tuple[str, ...]:
        """The needed capabilities, by their [`MemberProfile`][] field names."""
        return tuple(name for name in _CAPABILITIES if getattr(self, name))

    def lacking(self, profile: MemberProfile | None) -> tuple[str, ...]:
        """The needs ``profile`` is known not to meet (an unknown capability is no bar)."""
        if profile is None:
            return ()
        return tuple(name for name in self.names() if getattr(profile, name) is False)


def resolve_member_profiles(
    declared: Sequence[MemberProfile | None] | None,
    known: Sequence[MemberProfile | None],
    *,
    option: str = "member_profiles",
) -> tuple[MemberProfile | None, ...]:
    """Each member's profile: the fields the user declared, over what its framework knows.

    ``known`` holds one profile (or None) per member, read by an adapter from the
    framework (LangChain's model profile, say); ``declared`` is the user's option, one
    [`MemberProfile`][] or None per member. Raises ``ValueError``/``TypeError`` naming
    ``option`` when ``declared`` has the wrong length or holds something else.

    Examples:
        >>> known = [MemberProfile(context_window=128_000, tool_calling=True), None]
        >>> declared = [MemberProfile(tool_calling=False), MemberProfile(context_window=8_192)]
        >>> [profile.context_window for profile in resolve_member_profiles(declared, known)]
        [128000, 8192]
    """
    checked = _Routing(declared, len(known), option=option).profiles
    return tuple(
        known[index] if mine is None else mine.over(known[index])
        for index, mine in enumerate(checked)
    )


# -- prompt too long ----------------------------------------------------------------

# What the providers, and the frameworks that re-raise their errors, say when a prompt
# exceeds a model's context window: OpenAI's error code and messages (Chat Completions
# and Responses), Anthropic's, and LiteLLM's error name as it reaches an OpenAI client.
_OVERFLOW_PHRASES = (
    "context_length_exceeded",
    "maximum context length",
    "input tokens exceed the configured limit",
    "exceeds the context window",
    "prompt is too long",
    "exceed context limit",
    "contextwindowexceedederror",
    "input is too long",
    # Gemini: "The input token count (N) exceeds the maximum number of tokens allowed (M)."
    "exceeds the maximum number of tokens allowed",
    # Mistral: "Prompt contains N tokens and 0 draft tokens, too large for model with M
    # maximum context length" (the phrase above already matches it).
    # Cohere: "too many tokens: total number of tokens in the prompt cannot exceed M -
    # received N." (its other "too many tokens" errors are about max_tokens, not the prompt)
    "number of tokens in the prompt cannot exceed",
)
# LangChain's own type for it (langchain_core.exceptions.ContextOverflowError), which
# langchain-openai and langchain-anthropic raise; matched by name, never imported.
_OVERFLOW_TYPES = frozenset({("langchain_core", "ContextOverflowError")})
# A prompt too long arrives as a 400 (413 from some gateways); a status other than these
# is some other failure whatever its text says.
_OVERFLOW_STATUSES = frozenset({400, 413})

_LIMIT_PATTERNS = (
    re.compile(r"maximum context length is (\d+)"),
    re.compile(r"configured limit of (\d+)"),
    re.compile(r"tokens? > (\d+) maximum"),
    re.compile(r"exceed context limit: \d+ \+ \d+ > (\d+)"),
    re.compile(r"maximum number of tokens allowed \((\d+)\)"),
    re.compile(r"too large for model with (\d+) maximum context length"),
    re.compile(r"prompt cannot exceed (\d+)"),
)

_MAX_CAUSE_DEPTH = 8


def is_context_overflow(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the prompt is longer than the model's context window.

    True for LangChain's ``ContextOverflowError`` (and the provider subclasses that
    langchain-openai and langchain-anthropic raise), and for a 400 (or 413) whose error
    code or message says so: OpenAI's ``context_length_exceeded``, Anthropic's
    ``prompt is too long: N tokens > M maximum``, Bedrock's ``ValidationException``
    "Input is too long for requested model", Gemini's ``INVALID_ARGUMENT`` "The input
    token count (N) exceeds the maximum number of tokens allowed (M).", Mistral's "Prompt
    contains N tokens and 0 draft tokens, too large for model with M maximum context
    length", Cohere's "too many tokens: total number of tokens in the prompt cannot
    exceed M - received N", along the ``raise ... from`` chain.

    Examples:
        >>> is_context_overflow(ValueError("prompt is too long: 210000 tokens > 200000 maximum"))
        True
        >>> is_context_overflow(ValueError("Invalid request."))
        False
    """
    return any(_says_overflow(error) for error in _chain(exc))


def context_limit_of(exc: BaseException) -> int | None:
    """The context window a prompt-too-long error states, in tokens, or None.

    Examples:
        >>> context_limit_of(ValueError("prompt is too long: 210000 tokens > 200000 maximum"))
        200000
    """
    for error in _chain(exc):
        text = _text(error)
        for pattern in _LIMIT_PATTERNS:
            found = pattern.search(text)
            if found is not None:
                return int(found.group(1))
    return None


def _says_overflow(error: BaseException) -> bool:
    for klass in type(error).__mro__:
        if (klass.__module__.partition(".")[0], klass.__name__) in _OVERFLOW_TYPES:
            return True
    status = status_code_of(error)
    if status is not None and status not in _OVERFLOW_STATUSES:
        return False
    text = _text(error)
    return any(phrase in text for phrase in _OVERFLOW_PHRASES)


def _text(error: BaseException) -> str:
    # The message, plus the SDKs' error code and body, which a message may not repeat.
    parts: list[object] = []
    try:
        parts.append(str(error))
    except Exception:
        pass
    for name in ("code", "body"):
        try:
            value = getattr(error, name, None)
        except Exception:
            value = None
        if isinstance(value, (str, Mapping)):
            parts.append(value)
    return " ".join(str(part) for part in parts).lower()


def _chain(exc: BaseException | None) -> Iterable[BaseException]:
    seen: set[int] = set()
    current = exc
    while current is not None and id(current) not in seen and len(seen) < _MAX_CAUSE_DEPTH:
        seen.add(id(current))
        yield current
        current = current.__cause__


# -- the chain's view ---------------------------------------------------------------


class _Routing:
    """A chain's member profiles, and the two routing rules that read them."""

    __slots__ = ("_no_prefill", "_profiles")

    def __init__(
        self,
        profiles: Sequence[MemberProfile | None] | None,
        size: int,
        option: str = "profiles",
    ) -> None:
        # Members that rejected a prefill: never sent one again by this chain.
        self._no_prefill: set[int] = set()
        if profiles is None:
            self._profiles: tuple[MemberProfile | None, ...] = (None,) * size
            return
        if isinstance(profiles, (str, bytes)) or not isinstance(profiles, Sequence):
            raise OptionTypeError(
                f"{option} must be a list with one MemberProfile (or None) per member; "
                f"got {type(profiles).__name__}"
            )
        if len(profiles) != size:
            raise ValueError(
                f"{option} must hold one MemberProfile (or None) per member ({size}); "
                f"got {len(profiles)}"
            )
        for position, profile in enumerate(profiles):
            if profile is not None and not isinstance(profile, MemberProfile):
                raise OptionTypeError(
                    f"{option}[{position}] must be a MemberProfile or None; got {profile!r}"
                )
        self._profiles = tuple(profiles)

    @property
    def profiles(self) -> tuple[MemberProfile | None, ...]:
        return self._profiles

    def known_lacking(self) -> frozenset[str]:
        """The [`RequestNeeds`][] fields some member is known to lack: a need outside
        them keeps every member in `eligible` (the profiles are fixed once built)."""
        return frozenset(
            name
            for name in _CAPABILITIES
            for profile in self._profiles
            if profile is not None and getattr(profile, name) is False
        )

    def eligible(
        self, order: list[int], needs: RequestNeeds | Sequence[RequestNeeds] | None
    ) -> list[int]:
        """``order`` without the members known to lack what the request needs."""
        if needs is None:
            return order
        per_member = self._per_member(needs)
        missing: dict[int, tuple[str, ...]] = {}
        kept: list[int] = []
        for index in order:
            lacks = per_member[index].lacking(self._profiles[index])
            if lacks:
                missing[index] = lacks
            else:
                kept.append(index)
        if not kept:
            raise NoCapableMemberError(missing)
        for index, lacks in missing.items():
            logger.info("Client %d does not support %s; skipping it.", index, ", ".join(lacks))
        return kept

    def _per_member(self, needs: RequestNeeds | Sequence[RequestNeeds]) -> Sequence[RequestNeeds]:
        if isinstance(needs, RequestNeeds):
            return (needs,) * len(self._profiles)
        if (
            isinstance(needs, Sequence)
            and len(needs) == len(self._profiles)
            and all(isinstance(item, RequestNeeds) for item in needs)
        ):
            return needs
        raise OptionTypeError(
            f"needs must be a RequestNeeds, or one per member ({len(self._profiles)}); "
            f"got {needs!r}"
        )

    def after_overflow(self, order: list[int], position: int, error: BaseException) -> bool:
        """Keep, after ``position``, only the members larger than the one that refused.

        Edits ``order`` in place and says whether a member is left to take the prompt.
        """
        index = order[position]
        profile = self._profiles[index]
        window = profile.context_window if profile is not None else None
        if window is None:
            window = context_limit_of(error)
        if window is None:
            logger.warning(
                "Client %d refused the prompt as too long and its context window is not "
                "known; no member is known to be larger, so the error propagates.",
                index,
            )
            del order[position + 1 :]
            return False
        larger = [
            later
            for later in order[position + 1 :]
            if (limit := self._window(later)) is not None and limit > window
        ]
        order[position + 1 :] = larger
        if not larger:
            logger.warning(
                "Client %d refused the prompt as too long (context window %d tokens); no "
                "later member is known to be larger, so the error propagates.",
                index,
                window,
            )
            return False
        logger.warning(
            "Client %d refused the prompt as too long (context window %d tokens); sending "
            "it to client %d, whose window is %d tokens.",
            index,
            window,
            larger[0],
            self._window(larger[0]),
        )
        return True

    def accepts_prefill(self, index: int) -> bool:
        """Whether member ``index`` is known to take a prefill and never refused one."""
        profile = self._profiles[index]
        return (
            profile is not None
            and profile.assistant_prefill is True
            and index not in self._no_prefill
        )

    def refused_prefill(self, index: int) -> None:
        """Member ``index`` rejected a prefill: treat it as not taking one from now on."""
        if index not in self._no_prefill:
            self._no_prefill.add(index)
            logger.warning(
                "Client %d rejected an assistant prefill; it will get plain restarts from now on.",
                index,
            )

    def _window(self, index: int) -> int | None:
        profile = self._profiles[index]
        return profile.context_window if profile is not None else None
