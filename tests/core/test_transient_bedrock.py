"""The transient rule for AWS Bedrock: botocore's errors, as boto3 raises them.

Every ``ClientError`` here comes out of a real ``boto3`` ``bedrock-runtime`` client
(retries off) calling ``converse`` on the local fault server, which answers with
Bedrock's status, ``x-amzn-ErrorType`` header and ``{"message": ...}`` body; botocore
parses them into the error's ``response``. An ``EventStreamError`` comes out of reading a
real ``converse_stream`` whose event stream carries Bedrock's exception message. Transport errors come from real sockets on
127.0.0.1 (refused, hung, cut) and an unresolvable host.

A verdict is the pair (default rule with 429/503, ``with_server_errors()`` preset).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config
from botocore.eventstream import ChecksumMismatch

from llm_resilience import TransientClassifier, is_transient
from llm_resilience.fallback import context_limit_of, is_context_overflow
from llm_resilience.self_retry import self_retry_setting
from llm_resilience.testing import Fault, FaultInjectingServer
from llm_resilience.transient import retry_after_of, status_code_of

PRESET = TransientClassifier.with_server_errors()
MODEL = "anthropic.claude-3-haiku-20240307-v1:0"


def _client(root: str, *, read_timeout: float = 10, **retries: Any) -> Any:
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=root,
        region_name="us-east-1",
        aws_access_key_id="FAKE",
        aws_secret_access_key="FAKE",
        config=Config(
            retries={"mode": "standard", "total_max_attempts": 1, **retries},
            connect_timeout=5,
            read_timeout=read_timeout,
        ),
    )


def _converse(client: Any) -> Any:
    return client.converse(modelId=MODEL, messages=[{"role": "user", "content": [{"text": "hi"}]}])


@pytest.fixture(scope="module")
def server() -> Iterator[FaultInjectingServer]:
    with FaultInjectingServer() as served:
        yield served


def _raised(server: FaultInjectingServer, fault: Fault, **client: Any) -> BaseException:
    server.reset()
    server.script(fault)
    with pytest.raises(Exception) as caught:
        _converse(_client(f"http://127.0.0.1:{server.port}", **client))
    return caught.value


def _error(code: str, status: int) -> Fault:
    return Fault.status(status, body={"__type": code})


@pytest.mark.parametrize(
    ("fault", "status", "verdict"),
    [
        pytest.param(_error("ThrottlingException", 429), 429, (True, True), id="throttling"),
        pytest.param(_error("ModelNotReadyException", 429), 429, (True, True), id="not-ready"),
        pytest.param(_error("ServiceUnavailableException", 503), 503, (True, True), id="503"),
        pytest.param(_error("InternalServerException", 500), 500, (False, True), id="500"),
        pytest.param(_error("ModelTimeoutException", 408), 504, (False, True), id="model-timeout"),
        pytest.param(Fault.status(502), 502, (False, True), id="gateway-502"),
        pytest.param(Fault.status(504), 504, (False, True), id="gateway-504"),
        pytest.param(_error("ValidationException", 400), 400, (False, False), id="validation"),
        pytest.param(_error("AccessDeniedException", 403), 403, (False, False), id="denied"),
        pytest.param(_error("UnrecognizedClientException", 403), 403, (False, False), id="bad-key"),
        pytest.param(_error("ResourceNotFoundException", 404), 404, (False, False), id="404"),
        pytest.param(_error("ModelErrorException", 424), 424, (False, False), id="model-error"),
    ],
)
def test_bedrock_errors_count_with_the_status_their_error_code_stands_for(
    server: FaultInjectingServer, fault: Fault, status: int, verdict: tuple[bool, bool]
) -> None:
    error = _raised(server, fault)
    assert isinstance(error, botocore.exceptions.ClientError)
    assert status_code_of(error) == status
    assert (is_transient(error), PRESET(error)) == verdict


@pytest.mark.parametrize("code", ["ThrottlingException", "Throttling", "TooManyRequestsException"])
def test_a_throttling_code_is_transient_whatever_status_carries_it(
    server: FaultInjectingServer, code: str
) -> None:
    # Older AWS query APIs send their throttle as a 400; the code, not the status, says it.
    error = _raised(server, Fault.status(400, body={"__type": code, "message": "Slow down."}))
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 400  # type: ignore[attr-defined]
    assert status_code_of(error) == 429
    assert is_transient(error)


def _raised_mid_stream(server: FaultInjectingServer, fault: Fault) -> tuple[BaseException, int]:
    """What botocore raises while a converse_stream is read, and the text events before it."""
    server.reset()
    server.script(fault)
    client = _client(f"http://127.0.0.1:{server.port}", read_timeout=0.5)
    stream = client.converse_stream(
        modelId=MODEL, messages=[{"role": "user", "content": [{"text": "hi"}]}]
    )["stream"]
    texts: list[object] = []

    def read() -> None:
        texts.extend(event for event in stream if "contentBlockDelta" in event)

    with pytest.raises(Exception) as caught:
        read()
    return caught.value, len(texts)


@pytest.mark.parametrize(
    ("code", "name", "status", "verdict"),
    [
        pytest.param(429, "throttlingException", 429, (True, True), id="throttling"),
        pytest.param(503, "serviceUnavailableException", 503, (True, True), id="unavailable"),
        pytest.param(500, "internalServerException", 500, (False, True), id="internal"),
        pytest.param(424, "modelStreamErrorException", 503, (True, True), id="model-stream"),
        pytest.param(400, "validationException", 400, (False, False), id="validation"),
    ],
)
def test_an_exception_inside_a_bedrock_event_stream_counts_with_the_status_of_its_code(
    server: FaultInjectingServer, code: int, name: str, status: int, verdict: tuple[bool, bool]
) -> None:
    # botocore raises it as an EventStreamError whose code is the stream member's name, in
    # lower camel case, with no HTTP status: the stream's own response said 200.
    error, delivered = _raised_mid_stream(server, Fault.error_event(code, after_chunks=2))
    assert isinstance(error, botocore.exceptions.EventStreamError)
    assert error.response["Error"]["Code"] == name
    assert "ResponseMetadata" not in error.response
    assert delivered == 2
    assert status_code_of(error) == status
    assert (is_transient(error), PRESET(error)) == verdict


def test_a_bedrock_stream_cut_stalled_or_corrupted_after_it_started_is_transient(
    server: FaultInjectingServer,
) -> None:
    cut, _ = _raised_mid_stream(server, Fault.drop_mid_stream(after_chunks=2))
    stalled, _ = _raised_mid_stream(server, Fault.stall_mid_stream(after_chunks=2))
    corrupted, delivered = _raised_mid_stream(server, Fault.malformed_chunk(after_chunks=1))
    # The body is read through urllib3, which botocore does not wrap here.
    assert type(cut).__module__.startswith("urllib3")
    assert type(stalled).__module__.startswith("urllib3")
    assert isinstance(corrupted, ChecksumMismatch)
    assert delivered == 1
    for error in (cut, stalled, corrupted):
        assert is_transient(error), repr(error)
        assert status_code_of(error) is None


def test_the_error_code_named_in_the_text_is_no_keyword(server: FaultInjectingServer) -> None:
    # botocore's text is "An error occurred (ModelTimeoutException) when calling ...":
    # the code says "timeout", but only the provider's message is read for keywords.
    error = _raised(server, _error("ModelTimeoutException", 408))
    assert "Timeout" in str(error)
    assert not is_transient(error)
    said = _raised(server, Fault.status(400, body={"message": "Rate limit hit, slow down."}))
    assert is_transient(said)


def test_an_unknown_error_code_counts_with_its_http_status(server: FaultInjectingServer) -> None:
    error = _raised(server, Fault.status(503, body={"__type": "SomethingNewException"}))
    assert status_code_of(error) == 503
    assert is_transient(error)


def test_the_retry_after_header_of_a_bedrock_error_is_read(server: FaultInjectingServer) -> None:
    assert retry_after_of(_raised(server, Fault.status(429, retry_after=3))) == 3.0
    assert retry_after_of(_raised(server, Fault.status(429))) is None


def test_bedrock_says_input_is_too_long_with_a_validation_exception_that_is_an_overflow(
    server: FaultInjectingServer,
) -> None:
    error = _raised(server, Fault.context_length_exceeded("bedrock"))
    assert status_code_of(error) == 400
    assert is_context_overflow(error)
    assert context_limit_of(error) is None
    assert not is_transient(error)
    assert not PRESET(error)
    assert not is_context_overflow(_raised(server, _error("ValidationException", 400)))


def test_botocore_connection_failures_and_timeouts_are_transient(
    server: FaultInjectingServer, refused_port: int
) -> None:
    with pytest.raises(botocore.exceptions.EndpointConnectionError) as refused:
        _converse(_client(f"http://127.0.0.1:{refused_port}"))
    with pytest.raises(botocore.exceptions.EndpointConnectionError) as dns:
        _converse(_client(f"http://nonexistent.invalid:{server.port}"))
    hung = _raised(server, Fault.hang(), read_timeout=0.2)
    dropped = _raised(server, Fault.drop_mid_stream())
    assert isinstance(hung, botocore.exceptions.ReadTimeoutError)
    assert isinstance(dropped, botocore.exceptions.ConnectionClosedError)
    built = [
        botocore.exceptions.ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"),
        botocore.exceptions.ResponseStreamingError(error=ValueError("cut")),
    ]
    for error in [refused.value, dns.value, hung, dropped, *built]:
        assert is_transient(error), repr(error)
        assert status_code_of(error) is None


def test_classifying_never_imports_botocore() -> None:
    code = (
        "import sys\n"
        "from llm_resilience.transient import is_transient\n"
        "is_transient(ValueError('x'))\n"
        "assert 'botocore' not in sys.modules, 'botocore imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("retries", "setting"),
    [
        pytest.param(None, ("retries.total_max_attempts", 3), id="standard-default"),
        pytest.param({"mode": "legacy"}, ("retries.total_max_attempts", 5), id="legacy-default"),
        # botocore's max_attempts counts retries: 1 means 2 requests.
        pytest.param({"max_attempts": 1}, ("retries.total_max_attempts", 2), id="max-attempts-1"),
        pytest.param({"total_max_attempts": 1}, None, id="one-attempt"),
        pytest.param({"max_attempts": 0}, None, id="no-retry"),
    ],
)
def test_a_boto3_client_that_retries_by_itself_is_noticed_by_its_retry_config(
    retries: dict[str, Any] | None, setting: tuple[str, int] | None
) -> None:
    config = Config() if retries is None else Config(retries=retries)  # type: ignore[arg-type]
    client = boto3.client(
        "bedrock-runtime",
        endpoint_url="http://127.0.0.1:1",
        region_name="us-east-1",
        aws_access_key_id="FAKE",
        aws_secret_access_key="FAKE",
        config=config,
    )
    assert self_retry_setting(client) == setting


class _ModelOverABoto3Client:
    """A framework model that calls through the boto3 client it holds, as langchain-aws's
    ``ChatBedrockConverse`` (``client``) and LlamaIndex's ``BedrockConverse``
    (``_client``) do, with no retry setting of its own."""

    def __init__(self, attribute: str, client: Any) -> None:
        setattr(self, attribute, client)
        self.max_retries = None


@pytest.mark.parametrize("attribute", ["client", "_client"])
def test_a_model_over_a_boto3_client_is_noticed_by_its_client_s_retry_config(
    attribute: str,
) -> None:
    def model(**retries: Any) -> _ModelOverABoto3Client:
        return _ModelOverABoto3Client(attribute, _client("http://127.0.0.1:1", **retries))

    assert self_retry_setting(model(total_max_attempts=3)) == (
        f"{attribute}.retries.total_max_attempts",
        3,
    )
    assert self_retry_setting(model(total_max_attempts=1)) is None
