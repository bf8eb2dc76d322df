"""What the cost behaviours need of each framework, as mixins over ``driver.py``'s drivers.

Budgets, token and request limits, retries, the builder and the embeddings layers: each
mixin builds the framework's objects for them (a fake whose answers name no model, an
offline model with an output cap, embeddings fakes, the framework's own OpenAI client
with a limiter in its slot) and reads back what the tests compare (a layer's limiter,
an embeddings call in each shape).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from driver import PROMPT

# Credentials the keyed members carry (never called: construction needs no network).
OPENAI_KEY = "sk-FAKE-openai-key-for-tests"
ANTHROPIC_KEY = "sk-FAKE-anthropic-key-for-tests"
EMBEDDINGS_KEY = "sk-FAKE-embeddings-key-for-tests"
HEADER_TOKEN = "HEADERTOKENqwerty"
QUERY_KEY = "QUERYKEYzxcvb"
EXTRA_HEADER_KEY = "EXTRAHEADERKEYasdf"
URL_PASSWORD = "URLPASSWORDhunter2"
PROXY_PASSWORD = "PROXYPASSWORDletmein"
SECRETS = (
    OPENAI_KEY,
    ANTHROPIC_KEY,
    EMBEDDINGS_KEY,
    HEADER_TOKEN,
    QUERY_KEY,
    EXTRA_HEADER_KEY,
    URL_PASSWORD,
    PROXY_PASSWORD,
)

EmbedShape = Literal["query", "aquery", "batch", "abatch"]
EMBED_SHAPES: tuple[EmbedShape, ...] = ("query", "aquery", "batch", "abatch")


class LangChainCost:
    """LangChain's side of the cost behaviours."""

    #: The keywords a LangChain call caps its output with.
    output_cap_keywords: ClassVar[tuple[str, ...]] = ("max_tokens", "max_completion_tokens")
    #: The role LangChain's string prompt is sent as, for token estimates.
    prompt_role: ClassVar[str] = "human"

    def unnamed(self, text: str = "Paris is the capital.", *, model: str = "unnamed") -> Any:
        """An answering fake called ``model`` whose answers name no model (as Cohere's do)."""
        from langchain_core.messages import BaseMessage

        from langchain_llm_resilience.testing import ScriptedChatModel

        class UnnamedAnswers(ScriptedChatModel):
            def _answer(self, messages: list[BaseMessage], stop: Any, **kwargs: Any) -> Any:
                message = super()._answer(messages, stop, **kwargs)
                message.response_metadata.pop("model_name", None)
                return message

        return UnnamedAnswers(model=model, responses=[text])

    def capped(self, cap: int) -> Any:
        """An offline Gemini model whose output cap is ``cap`` (never called here)."""
        from langchain_google_genai import ChatGoogleGenerativeAI

        return ChatGoogleGenerativeAI(
            model="gemini-2.0-flash", google_api_key="t", max_output_tokens=cap, max_retries=0
        )

    def limiter_of(self, layer: Any) -> Any:
        """The limiter a rate-limited layer takes its permits from."""
        return layer.rate_limiter_in_use

    def reported_usage(self, reply: Any) -> tuple[int, int]:
        """The input and output tokens the provider reported for one call's ``Reply``."""
        usage = self.message_of(reply).usage_metadata  # type: ignore[attr-defined]
        return usage["input_tokens"], usage["output_tokens"]

    def open_stream(self, model: Any, prompt: str) -> Any:
        """A sync stream of ``model`` on ``prompt``, not yet iterated."""
        return model.stream(prompt)

    async def aopen_stream(self, model: Any, prompt: str) -> Any:
        """An async stream of ``model`` on ``prompt``, not yet iterated."""
        return model.astream(prompt)

    def chunk_text(self, chunk: Any) -> str:
        """The text one streamed chunk adds."""
        return str(chunk.text)

    def chunk_usage(self, chunk: Any) -> tuple[int, int] | None:
        """The input and output tokens a streamed chunk reports, if it reports them."""
        usage = chunk.usage_metadata
        return (usage["input_tokens"], usage["output_tokens"]) if usage else None

    def run_sync(self, model: Any, prompt: str = PROMPT, **kwargs: Any) -> Any:
        """One plain sync call (``invoke``/``chat``): the framework's answer."""
        return model.invoke(prompt, **kwargs)

    # -- real clients on a local server -----------------------------------------------

    #: The call shapes in which :meth:`provider_client`'s Anthropic client fails on a
    #: compacted answer: langchain-anthropic's stream, off the beta API, reads the
    #: ``context_management`` of ``message_delta`` as an SDK object and it is a dict
    #: (``AttributeError``).
    compaction_breaks: ClassVar[tuple[str, ...]] = ("stream", "astream")
    #: The same for :meth:`compacting_anthropic` (the beta API parses it).
    compaction_beta_breaks: ClassVar[tuple[str, ...]] = ()
    #: The call shapes whose answers reach the cost layer without Anthropic's raw usage
    #: (langchain-anthropic's stream chunks keep only the top-level counts).
    compaction_unreported: ClassVar[tuple[str, ...]] = ("stream", "astream")

    def compacting_anthropic(self, server: Any, model: str) -> Any:
        """The framework's Anthropic client for ``model`` with server-side compaction
        switched on, as the framework's docs do it (the beta and its edit), on
        ``server``."""
        from langchain_anthropic import ChatAnthropic

        return ChatAnthropic(  # type: ignore[call-arg]
            model_name=model,
            base_url=server.anthropic_base_url,
            api_key="sk-FAKE-anthropic",  # type: ignore[arg-type]
            max_retries=0,
            timeout=10,
            stop=None,
            betas=["compact-2026-01-12"],
            context_management={"edits": [{"type": "compact_20260112"}]},
        )

    def provider_client(self, provider: str, server: Any, model: str) -> Any:
        """The framework's own client of ``provider`` (``anthropic``, ``openai``,
        ``bedrock``, ``groq``) for ``model``, talking to ``server`` (a
        ``FaultInjectingServer``), with fake keys and no retries."""
        if provider == "anthropic":
            from langchain_anthropic import ChatAnthropic

            return ChatAnthropic(
                model_name=model,
                base_url=server.anthropic_base_url,
                api_key="sk-FAKE-anthropic",  # type: ignore[arg-type]
                max_retries=0,
                timeout=10,
                stop=None,
            )
        if provider == "openai":
            from langchain_openai import ChatOpenAI

            return ChatOpenAI(
                model=model,
                base_url=server.openai_base_url,
                api_key="sk-FAKE-openai",  # type: ignore[arg-type]
                max_retries=0,
                timeout=10,
            )
        if provider == "bedrock":
            import boto3
            from botocore.config import Config
            from langchain_aws import ChatBedrockConverse

            client = boto3.client(
                "bedrock-runtime",
                endpoint_url=server.anthropic_base_url,
                region_name="us-east-1",
                aws_access_key_id="sk-FAKE-aws-access-key-id",
                aws_secret_access_key="sk-FAKE-aws-secret-access-key",
                config=Config(retries={"total_max_attempts": 1}, read_timeout=10),
            )
            return ChatBedrockConverse(model=model, client=client)
        from langchain_groq import ChatGroq

        return ChatGroq(
            model=model,
            base_url=server.anthropic_base_url,
            api_key="sk-FAKE-groq",  # type: ignore[arg-type]
            max_retries=0,
            timeout=10,
        )

    # -- the builder ------------------------------------------------------------------

    #: How the builder's type errors name the framework.
    framework_title: ClassVar[str] = "LangChain"

    def builder(self) -> Any:
        """A fresh ``ResilienceBuilder`` of this adapter."""
        from langchain_llm_resilience import ResilienceBuilder

        return ResilienceBuilder()

    def journaled(
        self, journal: list[str], *, model: str = "fake-model", failing: bool = False
    ) -> Any:
        """A fake called ``model`` that notes ``provider <model>`` in ``journal`` on each
        request it receives, then answers (or fails with the fake HTTP 429)."""
        from pydantic import Field

        from langchain_llm_resilience.testing import FailingChatModel, ScriptedChatModel

        # The answering fake passes every request through _answer; the failing one is
        # noted at each of LangChain's four entry points (a stream on its first pull).
        class JournaledAnswers(ScriptedChatModel):
            journal: Any = Field(default=None, exclude=True)

            def _answer(self, *args: Any, **kwargs: Any) -> Any:
                self.journal.append(f"provider {self.model_name}")
                return super()._answer(*args, **kwargs)

        class JournaledFailures(FailingChatModel):
            journal: Any = Field(default=None, exclude=True)

            def _note(self) -> None:
                self.journal.append(f"provider {self.model_name}")

            def _generate(self, *args: Any, **kwargs: Any) -> Any:
                self._note()
                return super()._generate(*args, **kwargs)

            async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
                self._note()
                return await super()._agenerate(*args, **kwargs)

            def _stream(self, *args: Any, **kwargs: Any) -> Any:
                self._note()
                yield from super()._stream(*args, **kwargs)

            async def _astream(self, *args: Any, **kwargs: Any) -> Any:
                self._note()
                async for chunk in super()._astream(*args, **kwargs):
                    yield chunk

        Journaled = JournaledFailures if failing else JournaledAnswers
        return Journaled(journal=journal, model=model)

    def layer_types(self) -> dict[str, type]:
        """The adapter's classes by role, for walking a built stack."""
        from langchain_llm_resilience import (
            CostTrackedChatModel,
            CostTrackedEmbeddings,
            FallbackChatModel,
            RateLimitedChatModel,
            RateLimitedEmbeddings,
            RetryingEmbeddings,
            RetryingVectorStore,
        )

        return {
            "cost": CostTrackedChatModel,
            "rate": RateLimitedChatModel,
            "fallback": FallbackChatModel,
            "retry_embeddings": RetryingEmbeddings,
            "cost_embeddings": CostTrackedEmbeddings,
            "rate_embeddings": RateLimitedEmbeddings,
            "retry_store": RetryingVectorStore,
        }

    def members_of(self, chain: Any) -> list[Any]:
        """The members of a fallback chain, in order."""
        return list(chain.models)

    def vector_store(self, embeddings: Any) -> Any:
        """An in-memory vector store (over ``embeddings`` where the framework needs it)."""
        from langchain_core.vectorstores import InMemoryVectorStore

        return InMemoryVectorStore(embedding=embeddings)

    def store_and_find(self, store: Any, embeddings: Any, text: str) -> str:
        """Add ``text`` to ``store`` and find it again: the text found."""
        store.add_texts([text])
        return str(store.similarity_search(text, k=1)[0].page_content)

    # -- members that carry credentials -----------------------------------------------

    def keyed_openai(self) -> Any:
        """The framework's OpenAI chat model with a key, an auth header, a query key and
        URLs with passwords (some of which its own repr shows)."""
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(
            model="gpt-4o",
            api_key=OPENAI_KEY,  # type: ignore[arg-type]
            base_url=f"https://team:{URL_PASSWORD}@gateway.example/v1",
            openai_proxy=f"http://proxyuser:{PROXY_PASSWORD}@proxy.example:3128",
            default_headers={"Authorization": f"Bearer {HEADER_TOKEN}"},
            default_query={"api-key": QUERY_KEY},
            max_retries=0,
        )

    def keyed_anthropic(self) -> Any:
        from langchain_anthropic import ChatAnthropic

        return ChatAnthropic(  # type: ignore[call-arg]
            model="claude-sonnet-4-5",
            api_key=ANTHROPIC_KEY,  # type: ignore[arg-type]
            base_url=f"https://team:{URL_PASSWORD}@gateway.example",
            default_headers={"x-api-key": HEADER_TOKEN},
            max_retries=0,
        )

    def keyed_embeddings(self) -> Any:
        from langchain_openai import OpenAIEmbeddings

        return OpenAIEmbeddings(
            model="text-embedding-3-small",
            api_key=EMBEDDINGS_KEY,  # type: ignore[arg-type]
            default_headers={"Authorization": f"Bearer {HEADER_TOKEN}"},
            max_retries=0,
        )

    def records_of(self, model: Any) -> list[Any]:
        """What the framework and its tracers record about ``model``: LangChain's
        serialized form (which for our wrappers carries the repr), its identifying,
        invocation and LangSmith parameters, and pydantic's dump (for embeddings, which
        are no runnables, what ``dumpd`` makes of them)."""
        from langchain_core.language_models import BaseChatModel
        from langchain_core.load import dumpd

        if not isinstance(model, BaseChatModel):
            return [dumpd(model)]
        return [
            dumpd(model),
            model.to_json(),
            model._identifying_params,
            model.asdict(),
            model._get_invocation_params(stop=["\n"]),
            model._get_ls_params(),
            model.model_dump(),
        ]

    def traced_call(self, build: Any) -> list[str]:
        """Build a model with ``build(**options)``, call it once with a callback handler
        attached; the reprs of what the callbacks received when the run started."""
        from langchain_core.callbacks import BaseCallbackHandler

        starts: list[str] = []

        class Recorder(BaseCallbackHandler):
            def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
                starts.append(repr({"serialized": serialized, **kwargs}))

        build().invoke("hello", config={"callbacks": [Recorder()]})
        return starts

    def derived(self, model: Any) -> list[Any]:
        """What the framework derives from a chat model: bound tools, structured output."""
        from langchain_core.tools import tool
        from pydantic import BaseModel

        @tool
        def lookup(city: str) -> str:
            """Look up a city."""
            return city

        class Answer(BaseModel):
            city: str

        return [model.bind_tools([lookup]), model.with_structured_output(Answer)]

    # -- retries ----------------------------------------------------------------------

    def flaky_embeddings(self, *errors: BaseException) -> Any:
        """Offline embeddings (8 dimensions) that raise ``errors`` in turn, one per
        provider request, then answer; ``calls`` counts the requests."""
        from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings

        class FlakyEmbeddings(Embeddings):
            def __init__(self) -> None:
                self.fake = DeterministicFakeEmbedding(size=8)
                self.errors = list(errors)
                self.calls = 0

            def _fail(self) -> None:
                self.calls += 1
                if self.errors:
                    raise self.errors.pop(0)

            def embed_documents(self, texts: list[str]) -> list[list[float]]:
                self._fail()
                return self.fake.embed_documents(texts)

            def embed_query(self, text: str) -> list[float]:
                self._fail()
                return self.fake.embed_query(text)

        return FlakyEmbeddings()

    def retrying_embeddings(self, inner: Any, **options: Any) -> Any:
        from langchain_llm_resilience import RetryingEmbeddings

        return RetryingEmbeddings(inner=inner, **options)

    # -- embeddings -------------------------------------------------------------------

    def embeddings(self, size: int = 8) -> Any:
        """An offline embeddings model of ``size`` dimensions."""
        from langchain_core.embeddings import DeterministicFakeEmbedding

        return DeterministicFakeEmbedding(size=size)

    def cost_tracked_embeddings(self, inner: Any, **options: Any) -> Any:
        from langchain_llm_resilience import CostTrackedEmbeddings

        return CostTrackedEmbeddings(inner=inner, **options)

    def rate_limited_embeddings(self, inner: Any, **options: Any) -> Any:
        from langchain_llm_resilience import RateLimitedEmbeddings

        return RateLimitedEmbeddings(inner=inner, **options)

    async def embed(self, model: Any, texts: Sequence[str], shape: EmbedShape) -> int:
        """Embed ``texts`` (the first alone for a query); the number of vectors back."""
        if shape == "query":
            return len([model.embed_query(texts[0])])
        if shape == "aquery":
            return len([await model.aembed_query(texts[0])])
        if shape == "batch":
            return len(model.embed_documents(list(texts)))
        return len(await model.aembed_documents(list(texts)))

    def embed_sync(self, model: Any, texts: Sequence[str]) -> int:
        """Embed ``texts`` as one sync batch; the number of vectors back."""
        return len(model.embed_documents(list(texts)))

    # -- the framework's own rate-limiter slot ----------------------------------------

    def slot_base(self) -> type:
        """The framework's rate-limiter base class, the adapter imported (which registers
        the core limiters as its virtual subclasses)."""
        from langchain_core.rate_limiters import BaseRateLimiter

        import langchain_llm_resilience  # noqa: F401

        return BaseRateLimiter

    def adapter_module(self) -> str:
        return "langchain_llm_resilience"

    def openai_in_slot(self, base_url: str, limiter: Any) -> Any:
        """The framework's own OpenAI chat model, ``limiter`` in its ``rate_limiter`` slot."""
        from langchain_openai import ChatOpenAI

        self.slot_base()
        return ChatOpenAI(
            model="gpt-4o-mini",
            base_url=base_url,
            api_key="t",  # type: ignore[arg-type]
            max_retries=0,
            timeout=10,
            rate_limiter=limiter,
        )

    def capped_openai(self, base_url: str, model: str, cap: int | None) -> Any:
        """The framework's OpenAI chat model for ``model`` at ``base_url``, its output
        capped at ``cap`` (``None``: no cap of its own), with no retries."""
        from langchain_openai import ChatOpenAI

        options: dict[str, Any] = {} if cap is None else {"max_tokens": cap}
        return ChatOpenAI(
            model=model,
            base_url=base_url,
            api_key="t",  # type: ignore[arg-type]
            max_retries=0,
            **options,
        )

    def assumed_output_cap(self, model: Any) -> int:
        """The output cap the budget assumes for a real model with none of its own: its
        LangChain profile's documented maximum."""
        assert model.profile is not None
        return int(model.profile["max_output_tokens"])

    async def other_requests(self, model: Any, asynchronous: bool) -> int:
        """Send the requests of the framework's other call shape (a batch of two prompts);
        the number of requests it sends."""
        prompts = ["one", "two"]
        replies = await model.abatch(prompts) if asynchronous else model.batch(prompts)
        assert len(replies) == len(prompts)
        return len(prompts)


class LlamaIndexCost:
    """LlamaIndex's side of the cost behaviours."""

    output_cap_keywords: ClassVar[tuple[str, ...]] = ("max_tokens",)
    prompt_role: ClassVar[str] = "user"

    def unnamed(self, text: str = "Paris is the capital.", *, model: str = "unnamed") -> Any:
        from llama_index.resilience.testing import FakeFunctionCallingLLM

        class UnnamedAnswers(FakeFunctionCallingLLM):
            def _raw(self, usage: dict[str, int] | None) -> dict[str, Any]:
                return {"usage": usage} if usage is not None else {}

        return UnnamedAnswers(model_name=model, text=text)

    def capped(self, cap: int) -> Any:
        from llama_index.llms.google_genai import GoogleGenAI

        # A context window given too: without both, construction asks Google for them.
        return GoogleGenAI(
            model="gemini-2.0-flash", api_key="t", max_tokens=cap, context_window=1_000_000
        )

    def limiter_of(self, layer: Any) -> Any:
        return layer.limiter

    def reported_usage(self, reply: Any) -> tuple[int, int]:
        usage = reply.responses[-1].raw["usage"]
        return usage["prompt_tokens"], usage["completion_tokens"]

    def open_stream(self, model: Any, prompt: str) -> Any:
        from llama_index.core.base.llms.types import ChatMessage, MessageRole

        return model.stream_chat([ChatMessage(role=MessageRole.USER, content=prompt)])

    async def aopen_stream(self, model: Any, prompt: str) -> Any:
        from llama_index.core.base.llms.types import ChatMessage, MessageRole

        return await model.astream_chat([ChatMessage(role=MessageRole.USER, content=prompt)])

    def chunk_text(self, chunk: Any) -> str:
        return str(chunk.delta or "")

    def chunk_usage(self, chunk: Any) -> tuple[int, int] | None:
        usage = (chunk.raw or {}).get("usage")
        return (usage["prompt_tokens"], usage["completion_tokens"]) if usage else None

    def run_sync(self, model: Any, prompt: str = PROMPT, **kwargs: Any) -> Any:
        from llama_index.core.base.llms.types import ChatMessage, MessageRole

        return model.chat([ChatMessage(role=MessageRole.USER, content=prompt)], **kwargs)

    #: llama-index-llms-anthropic's chat reads the compaction block as a text block
    #: without text (pydantic's ``ValidationError``), beta header or not.
    compaction_breaks: ClassVar[tuple[str, ...]] = ("call", "acall")
    compaction_beta_breaks: ClassVar[tuple[str, ...]] = ("call", "acall")
    #: Every answer keeps its raw usage (``raw["usage"]``, a stream's last chunk's too).
    compaction_unreported: ClassVar[tuple[str, ...]] = ()

    def compacting_anthropic(self, server: Any, model: str) -> Any:
        from llama_index.llms.anthropic import Anthropic

        # The integration has no beta option: the header and the edit go with each request.
        return Anthropic(
            model=model,
            base_url=server.anthropic_base_url,
            api_key="sk-FAKE-anthropic",
            max_retries=0,
            timeout=10,
            additional_kwargs={
                "extra_headers": {"anthropic-beta": "compact-2026-01-12"},
                "extra_body": {"context_management": {"edits": [{"type": "compact_20260112"}]}},
            },
        )

    def provider_client(self, provider: str, server: Any, model: str) -> Any:
        if provider == "anthropic":
            from llama_index.llms.anthropic import Anthropic

            return Anthropic(
                model=model,
                base_url=server.anthropic_base_url,
                api_key="sk-FAKE-anthropic",
                max_retries=0,
                timeout=10,
            )
        if provider == "openai":
            from llama_index.llms.openai import OpenAI

            return OpenAI(
                model=model,
                api_base=server.openai_base_url,
                api_key="sk-FAKE-openai",
                max_retries=0,
                timeout=10,
                additional_kwargs={"stream_options": {"include_usage": True}},
            )
        if provider == "bedrock":
            from botocore.config import Config
            from llama_index.llms.bedrock_converse import BedrockConverse

            # Not aioboto3: its async methods run the sync client in a thread.
            return BedrockConverse(
                model=model,
                endpoint_url=server.anthropic_base_url,
                aws_access_key_id="sk-FAKE-aws-access-key-id",
                aws_secret_access_key="sk-FAKE-aws-secret-access-key",
                region_name="us-east-1",
                max_retries=1,
                botocore_config=Config(retries={"total_max_attempts": 1}, read_timeout=10),
            )
        from llama_index.llms.groq import Groq

        # Not asked for stream usage: Groq sends it in the last chunk's x_groq.usage anyway.
        return Groq(
            model=model,
            api_base=f"{server.anthropic_base_url}/openai/v1",
            api_key="sk-FAKE-groq",
            max_retries=0,
            timeout=10,
            context_window=131_072,
        )

    framework_title: ClassVar[str] = "LlamaIndex"

    def builder(self) -> Any:
        from llama_index.resilience import ResilienceBuilder

        return ResilienceBuilder()

    def journaled(
        self, journal: list[str], *, model: str = "fake-model", failing: bool = False
    ) -> Any:
        from llama_index.resilience.testing import FakeFunctionCallingLLM, rate_limit_error
        from pydantic import Field

        class Journaled(FakeFunctionCallingLLM):
            journal: Any = Field(default=None, exclude=True)

            def _count(self) -> None:
                self.journal.append(f"provider {self.model_name}")
                super()._count()

        error = rate_limit_error() if failing else None
        return Journaled(journal=journal, model_name=model, error=error)

    def layer_types(self) -> dict[str, type]:
        from llama_index.resilience import (
            CostTrackedEmbedding,
            CostTrackedLLM,
            FallbackLLM,
            RateLimitedEmbedding,
            RateLimitedLLM,
            RetryingEmbedding,
            RetryingVectorStore,
        )

        return {
            "cost": CostTrackedLLM,
            "rate": RateLimitedLLM,
            "fallback": FallbackLLM,
            "retry_embeddings": RetryingEmbedding,
            "cost_embeddings": CostTrackedEmbedding,
            "rate_embeddings": RateLimitedEmbedding,
            "retry_store": RetryingVectorStore,
        }

    def members_of(self, chain: Any) -> list[Any]:
        return list(chain.llms)

    def vector_store(self, embeddings: Any) -> Any:
        from llama_index.core.vector_stores import SimpleVectorStore

        return SimpleVectorStore()

    def store_and_find(self, store: Any, embeddings: Any, text: str) -> str:
        from llama_index.core.schema import TextNode
        from llama_index.core.vector_stores import VectorStoreQuery

        vector = embeddings.get_query_embedding(text)
        store.add([TextNode(text=text, id_="found", embedding=vector)])
        found = store.query(VectorStoreQuery(query_embedding=vector, similarity_top_k=1))
        return text if found.ids == ["found"] else ""

    def keyed_openai(self) -> Any:
        from llama_index.llms.openai import OpenAI

        return OpenAI(
            model="gpt-4o",
            api_key=OPENAI_KEY,
            api_base=f"https://team:{URL_PASSWORD}@gateway.example/v1",
            default_headers={"Authorization": f"Bearer {HEADER_TOKEN}"},
            additional_kwargs={"extra_headers": {"X-Gateway-Key": EXTRA_HEADER_KEY}},
            max_retries=0,
        )

    def keyed_anthropic(self) -> Any:
        from llama_index.llms.anthropic import Anthropic

        return Anthropic(
            model="claude-sonnet-4-5",
            api_key=ANTHROPIC_KEY,
            base_url=f"https://team:{URL_PASSWORD}@gateway.example",
            default_headers={"x-api-key": HEADER_TOKEN},
            max_retries=0,
        )

    def keyed_embeddings(self) -> Any:
        # llama-index-embeddings-openai is not installed: a small embedding model with
        # its OpenAIEmbedding's credential fields.
        from llama_index.core.embeddings import BaseEmbedding
        from pydantic import Field

        class KeyedEmbedding(BaseEmbedding):
            api_key: str = Field(default=EMBEDDINGS_KEY)
            api_base: str = Field(default=f"https://team:{URL_PASSWORD}@gateway.example/v1")
            default_headers: dict[str, str] = Field(
                default_factory=lambda: {"Authorization": f"Bearer {HEADER_TOKEN}"}
            )

            def _get_query_embedding(self, query: str) -> list[float]:
                return [0.0]

            async def _aget_query_embedding(self, query: str) -> list[float]:
                return [0.0]

            def _get_text_embedding(self, text: str) -> list[float]:
                return [0.0]

        return KeyedEmbedding()

    def records_of(self, model: Any) -> list[Any]:
        """What LlamaIndex puts in events and callback payloads (``to_dict``), pydantic's
        dumps, and the LLM's metadata."""
        records = [model.to_dict(), model.to_json(), model.model_dump(), model.dict()]
        metadata = getattr(model, "metadata", None)
        return records if metadata is None else [*records, metadata]

    def traced_call(self, build: Any) -> list[str]:
        """Build a model with ``build(callback_manager=...)`` and chat once with an
        instrumentation handler and a debug callback attached; the reprs of every event
        dispatched and every LLM callback payload."""
        from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
        from llama_index.core.instrumentation import get_dispatcher
        from llama_index.core.instrumentation.event_handlers import BaseEventHandler

        events: list[Any] = []

        class Recorder(BaseEventHandler):
            @classmethod
            def class_name(cls) -> str:
                return "SecretsEventRecorder"

            def handle(self, event: Any, **kwargs: Any) -> None:
                events.append(event)

        debug = LlamaDebugHandler()
        model = build(callback_manager=CallbackManager([debug]))
        root = get_dispatcher()
        handler = Recorder()
        root.add_event_handler(handler)
        try:
            self.run_sync(model, "hello")
        finally:
            root.event_handlers.remove(handler)
        pairs = debug.get_event_pairs(CBEventType.LLM)
        assert events
        assert pairs
        texts = [text for event in events for text in (repr(event), repr(event.model_dump()))]
        return texts + [repr(event.payload) for pair in pairs for event in pair]

    def derived(self, model: Any) -> list[Any]:
        """What the framework derives from an LLM: a structured LLM."""
        from pydantic import BaseModel

        class Answer(BaseModel):
            city: str

        return [model.as_structured_llm(Answer)]

    def flaky_embeddings(self, *errors: BaseException) -> Any:
        from llama_index.core.embeddings import MockEmbedding
        from pydantic import PrivateAttr

        class FlakyEmbedding(MockEmbedding):
            _errors: list[BaseException] = PrivateAttr(default_factory=list)
            _calls: int = PrivateAttr(default=0)

            @property
            def calls(self) -> int:
                return self._calls

            def _fail(self) -> None:
                self._calls += 1
                if self._errors:
                    raise self._errors.pop(0)

            def _get_query_embedding(self, query: str) -> list[float]:
                self._fail()
                return super()._get_query_embedding(query)

            async def _aget_query_embedding(self, query: str) -> list[float]:
                self._fail()
                return await super()._aget_query_embedding(query)

            def _get_text_embedding(self, text: str) -> list[float]:
                self._fail()
                return super()._get_text_embedding(text)

            async def _aget_text_embedding(self, text: str) -> list[float]:
                self._fail()
                return await super()._aget_text_embedding(text)

            def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
                self._fail()
                return [super(FlakyEmbedding, self)._get_text_embedding(t) for t in texts]

            async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
                self._fail()
                return [super(FlakyEmbedding, self)._get_text_embedding(t) for t in texts]

        flaky = FlakyEmbedding(embed_dim=8)
        flaky._errors = list(errors)
        return flaky

    def retrying_embeddings(self, inner: Any, **options: Any) -> Any:
        from llama_index.resilience import RetryingEmbedding

        return RetryingEmbedding(inner=inner, **options)

    def embeddings(self, size: int = 8) -> Any:
        from llama_index.core.embeddings import MockEmbedding

        return MockEmbedding(embed_dim=size)

    def cost_tracked_embeddings(self, inner: Any, **options: Any) -> Any:
        from llama_index.resilience import CostTrackedEmbedding

        return CostTrackedEmbedding(inner=inner, **options)

    def rate_limited_embeddings(self, inner: Any, **options: Any) -> Any:
        from llama_index.resilience import RateLimitedEmbedding

        return RateLimitedEmbedding(inner=inner, **options)

    async def embed(self, model: Any, texts: Sequence[str], shape: EmbedShape) -> int:
        if shape == "query":
            return len([model.get_query_embedding(texts[0])])
        if shape == "aquery":
            return len([await model.aget_query_embedding(texts[0])])
        if shape == "batch":
            return len(model.get_text_embedding_batch(list(texts)))
        return len(await model.aget_text_embedding_batch(list(texts)))

    def embed_sync(self, model: Any, texts: Sequence[str]) -> int:
        return len(model.get_text_embedding_batch(list(texts)))

    def slot_base(self) -> type:
        import llama_index.resilience  # noqa: F401
        from llama_index.core.rate_limiter import BaseRateLimiter

        return BaseRateLimiter

    def adapter_module(self) -> str:
        return "llama_index.resilience"

    def openai_in_slot(self, base_url: str, limiter: Any) -> Any:
        from llama_index.llms.openai import OpenAI

        self.slot_base()
        return OpenAI(
            model="gpt-4o-mini",
            api_base=base_url,
            api_key="t",
            max_retries=0,
            timeout=10,
            rate_limiter=limiter,
        )

    def capped_openai(self, base_url: str, model: str, cap: int | None) -> Any:
        from llama_index.llms.openai import OpenAI

        options: dict[str, Any] = {} if cap is None else {"max_tokens": cap}
        return OpenAI(model=model, api_base=base_url, api_key="t", max_retries=0, **options)

    def assumed_output_cap(self, model: Any) -> int:
        """LlamaIndex's models document no maximum: the core's default."""
        from llm_resilience.budget import DEFAULT_MAX_OUTPUT_TOKENS

        return DEFAULT_MAX_OUTPUT_TOKENS

    async def other_requests(self, model: Any, asynchronous: bool) -> int:
        """A completion (LlamaIndex's other call shape): one request."""
        prompt = "Capital of France?"
        reply = await model.acomplete(prompt) if asynchronous else model.complete(prompt)
        assert reply.text
        return 1
