"""The ``llm-resilience`` command.

``llm-resilience demo`` runs an offline simulated outage: a LangChain chain over a
fallback chain whose providers are local fault-injecting servers, with live progress and
a summary. It needs the LangChain adapter (``pip install langchain-llm-resilience
langchain-openai langchain-anthropic``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _demo(_: argparse.Namespace) -> int:
    try:
        from langchain_llm_resilience.demo import run_demo
    except ImportError as error:
        print(
            "llm-resilience demo needs the LangChain adapter and the provider clients: "
            "pip install langchain-llm-resilience langchain-openai langchain-anthropic "
            f"({error})",
            file=sys.stderr,
        )
        return 2
    return run_demo(sys.stdout)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-resilience",
        description="Fallback, rate limiting, spend budgets and retries for LLM calls.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run an offline simulated provider outage through a fallback chain"
    )
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``llm-resilience`` console script."""
    arguments = _parser().parse_args(argv)
    code: int = arguments.run(arguments)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
