"""The fault server's Bedrock Runtime routes, on the wire: what Converse answers and fails
with, and ConverseStream's binary AWS event stream, decoded by botocore's own decoder."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from llm_resilience.testing import Fault, FaultInjectingServer
from llm_resilience.testing._wire_bedrock import encode_message

PATH = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"
REQUEST = {"messages": [{"role": "user", "content": [{"text": "What is the capital of France?"}]}]}


def _post(server: FaultInjectingServer, path: str = PATH) -> tuple[int, dict[str, str], Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}",
        data=json.dumps(REQUEST).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def test_converse_answers_with_bedrock_s_message_stop_reason_and_usage() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        status, _, body = _post(server)
        [served] = server.requests
    assert status == 200
    assert body["output"]["message"] == {
        "role": "assistant",
        "content": [{"text": "Paris is the capital."}],
    }
    assert body["stopReason"] == "end_turn"
    assert body["usage"] == {"inputTokens": 6, "outputTokens": 4, "totalTokens": 10}
    assert served.provider == "bedrock"
    assert served.model == "anthropic.claude-3-haiku-20240307-v1:0"
    assert not served.stream


@pytest.mark.parametrize(
    ("fault", "status", "error_type"),
    [
        (Fault.status(429), 429, "ThrottlingException"),
        (Fault.status(503), 503, "ServiceUnavailableException"),
        (Fault.status(408), 408, "ModelTimeoutException"),
        (Fault.status(400, body={"__type": "ThrottlingException"}), 400, "ThrottlingException"),
        (Fault.context_length_exceeded("bedrock"), 400, "ValidationException"),
    ],
)
def test_a_bedrock_error_names_its_code_in_x_amzn_errortype_and_its_body_holds_the_message(
    fault: Fault, status: int, error_type: str
) -> None:
    with FaultInjectingServer() as server:
        server.script(fault)
        code, headers, body = _post(server)
    assert code == status
    assert headers["x-amzn-ErrorType"] == (
        f"{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/"
    )
    assert list(body) == ["message"]
    assert body["message"]


def test_a_gateway_502_carries_no_aws_error_code() -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(502))
        code, headers, body = _post(server)
    assert code == 502
    assert "x-amzn-ErrorType" not in headers
    assert body == {"message": "Internal server error"}


STREAM_PATH = PATH + "-stream"


def _stream(server: FaultInjectingServer) -> tuple[int, dict[str, str], list[Any]]:
    """POST to converse-stream; the status, headers and each decoded event-stream message."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{STREAM_PATH}",
        data=json.dumps(REQUEST).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        status, headers, body = answer.status, dict(answer.headers), answer.read()
    buffer = EventStreamBuffer()  # botocore's own decoder: it checks both CRCs
    buffer.add_data(body)
    return status, headers, list(buffer)


def _decoded(message: Any) -> tuple[str, str, Any]:
    """(message type, event or exception type, JSON payload) of one decoded message."""
    kind = message.headers[":message-type"]
    name = message.headers[":event-type" if kind == "event" else ":exception-type"]
    assert message.headers[":content-type"] == "application/json"
    return kind, name, json.loads(message.payload)


# Two of botocore's own test vectors (tests/unit/test_eventstream.py): an empty message
# and one whose only header is the string ``content-type``.
EMPTY_MESSAGE = bytes.fromhex("000000100000000005c248eb7d98c8ff")
ONE_STRING_HEADER = (
    b"\x00\x00\x00=\x00\x00\x00 \x07\xfd\x83\x96\x0ccontent-type\x07\x00\x10"
    b"application/json{'foo':'bar'}\x8d\x9c\x08\xb1"
)


def test_the_event_stream_encoder_writes_botocore_s_test_vectors_byte_for_byte() -> None:
    assert encode_message({}, b"") == EMPTY_MESSAGE
    header = {"content-type": "application/json"}
    assert encode_message(header, b"{'foo':'bar'}") == ONE_STRING_HEADER


def test_converse_stream_answers_with_bedrock_s_events_in_an_aws_event_stream() -> None:
    with FaultInjectingServer(reply="Paris is the capital.") as server:
        status, headers, messages = _stream(server)
        [served] = server.requests
    assert status == 200
    assert headers["Content-Type"] == "application/vnd.amazon.eventstream"
    assert headers["x-amzn-RequestId"]
    events = [_decoded(message) for message in messages]
    assert [name for _, name, _ in events] == [
        "messageStart",
        *["contentBlockDelta"] * 4,
        "contentBlockStop",
        "messageStop",
        "metadata",
    ]
    assert {kind for kind, _, _ in events} == {"event"}
    assert events[0][2] == {"role": "assistant"}
    texts = [payload["delta"]["text"] for _, name, payload in events if name == "contentBlockDelta"]
    assert "".join(texts) == "Paris is the capital."
    assert events[-2][2] == {"stopReason": "end_turn"}
    assert events[-1][2] == {
        "usage": {"inputTokens": 6, "outputTokens": 4, "totalTokens": 10},
        "metrics": {"latencyMs": 1},
    }
    assert (served.provider, served.model, served.stream) == (
        "bedrock",
        "anthropic.claude-3-haiku-20240307-v1:0",
        True,
    )
    assert served.path == STREAM_PATH


def test_a_cached_answer_reports_bedrock_s_cache_counts_apart_from_its_input_tokens() -> None:
    details = {"cache_read": 30, "cache_write_5m": 20, "cache_write_1h": 10, "reasoning": 5}
    expected = {
        "inputTokens": 6,
        "outputTokens": 9,  # 4 words and 5 of thinking, not reported apart
        "totalTokens": 75,
        "cacheReadInputTokens": 30,
        "cacheWriteInputTokens": 30,
        "cacheDetails": [{"ttl": "1h", "inputTokens": 10}, {"ttl": "5m", "inputTokens": 20}],
    }
    with FaultInjectingServer(reply="Paris is the capital.", usage_details=details) as server:
        _, _, body = _post(server)
        _, _, messages = _stream(server)
    assert body["usage"] == expected
    assert _decoded(messages[-1])[2]["usage"] == expected


@pytest.mark.parametrize(
    ("code", "exception_type"),
    [
        (429, "throttlingException"),
        (503, "serviceUnavailableException"),
        (500, "internalServerException"),
        (424, "modelStreamErrorException"),
        (400, "validationException"),
        (529, "internalServerException"),
        (413, "validationException"),
    ],
)
def test_a_stream_that_fails_after_it_started_ends_with_bedrock_s_exception_message(
    code: int, exception_type: str
) -> None:
    with FaultInjectingServer(reply="one two three four") as server:
        server.script(Fault.error_event(code, after_chunks=2))
        status, _, messages = _stream(server)
    assert status == 200
    decoded = [_decoded(message) for message in messages]
    assert [name for _, name, _ in decoded] == [
        "messageStart",
        "contentBlockDelta",
        "contentBlockDelta",
        exception_type,
    ]
    kind, _, payload = decoded[-1]
    assert kind == "exception"
    assert payload["message"]


def test_a_status_fault_on_the_stream_route_answers_before_any_event() -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(429))
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}{STREAM_PATH}", data=json.dumps(REQUEST).encode()
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 429
    assert caught.value.headers["x-amzn-ErrorType"].startswith("ThrottlingException:")


def test_a_malformed_chunk_is_a_message_that_fails_botocore_s_crc_check() -> None:
    with FaultInjectingServer(reply="one two three") as server:
        server.script(Fault.malformed_chunk(after_chunks=1))
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}{STREAM_PATH}", data=json.dumps(REQUEST).encode()
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
    buffer = EventStreamBuffer()
    buffer.add_data(body)
    decoded = iter(buffer)
    assert [_decoded(next(decoded))[1] for _ in range(2)] == ["messageStart", "contentBlockDelta"]
    with pytest.raises(ChecksumMismatch):
        next(decoded)


def test_a_missing_end_marker_leaves_out_message_stop_and_keeps_the_usage() -> None:
    with FaultInjectingServer(reply="one two") as server:
        server.script(Fault.missing_done())
        _, _, messages = _stream(server)
    names = [_decoded(message)[1] for message in messages]
    assert "messageStop" not in names
    assert names[-1] == "metadata"
