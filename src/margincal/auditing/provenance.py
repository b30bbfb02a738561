"""Where an audited checkpoint came from, as its own files and the audit's run say: the card's provenance block.

Per checkpoint: what the audit loaded (the path or hub id, its pinned revision or weights digest), its lineage (the
base model a LoRA adapter names, with that base's identity; the ``_name_or_path`` a full checkpoint's
``config.json`` names, if any), its license (the model card's front matter ``license:`` in ``README.md``, else a
``license`` field of ``config.json``, else "not stated"), and, for a checkpoint margincal produced, the run that
produced it (its ``stage.json`` manifest: command, seed, commit, method and settings). That last is *verified* when
the checkpoint is an entry of the audit's own store (its content is a function of its key), and otherwise only what
the file states. Per audit: the data identity, the command, the digest of the stage graph (every node's key), the
package versions and the device.
"""

from __future__ import annotations

import re
from pathlib import Path

from margincal.auditing.plan import AuditPlan, Checkpoint
from margincal.core.artifacts import cpu_name, digest, package_versions
from margincal.core.inputs import read_head, read_json
from margincal.results.base import json_copy
from margincal.results.cards import Lineage, ProducedBy, Provenance, RunProvenance

NOT_STATED = "not stated"


def read_license(directory: Path) -> tuple[str, str | None]:
    """(license, the file stating it): ``README.md``'s YAML front matter ``license:``, else ``config.json``'s
    ``license``, else ("not stated", None)."""
    card = directory / "README.md"
    if card.is_file():
        text = read_head(card, 20_000)
        front = re.match(r"---\s*\n(.*?)\n---", text, re.S)
        found = front and re.search(r"^license:\s*['\"]?([^'\"\n]+?)['\"]?\s*$", front.group(1), re.M)
        if found:
            return found.group(1), "README.md"
    value = config_field(directory, "license")
    return (value, "config.json") if value else (NOT_STATED, None)


def config_field(directory: Path, key: str) -> str | None:
    """A non-empty string field of ``directory/config.json`` (stripped), else None (no file, not JSON, no field)."""
    config = directory / "config.json"
    try:
        value = read_json(config).get(key) if config.is_file() else None
    except (OSError, ValueError, AttributeError):
        value = None
    return value.strip() if isinstance(value, str) and value.strip() else None


def lineage(ckpt: Checkpoint) -> Lineage:
    """The base a LoRA adapter names (``adapter_config.json``) with its identity, or the ``_name_or_path`` a full
    checkpoint's ``config.json`` names (not identified: it is a name the file states)."""
    if ckpt.base is not None:
        base = shown_model(ckpt.base)
        return Lineage(base=base, base_identity=ckpt.identity.partition("+")[2], named_in="adapter_config.json")
    named = shown_model(config_field(Path(ckpt.path), "_name_or_path"))
    return Lineage(base=named, base_identity=None, named_in="config.json" if named else None)


def shown_model(spec: str | None) -> str | None:
    """A checkpoint as a card names it: a local path inside the working directory relative to it (a committed card
    holds no machine's path), anything else (a hub id, a path elsewhere, none) as given."""
    if not spec:
        return spec
    path = Path(spec)
    if path.is_absolute() and path.is_relative_to(Path.cwd()):
        return path.relative_to(Path.cwd()).as_posix()
    return spec


def shown_command(command: str | None) -> str | None:
    """A recorded command as a card shows it: its program by name, not by the path it ran from."""
    if not command:
        return command
    program, _, rest = command.partition(" ")
    return " ".join(filter(None, (Path(program).name, rest)))


def produced_by(ckpt: Checkpoint, in_store: bool) -> ProducedBy | None:
    """The margincal run that produced a checkpoint: the manifest of the ``stage.json`` beside its ``model/``
    (command, seed, commit, the method's settings, the θ0 it started from); ``verified`` when the checkpoint is an
    entry of the audit's store."""
    path = Path(ckpt.path)
    stage = path.parent / "stage.json" if path.name == "model" else path / "stage.json"
    if not stage.is_file():
        return None
    try:
        record = read_json(stage, "stage.json")
    except ValueError:
        return None
    manifest = record.get("manifest") if isinstance(record, dict) else None
    if not isinstance(manifest, dict):
        return None
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    return ProducedBy(
        stage=record.get("stage"),
        command=shown_command(manifest.get("command")),
        seed=manifest.get("seed"),
        git_commit=manifest.get("git_commit"),
        method=config.get("run"),
        theta0=shown_model(config.get("theta0", config.get("model"))),
        verified=in_store,
    )


def checkpoint_provenance(ckpt: Checkpoint) -> Provenance:
    """One checkpoint's block (module docstring)."""
    local = Path(ckpt.path).is_dir()
    license_, source = read_license(Path(ckpt.path)) if local else (NOT_STATED, None)
    in_store = not ckpt.identity.startswith(("local@", "adapter@")) and local
    return Provenance(
        model=shown_model(ckpt.shown),
        identity=ckpt.identity,
        revision=ckpt.revision,
        lineage=lineage(ckpt) if local else Lineage(base=None, base_identity=None, named_in=None),
        license=license_,
        license_source=source if local else "a hub model card is not read (offline); see the hub page",
        produced_by=produced_by(ckpt, in_store) if local else None,
    )


def device_name(device: str) -> str:
    """The accelerator's name for a CUDA device, else the CPU's."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return cpu_name()


def run_provenance(plan: AuditPlan, command: str) -> RunProvenance:
    """The audit's own run: data identity (as card.json holds it, the spec's tuples as lists: the card read back is
    this one), command, graph digest, versions, device."""
    return RunProvenance(
        data=json_copy(plan.data_id),
        command=command,
        graph_digest=digest({node.label: node.key for node in plan.graph.nodes}),
        versions=package_versions(),
        device=device_name(plan.device),
    )
