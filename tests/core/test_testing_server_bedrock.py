"""The fault server's Bedrock Runtime route, on the wire: what Converse answers and fails with."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from llm_resilience.testing import Fault, FaultInjectingServer

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


def test_converse_stream_is_refused_as_not_served_and_leaves_the_script_alone() -> None:
    with FaultInjectingServer() as server:
        server.script(Fault.status(429))
        code, headers, _ = _post(server, PATH.replace("/converse", "/converse-stream"))
        assert server.pending == (Fault.status(429),)
    assert code == 400
    assert headers["x-amzn-ErrorType"].startswith("UnknownOperationException:")
