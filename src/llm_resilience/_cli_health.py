"""``llm-resilience health``: every fallback member's shared circuit, as a table or JSON.

Reads what the fleet's [`RedisCircuitStore`][] holds under a namespace: every member key
a worker has ordered a request for, its state (``closed``, ``open`` until when and why,
``half_open`` and which worker owns the trial call) and the failures counted in its
window. It only reads (``HGETALL`` and one read-only script call) and writes nothing.
A member key is shown as stored, with unprintable characters escaped.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

__all__ = ["EXIT_OK", "EXIT_OPEN", "EXIT_USAGE", "configure", "run"]

#: Every member is closed (or the namespace holds none yet).
EXIT_OK = 0
#: At least one member is open or half-open.
EXIT_OPEN = 1
#: The command was used wrongly, or Redis could not be read (refused, silent beyond the
#: timeout, a bad URL); argparse exits 2 for its own errors too.
EXIT_USAGE = 2
FORMATS = ("table", "json")

HELP = "show every fallback member's shared circuit (closed, open, half-open) from Redis"
EPILOG = """\
exit codes: 0 every member closed (or none known yet), 1 some member open or half-open,
2 bad usage or Redis unreachable. Times are the Redis server's clock, in UTC.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    """The command's options: ``--redis URL``, ``--namespace N``, ``--format``."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--redis", required=True, metavar="URL", help="redis:// URL of the store")
    parser.add_argument(
        "--namespace",
        default="llm_resilience",
        help="the store's namespace (RedisCircuitStore(namespace=...); default llm_resilience)",
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format")
    parser.add_argument(
        "--timeout", type=float, default=2.0, help="seconds Redis may take to answer (default 2)"
    )


def _printable(text: str) -> str:
    return text if text.isprintable() else repr(text)[1:-1]


def _iso(milliseconds: int) -> str:
    return datetime.fromtimestamp(milliseconds / 1000.0, UTC).isoformat(timespec="milliseconds")


def _rows(now_ms: int, members: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for member in members:
        if member.open_until_ms > now_ms:
            state = "open"
        elif member.half_open:
            state = "half_open"
        else:
            state = "closed"
        probing = state == "half_open" and member.probe_until_ms > now_ms
        rows.append(
            {
                "member": member.key,
                "state": state,
                "failures": member.failures,
                "open_until": _iso(member.open_until_ms) if state == "open" else None,
                "retry_in": round((member.open_until_ms - now_ms) / 1000.0, 3)
                if state == "open"
                else 0.0,
                "reason": member.reason if state != "closed" else None,
                "prober": member.probe_owner if probing else None,
            }
        )
    return rows


def _table(rows: list[dict[str, Any]], out: IO[str]) -> None:
    header = ("member", "state", "failures", "open until (UTC)", "retry in", "reason", "prober")
    cells = [
        (
            _printable(row["member"]),
            row["state"],
            str(row["failures"]),
            row["open_until"] or "-",
            f"{row['retry_in']:.1f}s" if row["state"] == "open" else "-",
            row["reason"] or "-",
            _printable(row["prober"]) if row["prober"] else "-",
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]
    for line in [header, *cells]:
        padded = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        out.write("  ".join(padded).rstrip())
        out.write("\n")


def run(arguments: argparse.Namespace) -> int:
    """Print the namespace's circuits; the exit code (see the module's constants)."""
    from llm_resilience.fallback import RedisCircuitStore

    try:
        store = RedisCircuitStore(
            arguments.redis,
            namespace=arguments.namespace,
            operation_timeout=arguments.timeout,
            outage_cooldown=arguments.timeout,
        )
    except (TypeError, ValueError, ImportError) as exc:
        print(f"llm-resilience health: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # The store's outage WARNING is for a running worker; here the one line below says it.
    quiet = logging.getLogger("llm_resilience.fallback")
    was_disabled, quiet.disabled = quiet.disabled, True
    try:
        known = store.known()
        reply = None if known is None else store.read(list(known), list(known.values()))
    finally:
        quiet.disabled = was_disabled
        store.close()
    if known is None or reply is None:
        print(
            f"llm-resilience health: Redis at {store!r} did not answer within {arguments.timeout}s",
            file=sys.stderr,
        )
        return EXIT_USAGE
    now_ms, members = reply
    rows = _rows(now_ms, sorted(members, key=lambda member: member.key))
    if arguments.format == "json":
        json.dump({"namespace": arguments.namespace, "members": rows}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif rows:
        _table(rows, sys.stdout)
    else:
        print(f"no members known in namespace {arguments.namespace!r} yet")
    return EXIT_OPEN if any(row["state"] != "closed" for row in rows) else EXIT_OK
