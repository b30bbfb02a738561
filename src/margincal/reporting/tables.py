"""Markdown table helpers of the panel report."""

from __future__ import annotations

import re


def arrow(base: float, mc: float, lower_is_better: bool, spec: str = ".3f") -> str:
    """``base → mc`` with the MC value in bold when it improves on the baseline."""
    better = mc < base if lower_is_better else mc > base
    mc_s = format(mc, spec)
    return f"{format(base, spec)} → {'**' + mc_s + '**' if better else mc_s}"


def cell(text: str) -> str:
    """A table cell's text on one line: line breaks as ``<br>`` (a multiple-choice prompt keeps its layout), pipes
    escaped."""
    return re.sub(r"\r\n|\r|\n", "<br>", text.replace("|", "\\|"))  # CommonMark's line endings


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown (GitHub) table of ``header`` and ``rows``, every cell one line with its pipes escaped (:func:`cell`),
    so each row has the header's columns."""
    lines = ["| " + " | ".join(cell(c) for c in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
