"""How a call's tokens and cost are counted: one set of rules for every adapter.

Adapters turn their framework's messages into ``(role, text)`` pairs and their
response metadata into two optional integers; everything else is decided here.

Examples:
    >>> usage = chat_usage(12, 30, prompt=[("user", "Hi")], response_text="Hello!")
    >>> usage
    Usage(input_tokens=12, output_tokens=30, estimated=False)

* Chat: the provider's counts when it reports both; otherwise both sides are
  estimated with tiktoken ``cl100k_base`` (over the request messages and the response
  text) and the usage is flagged ``estimated``. A reported input of 0 for a non-empty
  prompt is not a report: some integrations fill a missing count with 0.
* A stream its consumer closed or cancelled before its end (`partial_stream_usage`):
  what it consumed, as reported so far or estimated over the prompt and the delivered
  text; nothing when no chunk was delivered.
* Embeddings: always estimated over the input texts; output is 0.
* Counts as providers send them (`token_count`): an int >= 0, never a bool; a
  whole float only where an SDK declares its counts floats (Cohere's billed units).
* Steps a provider bills apart from its top-level counts (`billed_apart`):
  Anthropic's server-side compaction, whose summarising step is an entry of
  ``usage.iterations``; adapters hand the provider's raw usage to
  `with_billed_apart`, which adds them to the reported counts. An answer that
  shows a compaction's summary but no such step (a framework that drops the raw
  usage) has the step estimated (`with_unreported_compaction`).
* A call's output cap (`output_cap`), for a strict budget's hold and a token
  limiter's weight alike: the call's own ``max_tokens``, ``max_completion_tokens`` or
  ``max_output_tokens``, else the cap the model states (`model_output_cap`).
* Money is not counted here: `cost_of` prices a
  `Usage` (``tokens * price_per_mtok / 1_000_000``, exact in ``Decimal``).

``cl100k_base`` is an OpenAI tokenizer, so estimates for other providers' models can be
systematically off: treat estimated entries as close approximations, not invoices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TypeGuard

from llm_resilience import checks
from llm_resilience.tokens import count_message_tokens, count_tokens

__all__ = [
    "BILLED_APART",
    "DETAIL_FIELDS",
    "OUTPUT_CAP_NAMES",
    "StreamUsage",
    "NO_DETAILS",
    "TokenDetails",
    "Usage",
    "billed_apart",
    "chat_usage",
    "estimated_usage",
    "embedding_usage",
    "estimate_request_tokens",
    "first_token_count",
    "model_output_cap",
    "output_cap",
    "partial_stream_usage",
    "reported_usage",
    "token_count",
    "with_billed_apart",
    "with_unreported_compaction",
]

#: The names of an output cap, as a call's keyword and as a model's field: OpenAI's
#: ``max_tokens`` (and its newer ``max_completion_tokens``), Google's
#: ``max_output_tokens``; the first that is a count wins.
OUTPUT_CAP_NAMES = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def token_count(value: object, *, whole_float: bool = False) -> int | None:
    """``value`` as a token count, or None when it is not one: the one lenient reader.

    A count is an ``int`` >= 0 that is not a ``bool``; with ``whole_float`` a float with
    no fraction counts too (SDKs that declare their counts floats, as Cohere's billed
    units). Anything else (None, a negative number, text, ``True``) is no count, so a
    provider's odd report reads as "not reported" instead of raising.

    Examples:
        >>> token_count(12), token_count(-1), token_count(True), token_count("12")
        (12, None, None, None)
        >>> token_count(6.0), token_count(6.0, whole_float=True), token_count(6.5, whole_float=True)
        (None, 6, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if whole_float and isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return None


def first_token_count(*values: object) -> int | None:
    """The first of ``values`` that is a token count (`token_count`), or None.

    Examples:
        >>> first_token_count(None, "n/a", 0, 40)
        0
    """
    for value in values:
        count = token_count(value)
        if count is not None:
            return count
    return None


def model_output_cap(model: object, documented: object = None) -> int | None:
    """The most output tokens ``model`` writes per call, as it states it; None: unknown.

    Its own field (the first of `OUTPUT_CAP_NAMES` it has that is a count: a
    LangChain ``ChatOpenAI``'s ``max_tokens``, a ``ChatGoogleGenerativeAI``'s
    ``max_output_tokens``), else ``documented``, the maximum its framework documents for
    it (a LangChain profile's ``max_output_tokens``, LlamaIndex's
    ``metadata.num_output``) when above 0 (0 and -1 mean unknown there).

    Examples:
        >>> class Gemini: max_output_tokens = 2048
        >>> model_output_cap(Gemini()), model_output_cap(object(), documented=8192)
        (2048, 8192)
    """
    own = first_token_count(*(getattr(model, name, None) for name in OUTPUT_CAP_NAMES))
    if own is not None:
        return own
    stated = token_count(documented)
    return stated if stated else None


def output_cap(call: Mapping[str, object], model_caps: Iterable[int | None] = ()) -> int | None:
    """A call's output cap: the call's own, else the largest its models state; None: unknown.

    ``call`` holds the call's keyword arguments: its own cap is the first of
    `OUTPUT_CAP_NAMES` there that is a count, and reaches whichever model serves.
    Without one, the cap is the largest of ``model_caps`` (`model_output_cap` of
    each model that may serve it: one model, or a fallback chain's members) that is
    known. A strict budget holds each model at its own cap instead
    ([`ServingModel`][]); for one model the two agree.

    Examples:
        >>> output_cap({"max_completion_tokens": 500}, [2048])
        500
        >>> output_cap({}, [2048, None, 1024]), output_cap({}, [None])
        (2048, None)
    """
    asked = first_token_count(*(call.get(name) for name in OUTPUT_CAP_NAMES))
    if asked is not None:
        return asked
    known = [cap for cap in model_caps if cap is not None]
    return max(known) if known else None


#: The optional counts a `Usage` may carry beside its input and output.
DETAIL_FIELDS = (
    "cache_read_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "reasoning_tokens",
)


@dataclass(frozen=True, slots=True)
class TokenDetails:
    """The parts of a call's input and output a provider reports apart, each None when not
    reported: what `cost_of` prices at its own rate.

    Adapters translate their provider's shape into these (see `Usage` for what
    each count means); the reading rules below take one alongside the two plain counts.
    """

    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_write_1h_tokens: int | None = None
    reasoning_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one call consumed, and whether they were estimated rather than reported.

    ``input_tokens`` is every input token the provider billed in some form: its cache
    reads and writes are part of it (OpenAI's ``prompt_tokens`` already counts them;
    Anthropic's ``input_tokens`` does not, so adapters add them). Likewise
    ``reasoning_tokens`` are part of ``output_tokens``. The optional counts are None when
    the provider did not report them; `cost_of` then bills
    those tokens at the plain input (or output) price. Counts that do not fit inside
    their total raise ``ValueError``.

    Examples:
        >>> Usage(1000, 50, False, cache_read_tokens=900)
        Usage(input_tokens=1000, output_tokens=50, estimated=False, cache_read_tokens=900)
    """

    #: Prompt tokens (for embeddings: the input texts' tokens), cached ones included. >= 0.
    input_tokens: int
    #: Completion tokens, reasoning included; 0 for embeddings. >= 0.
    output_tokens: int
    #: True when the counts come from ``cl100k_base``, not from the provider.
    estimated: bool
    #: Input tokens read from the provider's prompt cache, or None.
    cache_read_tokens: int | None = field(default=None, kw_only=True)
    #: Input tokens written to the provider's prompt cache (every write, whatever its
    #: lifetime), or None.
    cache_write_tokens: int | None = field(default=None, kw_only=True)
    #: Of ``cache_write_tokens``, those written to be kept one hour (Anthropic), or None.
    cache_write_1h_tokens: int | None = field(default=None, kw_only=True)
    #: Output tokens spent reasoning (part of ``output_tokens``), or None.
    reasoning_tokens: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        given, made = self.input_tokens, self.output_tokens
        # Two plain ints in range pass `checks.count`; anything else is checked by it.
        if not (
            type(given) is int
            and type(made) is int
            and 0 <= given <= checks.MAX_COUNT
            and 0 <= made <= checks.MAX_COUNT
        ):
            for name in ("input_tokens", "output_tokens"):
                checks.count(f"Usage.{name}", getattr(self, name))
        if (
            self.cache_read_tokens is None
            and self.cache_write_tokens is None
            and self.cache_write_1h_tokens is None
            and self.reasoning_tokens is None
        ):
            return  # no part reported (an estimate, the usual report): nothing to misfit
        for name in DETAIL_FIELDS:
            if getattr(self, name) is not None:
                checks.count(f"Usage.{name}", getattr(self, name))
        problem = _misfit(self.input_tokens, self.output_tokens, self.details)
        if problem:
            raise ValueError(f"Usage: {problem}")

    def __repr__(self) -> str:
        shown = [
            f"input_tokens={self.input_tokens}",
            f"output_tokens={self.output_tokens}",
            f"estimated={self.estimated}",
        ]
        shown += [
            f"{name}={getattr(self, name)}"
            for name in DETAIL_FIELDS
            if getattr(self, name) is not None
        ]
        return f"Usage({', '.join(shown)})"

    @property
    def details(self) -> TokenDetails:
        """The optional counts, as a `TokenDetails`."""
        return TokenDetails(*(getattr(self, name) for name in DETAIL_FIELDS))


#: The slot setter of each of `Usage`'s fields, in field order (`_unchecked_usage`).
_USAGE_SETTERS = tuple(vars(Usage)[each.name].__set__ for each in fields(Usage))


def _unchecked_usage(input_tokens: int, output_tokens: int, estimated: bool) -> Usage:
    """A `Usage` of two counts its caller checked already and no parts, built without
    ``Usage``'s checks again: each field through its slot's own setter, which costs half
    of ``object.__setattr__`` (that looks the slot up by name first)."""
    usage = object.__new__(Usage)
    (
        set_input_tokens,
        set_output_tokens,
        set_estimated,
        set_cache_read_tokens,
        set_cache_write_tokens,
        set_cache_write_1h_tokens,
        set_reasoning_tokens,
    ) = _USAGE_SETTERS
    set_input_tokens(usage, input_tokens)
    set_output_tokens(usage, output_tokens)
    set_estimated(usage, estimated)
    set_cache_read_tokens(usage, None)
    set_cache_write_tokens(usage, None)
    set_cache_write_1h_tokens(usage, None)
    set_reasoning_tokens(usage, None)
    return usage


def _misfit(input_tokens: int, output_tokens: int, details: TokenDetails) -> str | None:
    """Why ``details`` cannot be parts of these totals, or None when they can."""
    read, written = details.cache_read_tokens or 0, details.cache_write_tokens or 0
    if read + written > input_tokens:
        return (
            f"cache_read_tokens + cache_write_tokens ({read} + {written}) "
            f"exceed input_tokens ({input_tokens})"
        )
    if (details.cache_write_1h_tokens or 0) > written:
        return (
            f"cache_write_1h_tokens ({details.cache_write_1h_tokens}) exceed "
            f"cache_write_tokens ({details.cache_write_tokens})"
        )
    if (details.reasoning_tokens or 0) > output_tokens:
        return (
            f"reasoning_tokens ({details.reasoning_tokens}) exceed output_tokens ({output_tokens})"
        )
    return None


def _fitted(input_tokens: int, output_tokens: int, details: TokenDetails | None) -> TokenDetails:
    """The reported ``details`` that fit inside the reported totals.

    A provider's report is taken as it is, but a part that does not fit its total is
    dropped (priced at the plain rate, as if not reported) rather than charged below 0:
    cache counts above the input, a one-hour share above the writes, reasoning above the
    output. Counts that are not ints >= 0 are dropped too.
    """
    if details is None or details is NO_DETAILS:  # the usual report: nothing apart
        return NO_DETAILS
    read, written, written_1h, reasoning = (
        value if _is_count(value) else None
        for value in (
            details.cache_read_tokens,
            details.cache_write_tokens,
            details.cache_write_1h_tokens,
            details.reasoning_tokens,
        )
    )
    if (read or 0) + (written or 0) > input_tokens:
        read = written = written_1h = None
    if written_1h is not None and written_1h > (written or 0):
        written_1h = None
    if reasoning is not None and reasoning > output_tokens:
        reasoning = None
    return TokenDetails(read, written, written_1h, reasoning)


#: No count reported apart: what an adapter gives for the usual report, which the
#: reading rules recognise by identity and pass through without another look.
NO_DETAILS = TokenDetails()


class StreamUsage:
    """How a stream's reported usage adds up, chunk by chunk: one rule for every adapter.

    Each `add` takes the counts one chunk (or one point of a stream) reports, as
    running totals; each direction keeps the **largest** total reported. Providers report
    usage in pieces: Anthropic gives input at the start and output at the end (and may
    repeat the opening output count), OpenAI one final usage-only chunk, others repeat a
    cumulative count on every chunk; the largest total is right for all of them, where
    adding the chunks up would count a repeated total twice.

    An adapter whose framework defines chunk usage as increments (LangChain's
    ``usage_metadata``: chunks add up when merged) passes the merged running total,
    which is that framework's own definition of the total so far.

    Examples:
        >>> usage = StreamUsage()
        >>> usage.add(25, 1)      # message_start: input, and an opening output count
        >>> usage.add(None, 40)   # message_delta: the final output count
        >>> usage.input_tokens, usage.output_tokens
        (25, 40)
    """

    __slots__ = ("_details", "input_tokens", "output_tokens")

    def __init__(self) -> None:
        #: Largest input count reported so far, or None.
        self.input_tokens: int | None = None
        #: Largest output count reported so far, or None.
        self.output_tokens: int | None = None
        self._details = NO_DETAILS

    def __repr__(self) -> str:
        return f"StreamUsage(input_tokens={self.input_tokens}, output_tokens={self.output_tokens})"

    @property
    def details(self) -> TokenDetails:
        """The largest of each optional count reported so far (None: never reported)."""
        return self._details

    def add(
        self,
        reported_input: int | None,
        reported_output: int | None,
        details: TokenDetails | None = None,
    ) -> None:
        """Take one report; a count that is None, negative or not an int is ignored.

        ``details`` (cache reads and writes, reasoning) add up the same way: each keeps
        the largest count reported.
        """
        if (
            reported_input is None
            and reported_output is None
            and (details is None or details is NO_DETAILS)
        ):
            return  # a chunk that reports nothing (most of a stream's): nothing changes
        self.input_tokens = _largest(self.input_tokens, reported_input)
        self.output_tokens = _largest(self.output_tokens, reported_output)
        if details is not None and details is not NO_DETAILS and details != NO_DETAILS:
            now = self._details
            self._details = TokenDetails(
                _largest(now.cache_read_tokens, details.cache_read_tokens),
                _largest(now.cache_write_tokens, details.cache_write_tokens),
                _largest(now.cache_write_1h_tokens, details.cache_write_1h_tokens),
                _largest(now.reasoning_tokens, details.reasoning_tokens),
            )


def _largest(current: int | None, reported: int | None) -> int | None:
    if not _is_count(reported):
        return current
    return reported if current is None else max(current, reported)


def chat_usage(
    reported_input: int | None,
    reported_output: int | None,
    *,
    prompt: Sequence[tuple[str, str]],
    response_text: str,
    details: TokenDetails | None = None,
) -> Usage:
    """The usage to record for one chat call (or one completed stream).

    ``reported_input``/``reported_output`` are the provider's counts, None when absent.
    Both present → recorded as reported. Either missing, negative, or an input of 0
    for a non-empty ``prompt`` → both estimated: ``count_message_tokens(prompt)`` and
    ``count_tokens(response_text)``, flagged ``estimated=True``. ``details`` are the
    provider's cache and reasoning counts, kept with a report (see `reported_usage`)
    and dropped with an estimate.

    Examples:
        >>> chat_usage(None, 5, prompt=[("user", "hello world")], response_text="hi").estimated
        True
    """
    reported = reported_usage(reported_input, reported_output, prompt=prompt, details=details)
    if reported is not None:
        return reported
    return estimated_usage(prompt, response_text)


def estimated_usage(prompt: Sequence[tuple[str, str]], response_text: str) -> Usage:
    """`chat_usage`'s estimate, for a caller that knows already that the provider's counts
    are no report (`reported_usage` gave None): the prompt's and the answer's tokens
    under ``cl100k_base``, flagged ``estimated``.

    Examples:
        >>> estimated_usage([("user", "hello world")], "hi")
        Usage(input_tokens=9, output_tokens=1, estimated=True)
    """
    given, made = count_message_tokens(prompt), count_tokens(response_text)
    if given > checks.MAX_COUNT or made > checks.MAX_COUNT:  # ``Usage`` says why
        return Usage(given, made, estimated=True)
    # Two token counts (ints >= 0) within range, and no parts: what ``Usage``'s checks
    # would pass, built without them.
    return _unchecked_usage(given, made, True)


def reported_usage(
    reported_input: int | None,
    reported_output: int | None,
    *,
    prompt: Sequence[tuple[str, str]],
    details: TokenDetails | None = None,
) -> Usage | None:
    """The provider's counts as a `Usage`, or None when they are not a report.

    A report has both counts, each an int >= 0, and an input above 0 unless ``prompt``
    is empty: some integrations fill a missing count with 0. ``details`` (cache reads and
    writes, reasoning) come with it, each part that does not fit inside its total dropped
    (billed at the plain price, as if not reported). The one rule behind
    `chat_usage` and a limiter's reconciliation
    (`reconcile_with_usage`).

    Examples:
        >>> reported_usage(0, 12, prompt=[("user", "hi")]) is None
        True
        >>> reported_usage(7, 12, prompt=[("user", "hi")])
        Usage(input_tokens=7, output_tokens=12, estimated=False)
    """
    if reported_input is None or reported_output is None:  # a count not reported
        return None
    # `_is_count` of each, a plain int read first (an int >= 0 is a count; a bool is no int).
    if not (
        (type(reported_input) is int and reported_input >= 0) or _is_count(reported_input)
    ) or not (
        (type(reported_output) is int and reported_output >= 0) or _is_count(reported_output)
    ):
        return None
    if reported_input == 0 and len(prompt) > 0:
        return None
    # Both counts were checked just above: built without ``Usage``'s checks again.
    usage = _unchecked_usage(reported_input, reported_output, False)
    if details is None or details is NO_DETAILS:  # the usual report: `_fitted`'s answer
        return usage
    fitted = _fitted(reported_input, reported_output, details)
    for name in DETAIL_FIELDS:
        object.__setattr__(usage, name, getattr(fitted, name))
    return usage


#: The ``type`` of each ``usage.iterations`` entry a provider bills on top of its
#: top-level counts: Anthropic's server-side compaction (the summarising step).
BILLED_APART = ("compaction",)


def billed_apart(provider_usage: object) -> Usage | None:
    """What ``provider_usage`` bills on top of its top-level counts, or None when nothing.

    ``provider_usage`` is the provider's own usage report, as its SDK or framework hands
    it over (a mapping or an SDK object). Anthropic's server-side compaction summarises
    the conversation in a sampling step of its own before the answer: ``iterations``
    lists each step, the ``"compaction"`` entries first and then the answer's
    ``"message"`` entry, and the top-level counts are those of the steps that are not
    compaction (Anthropic's docs: the top-level input and output tokens exclude the
    compaction iteration's; the total is the sum over the iterations). So the bill is
    the top-level counts plus every entry of a type in `BILLED_APART`, which
    equals the sum over the iterations when they list the message step too, and stays
    right when they do not. Other entries are left alone: a ``"message"`` step is in
    the top-level counts already, an advisor's sub-inference (``"advisor_message"``)
    runs on another model at that model's prices, and a server-side fallback's
    (``"fallback_message"``) stands for the step that served.

    Each entry's input is its ``input_tokens`` plus its cache reads and writes, as
    `Usage` counts input (the writes split by lifetime in ``cache_creation``
    when it says so); an entry without an input and an output count is skipped.

    Examples:
        >>> billed_apart({"input_tokens": 229, "output_tokens": 5, "iterations": [
        ...     {"type": "compaction", "input_tokens": 100, "output_tokens": 131,
        ...      "cache_read_input_tokens": 0, "cache_creation_input_tokens": 55096},
        ...     {"type": "message", "input_tokens": 229, "output_tokens": 5}]})
        Usage(input_tokens=55196, output_tokens=131, estimated=False, cache_read_tokens=0, \
cache_write_tokens=55096)
        >>> billed_apart({"input_tokens": 229, "output_tokens": 5}) is None
        True
    """
    iterations = _field(provider_usage, "iterations")
    if iterations is None:  # the usual report: no steps listed (and no ABC check)
        return None
    if not isinstance(iterations, Sequence) or isinstance(iterations, str | bytes):
        return None
    billed: Usage | None = None
    for step in iterations:
        if _field(step, "type") not in BILLED_APART:
            continue
        plain = token_count(_field(step, "input_tokens"))
        output = token_count(_field(step, "output_tokens"))
        if plain is None or output is None:
            continue
        read, written, written_1h = _cache_counts(step)
        before = billed if billed is not None else Usage(0, 0, estimated=False)
        billed = Usage(
            before.input_tokens + plain + (read or 0) + (written or 0),
            before.output_tokens + output,
            estimated=False,
            cache_read_tokens=_plus(before.cache_read_tokens, read),
            cache_write_tokens=_plus(before.cache_write_tokens, written),
            cache_write_1h_tokens=_plus(before.cache_write_1h_tokens, written_1h),
        )
    return billed


def with_billed_apart(
    reported_input: int | None,
    reported_output: int | None,
    details: TokenDetails | None,
    provider_usage: object,
) -> tuple[int | None, int | None, TokenDetails | None]:
    """The reported counts with what ``provider_usage`` bills apart added to them
    (`billed_apart`): the counts an adapter then reads as the provider's report.

    ``reported_input`` (cache reads and writes included, as `Usage` counts it),
    ``reported_output`` and ``details`` are the top-level counts as the adapter read
    them; each gets the compaction steps' own. A count that was not reported stays
    None, so a report without its top-level counts is still no report. Without
    anything billed apart the three come back as given.

    Examples:
        >>> usage = {"iterations": [{"type": "compaction", "input_tokens": 100,
        ...     "output_tokens": 131, "cache_creation_input_tokens": 55096}]}
        >>> with_billed_apart(229, 5, None, usage)
        (55425, 136, TokenDetails(cache_read_tokens=None, cache_write_tokens=55096, \
cache_write_1h_tokens=None, reasoning_tokens=None))
    """
    extra = billed_apart(provider_usage) if provider_usage is not None else None
    if extra is None:
        return reported_input, reported_output, details
    now = details if details is not None else NO_DETAILS
    combined = TokenDetails(
        _plus(now.cache_read_tokens, extra.cache_read_tokens),
        _plus(now.cache_write_tokens, extra.cache_write_tokens),
        _plus(now.cache_write_1h_tokens, extra.cache_write_1h_tokens),
        now.reasoning_tokens,
    )
    added_in = reported_input + extra.input_tokens if _is_count(reported_input) else None
    added_out = reported_output + extra.output_tokens if _is_count(reported_output) else None
    return added_in, added_out, combined


def with_unreported_compaction(
    usage: Usage,
    *,
    prompt: Sequence[tuple[str, str]],
    summaries: Sequence[str],
    provider_usage: object = None,
) -> Usage:
    """``usage`` with the compaction steps it leaves out estimated, flagged ``estimated``.

    ``summaries`` are the texts of the compaction blocks the answer carried (one per
    summarising step; ``""`` for a block without text), ``provider_usage`` the raw usage
    the adapter has, if any. When the answer carried none, or ``provider_usage`` reports
    the steps (`billed_apart`: they are in the counts already), ``usage`` comes back
    as it is. Otherwise the framework dropped the steps' counts (langchain-anthropic's
    stream chunks keep only the top-level ones): each step is estimated with
    ``cl100k_base``, its input as the prompt's tokens (the step summarises the
    conversation sent) and its output as its summary's. Whatever the step wrote to or
    read from the cache is not known, so it is priced as plain input: an estimate, not
    the bill, but not the step left out.

    Examples:
        >>> with_unreported_compaction(Usage(229, 5, False), prompt=[("user", "hello world")],
        ...     summaries=["The user said hello."])
        Usage(input_tokens=238, output_tokens=10, estimated=True)
    """
    if not summaries or billed_apart(provider_usage) is not None:
        return usage
    return Usage(
        usage.input_tokens + len(summaries) * count_message_tokens(prompt),
        usage.output_tokens + sum(count_tokens(summary) for summary in summaries),
        estimated=True,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        cache_write_1h_tokens=usage.cache_write_1h_tokens,
        reasoning_tokens=usage.reasoning_tokens,
    )


def _cache_counts(step: object) -> tuple[int | None, int | None, int | None]:
    """An Anthropic usage's cache reads, writes and one-hour writes (None: not said)."""
    read = token_count(_field(step, "cache_read_input_tokens"))
    written = token_count(_field(step, "cache_creation_input_tokens"))
    lifetimes = _field(step, "cache_creation")
    five_minutes = token_count(_field(lifetimes, "ephemeral_5m_input_tokens"))
    one_hour = token_count(_field(lifetimes, "ephemeral_1h_input_tokens"))
    by_lifetime = (five_minutes or 0) + (one_hour or 0)
    if by_lifetime > 0:
        return read, by_lifetime, one_hour
    return read, written, None


def _plus(current: int | None, more: int | None) -> int | None:
    """Two optional counts added; None only when neither was reported."""
    if current is None and more is None:
        return None
    return (current or 0) + (more or 0)


def _field(container: object, key: str) -> object:
    """``container[key]`` of a mapping, else its attribute ``key``; None when absent."""
    if container is None:
        return None
    if type(container) is dict or isinstance(container, Mapping):  # a dict: no ABC check
        return container.get(key)
    return getattr(container, key, None)


def _is_count(value: int | None) -> TypeGuard[int]:
    return token_count(value) is not None


def partial_stream_usage(
    reported_input: int | None,
    reported_output: int | None,
    *,
    prompt: Sequence[tuple[str, str]],
    deltas: Sequence[str],
    delivered_text: str | None = None,
    details: TokenDetails | None = None,
) -> Usage | None:
    """The usage to record for a stream its consumer closed or cancelled before its end.

    ``deltas`` holds the text of each chunk the consumer received, one per chunk (``""``
    for a chunk without text); ``delivered_text`` is the answer so far when the chunks
    carry more than their text deltas (tool-call arguments), else ``"".join(deltas)``.
    ``reported_input``/``reported_output`` are the provider's counts so far, None when
    absent; ``details`` the cache and reasoning counts so far (see `chat_usage`).

    * No chunk delivered → None: record nothing (and release a strict-mode hold). The
      request may have reached the provider, but nothing shows what it consumed.
    * Both counts reported (as `chat_usage` reads them) → as reported, unless the
      output count is below the number of chunks that carried text (each streamed delta
      is at least one token): then it was reported before the text (Anthropic reports
      output at a stream's start and again only at its end), so the output is estimated
      over the delivered text (at least one token per text chunk) and the usage flagged
      ``estimated``; the reported cache counts are kept (they describe the input), the
      reasoning count is not.
    * Otherwise → estimated: the prompt's tokens and the delivered text's, flagged
      ``estimated=True``.

    Tokens the provider generated after the consumer stopped reading are never seen, so
    this is a floor of what the provider may bill.

    Examples:
        >>> partial_stream_usage(None, None, prompt=[("user", "hi")], deltas=[]) is None
        True
        >>> partial_stream_usage(None, None, prompt=[("user", "hello world")], deltas=["Hel", "lo"])
        Usage(input_tokens=9, output_tokens=1, estimated=True)
    """
    if not deltas:
        return None
    text = "".join(deltas) if delivered_text is None else delivered_text
    usage = chat_usage(
        reported_input, reported_output, prompt=prompt, response_text=text, details=details
    )
    text_chunks = sum(1 for delta in deltas if delta)
    if usage.estimated or usage.output_tokens >= text_chunks:
        return usage
    output = max(count_tokens(text), text_chunks)
    return Usage(
        usage.input_tokens,
        output,
        estimated=True,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        cache_write_1h_tokens=usage.cache_write_1h_tokens,
    )


def embedding_usage(texts: Sequence[str]) -> Usage:
    """Estimated usage of one embedding call over ``texts`` (providers rarely report it).

    Examples:
        >>> embedding_usage(["hello world", "hello"])
        Usage(input_tokens=3, output_tokens=0, estimated=True)
    """
    return Usage(sum(count_tokens(text) for text in texts), 0, estimated=True)


def estimate_request_tokens(
    prompt: Sequence[tuple[str, str]], max_output_tokens: int | None
) -> int:
    """A request's token weight before it is sent: estimated prompt + ``max_output_tokens``.

    Used for a rate limiter's token permits. None counts as 0 output tokens here (the
    limiter reconciles with real usage afterwards); a strict budget's hold is
    [`worst_case_cost`][llm_resilience.BudgetGate.worst_case_cost], which applies each
    serving model's own output cap.

    Examples:
        >>> estimate_request_tokens([("user", "hello world")], 100)  # 9 prompt tokens + 100
        109
    """
    if max_output_tokens is not None and max_output_tokens < 0:
        raise ValueError(f"max_output_tokens must be >= 0 or None, got {max_output_tokens!r}")
    return count_message_tokens(prompt) + (max_output_tokens or 0)
