"""Command-line interface: ``margincal <command> [--config FILE] [key=value ...]``.

:func:`build_parser` registers the commands of :mod:`margincal.cli.parsers` (argument parsing), whose bodies live in
:mod:`margincal.cli.commands`; :func:`main` is the one error path."""

from __future__ import annotations

import argparse
import difflib
import io
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

from margincal import __version__
from margincal.core.errors import InputError, NonFiniteLossError
from margincal.core.terminal import printable, quiet_libraries

EPILOG = "Overrides use dotted keys, e.g. `seeds=[1] out=runs/seed1 mc.kappa=2.0`."


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the usage is one ``--help`` away), exit status 2, with the
    closest known name for a mistyped command or option; an unknown option is named before any missing one."""

    def parse_known_args(self, args=None, namespace=None):
        """As argparse, after stopping on the first ``--option`` this command does not know (nor abbreviates)."""
        if not any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            known = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
            for token in sys.argv[1:] if args is None else args:
                if token == "--":
                    break
                flag = token.split("=", 1)[0]
                if flag.startswith("--") and not any(k.startswith(flag) for k in known):
                    close = difflib.get_close_matches(flag, known, n=1)
                    self.error(f"unrecognized argument {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            close = difflib.get_close_matches(choice[1], re.findall(r"'([^']*)'", choice[2]), n=1)
            message += f" (did you mean {close[0]}?)" if close else ""
        self.exit(2, f"{self.prog}: error: {printable(' '.join(message.split()))} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``margincal`` parser: ``--version`` and one subcommand per entry of :data:`parsers.COMMANDS`."""
    from margincal.cli.parsers import COMMANDS  # lazy: help

    parser = Parser(
        prog="margincal",
        description="Relearn-robust LLM unlearning: margin-cliff diagnostics and Margin Calibration (MC).",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"margincal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so it stops as on Ctrl-C: every temporary file and directory removed."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def crash_log(command: str, text: str) -> Path:
    """Write the traceback of an internal error to ``$MARGINCAL_LOGS`` (default: ``<tmp>/margincal-logs``)."""
    import tempfile
    import time

    logs = Path(os.environ.get("MARGINCAL_LOGS") or Path(tempfile.gettempdir()) / "margincal-logs")
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{time.strftime('%Y%m%d-%H%M%S')}-{command}-{os.getpid()}.log"
    path.write_text(f"margincal {' '.join(sys.argv[1:])}\n\n{text}")
    return path


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``argv`` parsed as ``margincal`` reads it: ``key=value`` overrides may also follow an option
    (``panel demo --dry-run seeds=[1]``); anything else unknown stops with a usage error (exit status 2)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    """Run a command. Exit status: 0 done; 1 a panel with failed cells, or an internal error (one line, its
    traceback in a log file named there: any exception not below, a bare ``ValueError`` included); 2 a bad input or
    setting (one line naming the file, key or value: an :class:`~margincal.core.errors.InputError`, a file the system
    refused to read or write (``OSError``), a non-finite loss); 130 Ctrl-C; 143 SIGTERM (both stop cleanly:
    temporary files removed, nothing half-written)."""
    quiet_libraries()
    parser = build_parser()
    args = parse_args(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    main_thread = threading.current_thread() is threading.main_thread()  # only there can a handler be set
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    stdin, sys.stdin = sys.stdin, io.StringIO()  # nothing margincal runs reads the terminal (a library's prompt: EOF)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Terminated:
        print(f"margincal {args.command}: terminated (SIGTERM); nothing half-written was left", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"margincal {args.command}: interrupted", file=sys.stderr)
        return 130
    except (InputError, OSError, NonFiniteLossError) as err:  # bad inputs (a file unreadable too): one clear line
        print(f"margincal {args.command}: error: {printable(' '.join(str(err).split()))}", file=sys.stderr)
        return 2
    except Exception as err:  # a bug or the machine (out of memory): one line, the traceback in a log file
        import traceback

        log = crash_log(args.command, traceback.format_exc())
        what = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        print(f"margincal {args.command}: internal error: {printable(what)} (traceback: {log})", file=sys.stderr)
        return 1
    finally:
        sys.stdin = stdin
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
