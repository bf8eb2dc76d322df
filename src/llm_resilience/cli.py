"""The ``llm-resilience`` command: a dispatcher over commands that packages contribute.

The core ships no command that needs a framework. A package adds one by naming a
`Command` in the ``llm_resilience.cli`` entry-point group of its ``pyproject.toml``;
the entry point's name is the command's name:

```toml
[project.entry-points."llm_resilience.cli"]
demo = "langchain_llm_resilience.demo:command"
```

Only the command that is run gets imported (``llm-resilience --help`` imports them all to
show their help). ``llm-resilience demo``, the offline simulated outage, comes with the
LangChain adapter; without it the command prints which packages to install and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points

__all__ = ["ENTRY_POINT_GROUP", "Command", "main"]

#: The entry-point group that packages register their commands in.
ENTRY_POINT_GROUP = "llm_resilience.cli"

#: Commands that other packages provide, and what to install to get each one.
_PROVIDED_ELSEWHERE: dict[str, str] = {
    "demo": 'pip install "langchain-llm-resilience[demo]"',
}


def _spend_command() -> Command:
    from llm_resilience import _cli_spend

    return Command(help=_cli_spend.HELP, run=_cli_spend.run, configure=_cli_spend.configure)


def _health_command() -> Command:
    from llm_resilience import _cli_health

    return Command(help=_cli_health.HELP, run=_cli_health.run, configure=_cli_health.configure)


#: Commands of the core itself (``spend``: see `llm_resilience._cli_spend`; ``health``:
#: see `llm_resilience._cli_health`), loaded like entry points, only when run; an
#: installed command of the same name does not replace them.
_BUILT_IN: dict[str, Callable[[], object]] = {
    "spend": _spend_command,
    "health": _health_command,
}

#: Exit code of a command that cannot run here (argparse uses 2 for usage errors too).
_UNAVAILABLE = 2


@dataclass(frozen=True, slots=True)
class Command:
    """One ``llm-resilience`` subcommand, as an entry point of ``llm_resilience.cli`` names it.

    ``run`` gets the parsed arguments and returns the process exit code; ``configure``, when
    given, adds the command's own arguments to its parser:

    ```python
    command = Command(help="run the offline outage demo", run=lambda arguments: 0)
    ```
    """

    #: One line for ``llm-resilience --help``.
    help: str
    #: Runs the command; returns the exit code.
    run: Callable[[argparse.Namespace], int]
    #: Adds the command's arguments to its subparser (None: the command takes none).
    configure: Callable[[argparse.ArgumentParser], None] | None = None


#: A command table: name to a loader that imports the command (an entry point's ``load``).
CommandTable = Mapping[str, Callable[[], object]]


def _installed_commands() -> dict[str, Callable[[], object]]:
    return {point.name: point.load for point in entry_points(group=ENTRY_POINT_GROUP)}


def _hint(name: str, problem: str) -> Callable[[argparse.Namespace], int]:
    install = _PROVIDED_ELSEWHERE.get(name, "reinstall the package that provides it")

    def run(_: argparse.Namespace) -> int:
        print(f"llm-resilience {name} {problem}: {install}", file=sys.stderr)
        return _UNAVAILABLE

    return run


def _load(name: str, loader: Callable[[], object]) -> Command | Callable[[argparse.Namespace], int]:
    """The command, or a stand-in that explains why it cannot run."""
    try:
        command = loader()
    except ImportError as error:
        # One line, whatever the message: the hint is all the user sees.
        reason = " ".join(str(error).split())
        return _hint(name, f"cannot be loaded ({type(error).__name__}: {reason})")
    if not isinstance(command, Command):
        return _hint(name, f"is registered as {type(command).__name__}, not a Command")
    return command


def _parser(commands: CommandTable, chosen: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-resilience",
        description="Fallback, rate limiting, spend budgets and retries for LLM calls.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in sorted({*commands, *_PROVIDED_ELSEWHERE}):
        if name not in commands:
            run = _hint(name, "needs a package that is not installed")
            sub = subparsers.add_parser(name, help="(not installed: see the hint it prints)")
            sub.set_defaults(run=run)
            continue
        if chosen is not None and name != chosen:
            # Not run: listed, not imported.
            subparsers.add_parser(name)
            continue
        command = _load(name, commands[name])
        if isinstance(command, Command):
            sub = subparsers.add_parser(name, help=command.help, description=command.help)
            if command.configure is not None:
                command.configure(sub)
            sub.set_defaults(run=command.run)
        else:
            sub = subparsers.add_parser(name, help="(cannot be loaded: see the hint it prints)")
            sub.set_defaults(run=command)
    return parser


def main(argv: Sequence[str] | None = None, *, commands: CommandTable | None = None) -> int:
    """Entry point of the ``llm-resilience`` console script; returns the exit code.

    ``commands`` replaces the installed entry points (name to loader), for tests.
    Usage errors exit through ``SystemExit(2)``, as argparse does.
    """
    arguments_given = list(sys.argv[1:] if argv is None else argv)
    table = {**(_installed_commands() if commands is None else commands), **_BUILT_IN}
    chosen = next((word for word in arguments_given if not word.startswith("-")), None)
    arguments = _parser(table, chosen).parse_args(arguments_given)
    code: int = arguments.run(arguments)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
