"""Write ``docs/providers.md`` from the cells ``test_matrix.py`` runs.

    .venv/bin/python tests/providers/render_providers.py          # rewrite the page
    .venv/bin/python tests/providers/render_providers.py --check  # exit 1 if the page is stale

``test_providers_doc.py`` fails when the page differs from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from provider_cases import (
    ASYNC_CELLS,
    CLASSIFIERS,
    COLUMNS,
    DELIVERED,
    MODE_TITLES,
    MODES,
    READ_TIMEOUT,
    Column,
    Mode,
    async_cells,
    cells,
    classifiers_to_prove,
)
from provider_surfaces import ROWS, Row

PAGE = Path(__file__).resolve().parents[2] / "docs" / "providers.md"
COMMAND = ".venv/bin/python tests/providers/render_providers.py"

_CHAINS = {
    "SDK": "core `FallbackChain`",
    "LangChain": "`FallbackChatModel`",
    "LlamaIndex": "`FallbackLLM`",
}

_INTRO = f"""# Provider conformance

Which failures of each provider make a fallback chain try the next member, and which reach
you at once. Every cell below is a test (`tests/providers/test_matrix.py`): the real SDK,
or the real LangChain or LlamaIndex class built on it, talks HTTP to a local server
(`llm_resilience.testing.FaultInjectingServer`) that fails the way the provider does, with
its status, its headers (`Retry-After`, Azure's `retry-after-ms`, Bedrock's
`x-amzn-ErrorType`) and its own error body (Gemini's `google.rpc.Status`, Mistral's
`{{"object": "error", "type", "code"}}` object; Groq's
`{{"error": {{"message", "type", "code"}}}}` on `/openai/v1/chat/completions`, with its
custom 498 and Cloudflare's HTML pages for a 502 or a 504; Ollama's
`{{"error": "..."}}`, which the ollama SDK raises as `ResponseError` with its `status_code`;
Cohere's `{{"id", "message"}}`).
The chain is the failing member and a healthy one, both with `max_retries=0` (boto3:
`Config(retries={{"total_max_attempts": 1}})`; `ChatBedrockConverse`: a boto3 client built
with `Config(retries={{"max_attempts": 0, "mode": "standard"}})`; LlamaIndex
`BedrockConverse`: `max_retries=1` and `botocore_config=Config(retries={{"total_max_attempts":
1}})`; google-genai: `HttpRetryOptions(attempts=1)`; `ChatGoogleGenerativeAI`:
`max_retries=1`; `mistralai.Mistral`: no `retry_config`; `ChatMistralAI`: `max_retries=1`;
LlamaIndex `MistralAI`: `max_retries=0`; the ollama SDK, `ChatOllama` and LlamaIndex
`Ollama` have no retries to turn off; the cohere SDK and `ChatCohere`:
`request_options={{"max_retries": 0}}` with each call, the only place it can be set (a
`FallbackChatModel` passes it per member); LlamaIndex `Cohere`: `max_retries=1` and
`additional_kwargs={{"request_options": {{"max_retries": 0, "timeout_in_seconds": ...}}}}`);
the test
checks which member answered (or which error reached the caller, with its status) and that
the failing member was asked exactly once.

This page is generated from the same list of cases the tests run
(`tests/providers/provider_cases.py`); after changing it, run `{COMMAND}`.

**Reading a cell.** *falls back*: the next member answers (in a stream that had already
delivered {DELIVERED} chunks, the next member restarts the request and those chunks stay
delivered). *propagates*: the provider's error reaches the caller and no other member is
asked. Where the two classifiers differ, the cell gives the default classifier
(`is_transient`, `TransientClassifier()`: statuses 429 and 503, transport failures,
timeouts) first and the server-errors preset (`TransientClassifier.with_server_errors()`:
adds 500, 502, 504 and 529) after it. A Bedrock error counts with the status its AWS
error code stands for, whatever status carried it: `ThrottlingException`,
`TooManyRequestsException` and `ModelNotReadyException` as 429,
`ServiceUnavailableException` as 503 (transient by default),
`InternalServerException` as 500 and `ModelTimeoutException` (sent with 408) as 504, like
Anthropic's `timeout_error` (transient under the preset); any other code counts with
its HTTP status. An exception inside Bedrock's event stream (botocore raises it as an
`EventStreamError`, its code the stream member's name) counts the same way:
`throttlingException` 429, `serviceUnavailableException` 503, `internalServerException`
500, `validationException` 400, and `modelStreamErrorException` (the model failed
mid-stream; "retry your request", says the service model) 503. A google-genai error counts with its `code`: `RESOURCE_EXHAUSTED` is a
429, `UNAVAILABLE` a 503, `INTERNAL` a 500 and `DEADLINE_EXCEEDED` a 504; the errors
`ChatGoogleGenerativeAI` re-raises count with the status of the google-genai error they
wrap. A Mistral error counts with its HTTP status (mistralai's `SDKError`, and
`HTTPValidationError` for a 422; `ChatMistralAI` raises httpx's `HTTPStatusError`);
Mistral's own overload is a 429 `service_tier_capacity_exceeded`.
Groq's 498 (its flex tier at capacity, error code `capacity_exceeded`: "the
request won't be processed, you can try again later") counts as a 503, like Groq's own
503 "over capacity", so it falls back under both classifiers; a Groq error object inside
a stream counts by its code (`service_unavailable` 503, `rate_limit_exceeded` 429), else
by its type (`internal_server_error` 500).
An ollama `ResponseError` counts with its `status_code`; the one the SDK raises for
an `{{"error": ...}}` line inside a stream that already said 200 (Ollama's model runner
failed mid-answer) has none (`status_code` -1) and counts as a 500. Ollama's own
statuses are few: 503 "server busy" when its queue is full, 404 for a model not pulled,
400, and 500 for everything else; it sends no `Retry-After`. Its 401, 403, 429, 502 and
504 cells are what a proxy in front of it sends, or ollama.com behind a cloud model
(Ollama passes that status and its headers on). `ChatOllama` streams on the wire even for
`invoke` (its `stream` defaults to true): its call cells are streamed requests.
A cohere error is an `ApiError` (typed per status: `TooManyRequestsError`,
`ServiceUnavailableError`, `GatewayTimeoutError`, ...) and counts with its `status_code`.
"—" marks a failure that cannot come there: a
status code answers before a stream starts, so after the first chunk only the provider's
error event (a server error, an overload; Bedrock's event stream also carries throttling,
unavailable, validation and model-stream exceptions), a silence or a cut connection can.
Cohere sends no error event: a generation that fails mid-stream ends with `message-end`
`finish_reason: "ERROR"` (and `delta.error`), which the SDK yields as a normal event and
nothing raises at, so its server-error cell after the first chunk is "—".
"not covered": no test yet (see the end of the page).
"""

_RETRIES = """## SDK retries and failover

The SDKs retry on their own (`openai` and `anthropic` twice by default, on 408, 409, 429,
5xx and connection errors, honouring `Retry-After` and `retry-after-ms`), and inside a
chain that delays every failover: a member that keeps failing is asked again and again,
waiting out each backoff, before the next member is tried. With the packages' defaults,
against a server that answers 503 every time, the failing member is asked:

| Client | its default | requests before failover |
|---|---|---|
| `openai.OpenAI`, `openai.AzureOpenAI`, `anthropic.Anthropic` | `max_retries=2` | 3 |
| `ChatOpenAI`, `AzureChatOpenAI`, `ChatAnthropic` | the SDK's 2 | 3 |
| LlamaIndex `OpenAI`, `AzureOpenAI` | `max_retries=3`, and its own loop of 3 attempts | 12, with waits of a second or more |
| LlamaIndex `Anthropic` | `max_retries=10` | 11 |
| `boto3.client("bedrock-runtime")` | botocore's `standard` retry mode | 3 |
| `ChatBedrockConverse` | its boto3 client's: botocore's `standard` mode | 3 |
| LlamaIndex `BedrockConverse` | `max_retries=10`: its own loop of 10 attempts (on throttling, internal-server, unavailable and model-timeout errors, 4 to 10 s apart), each through a client it built with botocore's `max_attempts=10` | up to 110, over minutes (not counted by a test) |
| `google.genai.Client` | no `retry_options`: no retry | 1 |
| `ChatGoogleGenerativeAI` | `max_retries=6`, attempts in all (google-genai's `HttpRetryOptions(attempts=6)`) | 6, after 31 s of backoff (not counted by a test) |
| LlamaIndex `GoogleGenAI` | `max_retries=3`, its own loop of 3 attempts (on a 5xx; never on a 429) | 3, with waits of a second or more |
| `mistralai.Mistral` | no `retry_config`: no retry | 1 |
| `ChatMistralAI` | `max_retries=5`, attempts in all, on httpx transport errors only (4 to 10 s apart) | 1 (an error status is never retried; a connection closed unanswered is asked `max_retries` times) |
| LlamaIndex `MistralAI` | `max_retries=5`, passed to the SDK as `retries=5`, an int, which retries nothing | 1 |
| `groq.Groq`, `ChatGroq` | `max_retries=2` (ChatGroq passes its own on to the groq SDK) | 3 |
| LlamaIndex `Groq` | an `OpenAILike`: the openai SDK's `max_retries=3` inside LlamaIndex's own loop of 3 attempts | 12, with waits of a second or more |
| `ollama.Client`, `ChatOllama`, LlamaIndex `Ollama` | no retries at all | 1 |
| `cohere.ClientV2`, `ChatCohere` | every call `request_options={"max_retries": 2}` unless told otherwise (streams never retry) | 3, after about 1 + 2 s of backoff |
| LlamaIndex `Cohere` | `max_retries=10`: its own loop of 10 attempts (on 503, 500 and 504, 4 to 10 s apart), each a call its client retries twice | up to 30, over minutes (not counted by a test) |

Built with `max_retries=0`, every one of them is asked once and the chain moves on at once.
A boto3 client counts attempts, not retries: build it with
`botocore.config.Config(retries={"total_max_attempts": 1})` (botocore's own
`max_attempts` counts retries: `{"max_attempts": 1}` makes 2 requests). botocore does
not read `retry-after-ms` and waits out its own backoff. The core `FallbackChain`,
`FallbackChatModel` and `FallbackLLM` log a warning (logger `llm_resilience.fallback`)
for each member that retries by itself, a boto3 client by its `meta.config.retries`, a
google-genai client by its `HttpOptions.retry_options`, `ChatBedrockConverse` by its boto3
client's config; `ChatGoogleGenerativeAI` counts attempts, so it warns from
`max_retries=2` and is quiet at `max_retries=1`, and so does LlamaIndex's
`BedrockConverse` (its least is 1), which also warns for its client's botocore retries:
its own `max_retries` sets them too (`max_retries=1` is 2 requests) unless it is given a
`botocore_config` or a `client`. google-genai
does not read `Retry-After` and waits 1, 2, 4, 8 s... between its attempts. A
`mistralai` client retries (on 429, 500, 502, 503, 504) only with a backoff `RetryConfig`,
until its `max_elapsed_time` (ms) is spent, honouring `Retry-After`: the warning names that
budget (`retry_config.backoff.max_elapsed_time=...`); LlamaIndex's `MistralAI` passes its
own `retries=` on every call, overriding the client's config, so only a `RetryConfig` in
its `additional_kwargs["retries"]` makes it retry (`tests/providers/test_mistral_retries.py`).
does not read `Retry-After` and waits 1, 2, 4, 8 s... between its attempts. The ollama
SDK makes one request; it hands its keyword arguments to httpx, so an
`ollama.Client(transport=httpx.HTTPTransport(retries=N))` retries a connection that
failed to open (refused, DNS, connect timeout; never a status) N times, and the chain
warns of that (`_client.transport.retries`).
The cohere
SDK retries per call: no client setting (and no `ChatCohere` field) turns it off, only
`request_options={"max_retries": 0}` passed with each call (LlamaIndex's `Cohere` passes
its `additional_kwargs` with every call), so every cohere client and `ChatCohere` are
warned about, retries off or not (`request_options.max_retries=2`); LlamaIndex's `Cohere`
counts its own attempts (quiet at `max_retries=1` with its client's retries off in
`additional_kwargs`). The cohere SDK reads `Retry-After` but not `retry-after-ms` (it
compares the header's text with 0 and gives up on it).
`tests/providers/test_sdk_retries.py` proves each line, counting the requests the
server saw. Build the members of a chain with `max_retries=0`.

## The wait a provider asks for

Every client's rate-limit error carries the provider's headers through to
`retry_after_of`: `Retry-After` in seconds, or Azure's `retry-after-ms` where it sends
both; from a boto3 `ClientError`, the headers botocore keeps in `ResponseMetadata`
(Bedrock seldom sends one) (`tests/providers/test_retry_after.py`). Gemini states the wait in
its 429 body, a `google.rpc.RetryInfo` detail (`"retryDelay": "7s"`), which
`retry_after_of` reads when no header says otherwise (`tests/core/test_transient_gemini.py`).
Ollama sends no `Retry-After`; a proxy's or ollama.com's reaches `retry_after_of`
although the ollama SDK's `ResponseError` keeps no headers: it is raised `from None` over
the httpx error, which stays its `__context__` and holds the response. With `Cooldown(honor_retry_after=True)` a
chain skips that member for as long as its provider asked.

## Usage from the provider's own response

`tests/providers/test_usage.py` runs each provider's real response shape, a call and a
stream, through `CostTrackedChatModel` (LangChain) and `CostTrackedLLM` (LlamaIndex) over
a chain whose first member failed: the served member's reported token counts reach the
ledger as reported (`estimated=False`), priced exactly. OpenAI reports a stream's usage
only when asked (`stream_options={"include_usage": True}`): `ChatOpenAI` and
`AzureChatOpenAI` ask by default; LlamaIndex's `OpenAI` does not, and its streams are
recorded as estimated unless it is built with
`additional_kwargs={"stream_options": {"include_usage": True}}`. Gemini reports usage on
every call and stream chunk (`usageMetadata`); its `promptTokenCount` includes the
cached tokens (`cachedContentTokenCount`) and its thoughts (`thoughtsTokenCount`) are
billed as output apart from `candidatesTokenCount`: both frameworks' entries carry
input = prompt, output = candidates + thoughts, and the cache and reasoning splits.
Bedrock reports usage in a Converse answer and in a stream's last event (`metadata`); its
`inputTokens` leave out the cache reads (`cacheReadInputTokens`) and writes
(`cacheWriteInputTokens`, split by lifetime in `cacheDetails`), and its `outputTokens`
include the model's thinking, not reported apart: `ChatBedrockConverse` and LlamaIndex's
`BedrockConverse` entries carry input = `inputTokens` + reads + writes, with the reads,
the writes and the one-hour writes apart. Mistral reports `prompt_tokens` and
`completion_tokens` in a call's `usage` and in a stream's last chunk (always, with no
option to ask for it), and no cache or reasoning split (`UsageInfo` has none):
`ChatMistralAI` and LlamaIndex's `MistralAI` entries carry those counts as reported.
Groq reports OpenAI's shape (cached tokens
inside `prompt_tokens`, reasoning inside `completion_tokens`, no cache writes) and a
stream's usage in its last chunk's `x_groq.usage` without being asked: `ChatGroq` and
LlamaIndex's `Groq` (whose usage was estimated before it read `x_groq.usage`) record
it as reported, with the cache and reasoning splits. LlamaIndex's `AzureOpenAI`, like
its `OpenAI`, reports a stream's usage only when built with
`additional_kwargs={"stream_options": {"include_usage": True}}`.
the writes and the one-hour writes apart. Ollama reports `prompt_eval_count` and
`eval_count` in a call and in a stream's last (`done`) line, and nothing more: a thinking
model's thinking is inside `eval_count`, and a prompt prefix it reused from its KV cache
is not counted; `ChatOllama` and LlamaIndex's `Ollama` entries carry those two counts,
with no cache or reasoning split.
Cohere reports what it bills, `billed_units` (and `tokens`, the model's own counts, which
include its prompt template), in a v2 answer's `usage`, a v2 stream's `message-end`, and
v1's `meta` (LlamaIndex's `Cohere` calls v1): `ChatCohere` puts `tokens` in a call's
`usage_metadata` and a stream's `billed_units` in its last chunk's `token_count` (no
`usage_metadata`), which `CostTrackedChatModel` reads; LlamaIndex entries are read from
`meta.billed_units`. Cohere's answers name no model: the entry names the member that
served. Cohere's `cached_tokens` (prompt tokens that hit its cache) reach neither
framework, so no cache split is recorded for it.

## Anthropic's compaction

When Anthropic's server-side compaction summarises a conversation, the summary is a
sampling step of its own, billed like any other, and the answer's top-level `usage`
leaves it out. Reading of the API: `usage.iterations` lists every sampling step of the
request, each with its own `input_tokens`, `output_tokens` and cache counts: first the
`"compaction"` steps, then the answer's own `"message"` step, whose counts the top-level
ones repeat (the SDK's `BetaCompactionIterationUsage` and `BetaMessageIterationUsage`;
Anthropic's compaction docs say the top-level counts exclude the compaction step and the
bill is the sum over the iterations; a recorded response has exactly those two steps).
So the cost layers bill the top-level counts plus every `"compaction"` step
(`llm_resilience.usage.billed_apart`): the sum over the iterations when they list the
message step, and still right if they did not. The other step types are not added: an
advisor's sub-inference (`"advisor_message"`) is another model at its own prices, and a
server-side fallback's `"fallback_message"` stands for the step that served. A stream
opens (`message_start`) with the summary step's input and ends (`message_delta`) with the
answer's counts and the iterations; the final entry is the sum, never the opening count.

`Fault.compacted(...)` makes the fault server answer so (a summary block first, the
iterations in the body and in a stream's `message_delta`), and
`tests/behaviour/test_cost.py` replays it through each framework's real client under
the cost layer, in every call shape. What each client does with it (langchain-anthropic
1.7, llama-index-llms-anthropic 0.12.3):

- `ChatAnthropic` calls: the raw usage, iterations included, is in
  `response_metadata["usage"]`: billed exactly.
- `ChatAnthropic` streams through the beta API (`betas=["compact-2026-01-12"]`, as its
  docs switch compaction on): they parse, but the chunks keep only the top-level counts
  (`usage_metadata` of `message_delta`). The summary block does reach the chunks, so the
  summarising step is estimated (`cl100k_base`: its input as the prompt, its output as
  the summary; any cache writes priced as plain input) and the entry is marked
  `estimated=True`. An estimate, much closer than the step left out.
- `ChatAnthropic` streams without `betas`: the SDK's non-beta types keep the
  `context_management` of `message_delta` as a plain dict, and
  `_make_message_chunk_from_anthropic_event` calls `.model_dump()` on it: an
  `AttributeError` from langchain-anthropic, at the end of every compacted stream.
- LlamaIndex's `Anthropic` streams: the last chunk's `raw["usage"]` has the iterations:
  billed exactly.
- LlamaIndex's `Anthropic.chat`/`achat`: the non-beta SDK types read the compaction block
  as a text block without text, and the integration's `TextBlock(text=None)` raises
  pydantic's `ValidationError`, with the beta header or without. Its answer's raw usage
  would be billed (the behaviour suite checks it on an answer without the block).

Where the client fails, the cost layer does not hide or change it: the same exception
type and message reach the caller as from the bare client, nothing is recorded and a
strict hold is released (`test_a_client_that_cannot_parse_a_compacted_answer_fails_as_it_does_alone`).
"""

_NOT_COVERED = """## Not covered yet

- Mistral's content filter: a chat completion is filtered only when it asks for
  `guardrails` (moderation), and the SDK declares no shape for a blocked answer; the
  matrix has no cell for it. Mistral documents no error event inside a stream: a failure
  after the first chunk is covered as a cut connection or a silence. Mistral on Azure and
  GCP (`mistralai.azure`, `mistralai.gcp`) is not covered. The server's Mistral error
  bodies other than the 429s (`rate_limited` 1300, `service_tier_capacity_exceeded`
  3505) follow the API's error object, not captured responses.
- Groq: no content-filter cell (Groq filters no chat content itself; moderation is a
  model the caller runs, Llama Guard). Its 413 "Request too large ... on tokens per
  minute (TPM)" (code `rate_limit_exceeded`: a request larger than the organisation's
  per-minute budget, which no retry on that member can serve) has no column and
  propagates. groq 0.37's `Stream` does not close its response when iteration fails or
  stops early (openai's does): a half-read stream's generators are left to the garbage
  collector, which can finalize them while a later request on the same client holds the
  connection pool's lock, a deadlock the matrix met once; the `groq.Groq` row closes
  each stream (`with stream:`), `ChatGroq` does not. Groq's message texts in the fault
  server are its public ones where known (the 401, 404, 429, 503 and context-length
  messages) and plausible elsewhere.
- Cohere: a failure after a stream started is `message-end` `finish_reason: "ERROR"`,
  which no SDK or framework raises at: the stream ends short and looks complete, so no
  chain can fall back on it (the fault server sends it; `tests/core/test_testing_server_cohere.py`).
  Cohere has no content-filter error (its safety modes steer the answer) and no overload
  status of its own. LlamaIndex's `Cohere` (0.9.0) has no async cells: its
  `astream_chat` iterates its sync client's stream with `async for` (a `TypeError` on
  every call); it drops its `timeout` (its clients get Cohere's 300 s default; the row
  passes `timeout_in_seconds` in `additional_kwargs`'s `request_options`). `ChatCohere`
  records a call's `tokens` (template included), not its `billed_units`, as its usage.
  The SDK skips a stream event it cannot decode (a log warning) and goes on. Cohere's
  v2 tool calls, citations and `thinking` events are not covered; the rows use text.
- Gemini's content filter is not an error: a blocked prompt is a 200 with
  `promptFeedback.blockReason` `SAFETY` and no candidates, a blocked answer ends with
  `finishReason` `SAFETY` (the fault server sends both); no chain falls back on it, and
  the matrix has no cell for it. Gemini through Vertex AI (`vertexai=True`, OAuth, its
  own paths) is not covered; the rows use the Gemini Developer API.
- The async google-genai client (`client.aio`) runs on aiohttp when aiohttp is
  installed; google-genai 2.x there leaves `ClientResponse.json` un-awaited on some
  errors (a `RuntimeWarning`) and its sessions unclosed at exit. The verdicts are the
  same.
- boto3 has no async client and `aioboto3` is not installed, so the boto3 row has no
  async cells. Without `aioboto3`, LlamaIndex's `BedrockConverse` runs its sync boto3
  client in a thread for `achat` and `astream_chat` (the async cells cover that); with
  `aioboto3` installed it would call through it instead, which no test covers.
  `ChatBedrockConverse`'s async methods run its sync client in an executor.
- Bedrock's older `InvokeModel` APIs (`ChatBedrock`, LlamaIndex's `Bedrock`) and
  Bedrock's tool-use and guardrail events in a stream are not covered; the rows use
  Converse and ConverseStream with text.
- Ollama's OpenAI-compatible API (`/v1/chat/completions`, which `ChatOpenAI` can call) is
  not covered; the rows use its native `/api/chat`. Ollama's `/api/generate` and
  embeddings are not covered either. Its context overflow has no cell: Ollama truncates
  a prompt longer than `num_ctx` and answers 200, so nothing can fall back on it.

## Versions

`llama-index-llms-anthropic` 0.12.3 fails on `anthropic` 2.x at its first call
(`TypeError: Cannot instantiate typing.Union`) and on 1.x (an unexpected `temperature`);
the development environment pins `anthropic>=0.120,<1`, which it and `langchain-anthropic`
1.7 both run on.
"""


def _outcome_text(column: Column, row: Row) -> str:
    default = column.expected("default", row)
    preset = column.expected("server-errors", row)
    if default == preset:
        return default
    return f"{default}; preset: {preset}"


def _provider_table(provider: str, rows: list[Row]) -> list[str]:
    covered = {(cell.row.key, cell.column.key, cell.mode) for cell in cells()}
    lines = [f"## {provider}", ""]
    clients = ", ".join(f"`{row.client}` ({row.surface}, {_CHAINS[row.surface]})" for row in rows)
    lines += [f"Clients: {clients}.", ""]
    header = ["Failure", *(MODE_TITLES[mode] for mode in MODES)]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for column in COLUMNS:
        row = rows[0]
        texts: list[str] = []
        for mode in MODES:
            present = {(r.key, column.key, mode) in covered for r in rows}
            if present != {True} and present != {False}:
                raise AssertionError(f"{provider} rows differ on {column.key} {mode}")
            if mode != "call" and row.stream is None:
                texts.append("not covered")
            else:
                texts.append(_outcome_text(column, row) if present == {True} else "—")
        lines.append("| " + " | ".join([column.title, *texts]) + " |")
    lines.append("")
    return lines


def _count(mode: Mode | None = None) -> int:
    return sum(1 for cell in cells() if mode is None or cell.mode == mode) * len(CLASSIFIERS)


def render() -> str:
    lines = [_INTRO]
    for provider in dict.fromkeys(row.provider for row in ROWS):
        lines += _provider_table(provider, [row for row in ROWS if row.provider == provider])
    lines += ["## What each failure is", ""]
    for column in COLUMNS:
        if column.note:
            lines.append(f"- **{column.title}**: {column.note}")
    chosen = async_cells()
    async_titles = ", ".join(
        f"{column.title} ({'; '.join(MODE_TITLES[m] for m in MODES if (column.key, m) in ASYNC_CELLS)})"
        for column in COLUMNS
        if any(cell.column is column for cell in chosen)
    )
    async_tests = sum(len(classifiers_to_prove(cell, every=False)) for cell in chosen)
    lines += [
        "",
        f"{_count()} tests run the sync paths ({len(ROWS)} clients; a read-timeout cell waits out a "
        f"{READ_TIMEOUT} s client timeout, every other cell is answered at once). The async "
        "paths (`ainvoke`/`astream`, `achat`/`astream_chat`, `AsyncOpenAI`, "
        f"`AsyncAzureOpenAI`, `AsyncAnthropic`, google-genai's `client.aio`, mistralai's "
        f"`complete_async`/`stream_async`, `AsyncGroq`, `ollama.AsyncClient`, "
        f"`cohere.AsyncClientV2`) run {async_tests} more, for every client "
        "with an async API: "
        f"{async_titles}; under both classifiers where they differ.",
        "",
        _RETRIES,
        _NOT_COVERED,
    ]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is stale; run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
