"""``mid_stream="continue"``: the next member carries on from the text already delivered.

A stream that fails after it delivered text leaves the consumer holding a prefix. Under
``"continue"`` the next member whose profile says it accepts an assistant prefill
(`assistant_prefill`) is sent the same
request with that prefix as a final assistant message, and streams only the rest: a
plain consumer's concatenation is one coherent answer. The rules, kept here once:

* only text continues: a stream that had delivered non-text content (a tool call) or
  only whitespace restarts instead, with the event, as does a next member whose
  prefill support is unknown or False;
* Anthropic refuses a final assistant message that ends in whitespace, so the prefill
  is the delivered text with its trailing whitespace removed, and the whitespace the
  consumer already holds is dropped from the start of the continuation when the member
  sends it again (``"Hello, "`` + ``"world"``, never ``"Hello,  world"``);
* a member that rejects the prefill (`is_prefill_rejection`: a 400 saying the
  model does not take one) has answered and is healthy: it gets the request once more,
  as a plain restart (the ``on_restart`` hooks are told, ``continued=False``), and is
  not sent a prefill again by this chain. Its rejection never becomes the caller's
  error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from llm_resilience.fallback._routing import _chain, _text
from llm_resilience.transient import status_code_of

__all__ = ["is_prefill_rejection"]

ChunkT = TypeVar("ChunkT")
ClientT = TypeVar("ClientT")
ResultT = TypeVar("ResultT")

# What a provider says when a model does not take an assistant prefill: Anthropic's
# message for the models without prefill support, and the wording of OpenAI-compatible
# gateways that require the conversation to end with a user turn.
_REJECTION_PHRASES = (
    "does not support assistant message prefill",
    "assistant message prefill",
    "conversation must end with a user message",
    "final message must be a user message",
    "last message must be a user message",
    "must end with a user message",
)
_REJECTION_STATUSES = frozenset({400, 422})


def is_prefill_rejection(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a member refusing a final assistant message (a prefill).

    True for a 400 (or 422) whose message says the model does not support an assistant
    prefill or that the conversation must end with a user message, along the
    ``raise ... from`` chain.

    Examples:
        >>> is_prefill_rejection(ValueError(
        ...     "This model does not support assistant message prefill. "
        ...     "The conversation must end with a user message."))
        True
        >>> is_prefill_rejection(ValueError("Invalid request."))
        False
    """
    for error in _chain(exc):
        status = status_code_of(error)
        if status is not None and status not in _REJECTION_STATUSES:
            continue
        text = _text(error)
        if any(phrase in text for phrase in _REJECTION_PHRASES):
            return True
    return False


def split_prefill(delivered: str) -> tuple[str, str]:
    """``delivered`` as (the prefill to send, the trailing whitespace the consumer holds).

    Examples:
        >>> split_prefill("Paris is ")
        ('Paris is', ' ')
    """
    prefill = delivered.rstrip()
    return prefill, delivered[len(prefill) :]


class _Delivered:
    """What the consumer holds of the answer since it last started from the beginning."""

    __slots__ = ("_parts", "chunks", "keeps_text", "textual")

    def __init__(self, *, keeps_text: bool = True) -> None:
        #: Content chunks held (what a restart asks the consumer to discard).
        self.chunks = 0
        #: Whether every content chunk so far carried text (only text can continue).
        self.textual = True
        #: Whether chunks are added one by one with their text; when not (a restart
        #: reads only the count), the stream loop counts them and `settle` records it.
        self.keeps_text = keeps_text
        self._parts: list[str] = []

    def add(self, text: str | None) -> None:
        """One content chunk, with its text (None: its text is not known)."""
        self.chunks += 1
        if not text:
            self.textual = False
        else:
            self._parts.append(text)

    def settle(self, content: int) -> None:
        """The attempt that failed delivered ``content`` chunks; recorded here when they
        were not added one by one."""
        if not self.keeps_text:
            self.chunks = content
            self.textual = not content

    def text(self) -> str:
        return "".join(self._parts)

    def clear(self) -> None:
        self.chunks = 0
        self.textual = True
        self._parts.clear()

    def prefill(self) -> str | None:
        """The prefill a continuation would send, or None when the answer cannot continue."""
        if not self.chunks or not self.textual:
            return None
        prefill, _ = split_prefill(self.text())
        return prefill or None


class _HeldWhitespace(Generic[ChunkT]):
    """Drops, from a continuation's first text, the whitespace the consumer already holds."""

    __slots__ = ("_drop_text", "_held", "_text_of")

    def __init__(
        self,
        held: str,
        text_of: Callable[[ChunkT], str],
        drop_text: Callable[[ChunkT, int], ChunkT] | None,
    ) -> None:
        self._held = held if drop_text is not None else ""
        self._text_of = text_of
        self._drop_text = drop_text

    def __call__(self, chunk: ChunkT) -> ChunkT:
        if not self._held:
            return chunk
        text = self._text_of(chunk)
        if not text:
            return chunk
        same = 0
        while same < min(len(text), len(self._held)) and text[same] == self._held[same]:
            same += 1
        # Whitespace the member sends again is dropped; anything else ends the check.
        self._held = self._held[same:] if same == len(text) else ""
        if not same:
            return chunk
        assert self._drop_text is not None
        return self._drop_text(chunk, same)


def prefilled_attempt(
    attempt: Callable[[int, ClientT, str], ResultT], prefill: str
) -> Callable[[int, ClientT], ResultT]:
    """``attempt`` with the prefill bound: the shape the chain's sources call."""

    def bound(index: int, client: ClientT) -> ResultT:
        return attempt(index, client, prefill)

    return bound
