"""Errors that mean "bad input or setting": the CLI prints them as one line (no traceback) and exits 2."""

from __future__ import annotations


class NonFiniteLossError(RuntimeError):
    """The loss or gradient became NaN/inf; training stopped before the update was applied."""
