"""What an audit is asked to audit, resolved from what the user named (the CLI's flags or the API's arguments):
the ``[NAME=]CKPT`` checkpoints of ``--model``, a ``--models`` file and a panel's results, a mini export's θ_ref,
θ0 and tier (``--data DIR`` holding a ``mini.json``), and the claimed metrics files, each checked and matched to
the checkpoint it names. Every check here runs before any model is read."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from margincal.auditing.interop import read_claimed
from margincal.auditing.population import seed_tag
from margincal.config.settings import DEFAULT_BENCHMARK, resolve_benchmark
from margincal.core.artifacts import check_name
from margincal.core.errors import InputError
from margincal.core.inputs import read_text
from margincal.reporting.records import read_records
from margincal.results.outputs import MiniExport, load


def entry(text: str, where: str) -> tuple[str, str | None]:
    """(checkpoint, name) of one ``[NAME=]CKPT`` entry (``where`` names it in messages: a flag, a file and line);
    the name is checked by the one name rule (:func:`margincal.core.artifacts.check_name`)."""
    name, sep, path = text.partition("=")
    if not sep or "/" in name:
        name, path = None, text
    if not path.strip():
        raise InputError(f"{where}: {text!r} names no checkpoint; write NAME=CKPT or CKPT")
    if name is not None:
        check_name(name, f"{where}: the checkpoint name")
    return path, name


def models_file(path: str) -> list[tuple[str, str | None]]:
    """The ``[NAME=]CKPT`` lines of a ``--models`` file (blank lines and ``#`` comments skipped); a problem names the
    file and the line."""
    lines = read_text(path, "--models", give="a text file, one [NAME=]CKPT per line").splitlines()
    out = []
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"--models {path} line {n}"
        if any(c.isspace() or not c.isprintable() for c in text):
            raise InputError(
                f"{where}: {text[:60]!r} holds a space or control character; give one [NAME=]CKPT per line (a path "
                "with spaces: link it to a name without)"
            )
        out.append(entry(text, where))
    if not out:
        raise InputError(f"--models {path} holds only comments; give one [NAME=]CKPT per line")
    return out


def panel_checkpoints(results: Path) -> list[str]:
    """``NAME=CKPT`` of every finished cell of a panel's results: its baseline (``<method>``, once per method and
    seed) and MC polish (``<method>+MC``, ``<method>+MC_<variant>`` for a variant other than ``reference``), with
    ``_s<seed>`` appended when the panel ran several seeds."""
    done, _, _ = read_records(results / "cells")
    if not done:
        raise InputError(f"--from-panel {results}: no finished cell records in {results / 'cells'}")
    seeds = {r.cell.seed for r in done}
    variants = [r.cell.variant for r in done]
    main = "reference" if "reference" in variants else variants[0]
    out: dict[str, str] = {}
    for rec in done:
        cell = rec.cell
        tag = seed_tag(cell.seed) if len(seeds) > 1 else ""
        out[f"{cell.method}{tag}"] = rec.sources["baseline/unlearn"]
        mc = "+MC" if cell.variant == main else f"+MC_{cell.variant}"
        out[f"{cell.method}{mc}{tag}"] = rec.sources["mc/polish"]
    return [f"{name}={path}" for name, path in out.items()]


def audited(
    model: Sequence[str] = (), models: str | None = None, from_panel: str | None = None
) -> list[tuple[str, str | None]]:
    """(checkpoint, name) of every ``model`` entry, ``models`` file line and ``from_panel`` cell; ``NAME=CKPT``
    names one."""
    out = [entry(text, "--model") for text in model]
    if models:
        out += models_file(models)
    if from_panel:
        out += [entry(text, f"--from-panel {from_panel}") for text in panel_checkpoints(Path(from_panel))]
    if not out:
        raise InputError("give at least one checkpoint to audit: --model CKPT, --models FILE or --from-panel RESULTS")
    return out


def mini_export(path: Path) -> MiniExport:
    """The ``mini.json`` at ``path`` (θ_ref, θ0 and tier of an audit on it), a typed :class:`MiniExport`."""
    export = load(path)
    if not isinstance(export, MiniExport):
        raise InputError(f"--data {path} is a {export.KIND} result, not a mini export's mini.json")
    return export


@dataclasses.dataclass(frozen=True)
class Floor:
    """The audit's benchmark, tier and floor/ceiling models once a mini export has filled in what it names;
    ``note`` says what it filled in (None when ``data`` is no mini export)."""

    benchmark: str | None
    tier: str
    ref: str | None
    theta0: str | None
    note: str | None = None


def floor_and_ceiling(
    data: str | None, benchmark: str | None, tier: str | None, ref: str | None, ref_logs: str | None, theta0: str | None
) -> Floor:
    """The benchmark, tier, θ_ref and θ0 an audit runs with: a mini export's (``data`` holding a ``mini.json``)
    fills those not given; a ``tier`` other than the export's stops (its θ_ref is the export tier's reference)."""
    exported = Path(data) / "mini.json" if data else None
    note = None
    if exported is not None and exported.is_file() and benchmark in (None, "mini"):
        mini = mini_export(exported)
        if tier is not None and tier != mini.tier:
            raise InputError(
                f"--tier {tier}: the mini export {data} is of {mini.tier} (its θ_ref is {mini.tier}'s reference); "
                f"export {tier} with margincal mini export DIR --tier {tier}"
            )
        benchmark, tier = "mini", mini.tier
        if ref_logs is not None:  # the export's θ_ref would be dropped for the logs without a word
            raise InputError(
                f"--ref-logs with the mini export {data}: the export gives θ_ref ({mini.ref}); drop --ref-logs, or "
                "give --data a folder of split files without a mini.json"
            )
        ref = ref or mini.ref
        theta0 = theta0 or mini.theta0
        note = f"mini export {data}: θ_ref {ref}, θ0 {theta0}"
    return Floor(benchmark, tier or resolve_benchmark(benchmark or DEFAULT_BENCHMARK).tier, ref, theta0, note)


def claimed(values: Sequence[str]) -> list[tuple[str | None, dict]]:
    """``--claimed [NAME=]FILE`` values, each file read and checked (:func:`.interop.read_claimed`)."""
    claims = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or Path(value).exists():
            name, path = None, value
        claims.append((name, read_claimed(path)))
    return claims


def match_claims(claims: list[tuple[str | None, dict]], names: list[str]) -> dict[str, dict]:
    """Each claim by the audited checkpoint it names (a bare FILE when one checkpoint is audited)."""
    matched: dict[str, dict] = {}
    for name, claim in claims:
        if name is None:
            if len(names) != 1:
                raise InputError(
                    f"--claimed {claim['path']}: {len(names)} checkpoints are audited; name one as NAME=FILE "
                    f"({', '.join(names)})"
                )
            name = names[0]
        if name not in names:
            raise InputError(f"--claimed {name}=…: no audited checkpoint is named {name} ({', '.join(names)})")
        if name in matched:
            raise InputError(f"--claimed: {name} has two claimed files; give one")
        matched[name] = claim
    return matched
