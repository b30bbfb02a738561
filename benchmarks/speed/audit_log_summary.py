"""Seconds an audit's log spent per kind of work: graph stages (by attack or quantizer), searched trials and
candidate runs per family, and the trials per minute of trial time (the lines ``margincal audit`` prints; a stage
read from the store counts 0 s). Usage: ``python benchmarks/speed/audit_log_summary.py AUDIT.log``."""

from __future__ import annotations

import collections
import re
import sys


def summary(lines: list[str]) -> dict[str, tuple[float, int]]:
    """kind of work → (seconds, lines) over every line ending in ``<seconds> s``."""
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter = collections.Counter()
    for line in lines:
        timed = re.search(r"(\d+(?:\.\d+)?) s$", line.strip())
        if not timed:
            continue
        if line.lstrip().startswith("search "):
            kind = "trial " + line.split()[2]
        elif "/searched/" in line:
            kind = "candidate " + line.split("/searched/")[1].split("/")[1]
        elif "/attack/" in line:
            kind = "graph attack " + line.split("/attack/")[1].split("@")[0]
        else:
            kind = "graph " + line.split("]", 1)[1].split(":")[0].strip().split("/", 1)[-1].split("/")[0]
        seconds[kind] += float(timed.group(1))
        counts[kind] += 1
    return {kind: (seconds[kind], counts[kind]) for kind in sorted(seconds, key=lambda k: -seconds[k])}


def main(path: str) -> None:
    with open(path, encoding="utf-8") as handle:
        rows = summary(handle.read().splitlines())
    for kind, (s, n) in rows.items():
        print(f"{kind:40s} {s:8.1f} s  {n:4d}")
    trials = [(s, n) for kind, (s, n) in rows.items() if kind.startswith("trial ")]
    spent, count = sum(s for s, _ in trials), sum(n for _, n in trials)
    print(
        f"total {sum(s for s, _ in rows.values()):.1f} s; {count} trials in {spent:.1f} s: "
        f"{60 * count / spent:.1f} trials/min"
    )


if __name__ == "__main__":
    main(sys.argv[1])
