"""Command-line interface: ``margincal <command> [--config FILE] [key=value ...]``.

:func:`build_parser` registers the commands of :mod:`margincal.cli.parsers` (argument parsing), whose bodies live in
:mod:`margincal.cli.commands`; :func:`main` is the one error path."""

from __future__ import annotations

import argparse
import os
import sys

from margincal.errors import NonFiniteLossError

EPILOG = "Overrides use dotted keys, e.g. `seeds=[1] out=runs/seed1 mc.kappa=2.0`."


def build_parser() -> argparse.ArgumentParser:
    """The ``margincal`` parser: ``--version`` and one subcommand per entry of :data:`parsers.COMMANDS`."""
    from margincal import __version__
    from margincal.cli.parsers import COMMANDS

    parser = argparse.ArgumentParser(
        prog="margincal",
        description="Relearn-robust LLM unlearning: margin-cliff diagnostics and Margin Calibration (MC).",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"margincal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def _quiet_libraries() -> None:
    """Keep the terminal for margincal's own progress (INFO lines of the ``margincal`` loggers) and hide
    per-file HF progress bars, absl INFO lines and a known transformers deprecation warning."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    logging.getLogger("absl").setLevel(logging.WARNING)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("         %(message)s"))
    root = logging.getLogger("margincal")
    if not root.handlers:
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Run a command. Bad inputs (ValueError, a missing file, a non-finite loss) end with one line and exit 2; any
    other error (CUDA out of memory, a bug) keeps its full traceback."""
    _quiet_libraries()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # key=value overrides may follow an option (`panel demo --dry-run seeds=[1]`)
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into e.g. `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"margincal {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, NonFiniteLossError) as err:  # bad inputs: one clear line
        print(f"margincal {args.command}: error: {err}", file=sys.stderr)
        return 2
