"""The quiet terminal: margincal's own progress lines on the stderr of the moment, third-party chatter held back
(per-file progress bars, absl INFO lines, a known deprecation warning). The CLI calls :func:`quiet_libraries` once
at start, and so does every worker a panel's executor starts (a SLURM job's cells log into their files quietly)."""

from __future__ import annotations

import logging
import sys
import unicodedata


class _StderrHandler(logging.StreamHandler):
    """A log handler writing to the ``sys.stderr`` of the moment (a redirected or replaced stream included), never to
    a stream that was current when it was made and may be closed since."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it: the property decides
        pass


class _PrintableFormatter(logging.Formatter):
    """A progress line with every control and format character escaped (:func:`printable`), line breaks kept: a
    checkpoint or file name in it can neither restyle the terminal nor reorder the line."""

    def format(self, record: logging.LogRecord) -> str:
        return printable_lines(super().format(record))


def quiet_libraries() -> None:
    """Keep the terminal for margincal's own progress (INFO lines of the ``margincal`` loggers) and hide
    per-file HF progress bars, absl INFO lines, a known transformers deprecation warning and bitsandbytes' notice,
    at import on a CPU with AVX512-BF16, that the optional ``kernels`` package is missing (its own kernels serve).

    transformers is quieted without being imported where it is not yet loaded (transformers 4.x imports torch with
    it, and ``margincal --help`` stays torch-free): it reads its verbosity from ``TRANSFORMERS_VERBOSITY`` (``error``
    unless the user set another) and its progress bars' state from huggingface_hub when it is first imported."""
    import os
    import warnings

    from huggingface_hub.utils import disable_progress_bars

    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    disable_progress_bars()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if "transformers" in sys.modules:  # already configured at its import: told directly
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity(hf_logging.log_levels.get(os.environ["TRANSFORMERS_VERBOSITY"], hf_logging.ERROR))
    logging.getLogger("absl").setLevel(logging.WARNING)
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    handler = _StderrHandler()
    handler.setFormatter(_PrintableFormatter("         %(message)s"))
    root = logging.getLogger("margincal")
    if not root.handlers:
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def printable(text: str) -> str:
    """``text`` safe to print: control characters (an escape sequence's ESC, a carriage return) and format
    characters (right-to-left marks, zero-width joiners) written as their ``\\x1b`` / ``\\u202e`` escapes, so a
    file name can neither restyle the terminal nor reorder the line it is shown in. Whitespace becomes a space."""
    out = []
    for char in text:
        if char in "\t\n":
            out.append(" ")
        elif unicodedata.category(char) in ("Cc", "Cf"):
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def printable_lines(text: str) -> str:
    """``text`` with each of its lines made :func:`printable`, its line breaks kept."""
    return "\n".join(printable(line) for line in text.split("\n"))


def say(text: object = "") -> None:
    """Print ``text`` to stdout as a command's result, each line made :func:`printable` (its line breaks kept): a
    user's path or name in it reaches the terminal escaped."""
    print(printable_lines(str(text)))
