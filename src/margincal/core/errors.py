"""The one error that means "bad input or setting", :class:`InputError`, and its kinds: the CLI prints any of them
as one line (no traceback) and exits 2. Every other exception (a bare ``ValueError`` included) is a bug or the
machine: the CLI reports it as internal, exit 1, with its traceback in a log file."""

from __future__ import annotations

import importlib
from types import ModuleType


class InputError(ValueError):
    """An input or setting that is not what margincal takes (a file of the wrong kind, too large, empty, malformed; a
    setting out of range; an unknown name): one line naming the input and what to give instead. Every check of user
    input raises it or one of its kinds; a ``ValueError`` subclass, so ``except ValueError`` keeps catching it."""


class RefusedError(InputError):
    """An external tool refused what margincal asked of it (sbatch a submission, Ray its start-up): one line with the
    tool's own reason, exit 2, and nothing of the refused run left behind."""


def refusal(err: BaseException) -> str:
    """An external tool's reason as one bounded line (its first 300 characters, white space collapsed)."""
    return " ".join(f"{err}".split())[:300] or type(err).__name__


class NonFiniteLossError(RuntimeError):
    """The loss or gradient became NaN/inf; training stopped before the update was applied."""


class CodebookError(InputError):
    """bitsandbytes did not store the named 4-bit codebook for a layer on this machine (its kernels differ by CPU)."""


class MissingPackageError(InputError):
    """An optional package a feature needs is not installed: one line naming the feature and the install command."""


def require(module: str, needed_for: str, install: str) -> ModuleType:
    """Import ``module`` where a feature first needs it (``needed_for``: "the Ray executor"); when it is not
    installed, stop with one line saying what needs it and how to install it (``install``), so the core path runs
    on a machine without the optional packages (lm-eval, ray, submitit, datasets, bitsandbytes, rouge-score)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        package = module.split(".")[0]
        what = f"{needed_for} needs the package {package}, which is not installed here ({type(err).__name__})"
        raise MissingPackageError(f"{what}: {install}") from None
