"""Per-sample exports of an audit: every answer every model gave, unattacked and under every attack and quantizer, in
one Parquet table (``samples.parquet`` beside ``card.json``).

One row per (model, row, draw, forget record), the columns of :data:`SCHEMA` (stable: a new column is appended, none
is renamed or dropped without a new ``schema`` value in the file's metadata):

* ``model``: the audited checkpoint's name, ``reference`` (θ_ref, the floor) or ``theta0`` (the ceiling);
* ``row``: the card row, an attack label (``lora_r8@20``) or quantizer preset (``nf4``), ``unattacked``, or a searched
  family's winner or preset on the relearn pool's draws, named by the K and values it ran at
  (``searched lora_r8@18 (lr 0.0031, steps 45, lora.r 16) of NPO``: NPO's winner, on NPO, θ_ref and θ0;
  ``preset lora_r8@20 (...) of NPO``);
* ``kind``: ``attack``, ``quantize``, ``searched`` or ``unattacked``; ``draw``: the D_rel draw (its seed) of an attack,
  else null;
* ``record``: the record's position in the audited forget split (an attack's rows are its held-out records);
* ``question``, ``gold``, ``generated``: the question, its answer and the model's greedy answer;
* ``rouge_l``, ``rouge_l_f1``: ROUGE-L recall and F1 of the answer; ``fact_recall``: the share of the record's facts
  the answer states (null where records carry none);
* ``degenerate``: the answer repeats itself (:class:`margincal.auditing.rules.DegenerateRule`);
* ``config``: the row's budget as the card shows it (JSON; ``{}`` for ``unattacked``; a winner's searched values);
* ``correct``: on a multiple-choice benchmark (WMDP), 1 when the predicted letter (``generated``) is the gold one
  (the ROUGE-L columns are then null), else null.
"""

from __future__ import annotations

import json
from pathlib import Path

from margincal.auditing.card import CardBuilder
from margincal.auditing.rules import card_rules
from margincal.auditing.search import SEARCHED, reported_label, searched_label
from margincal.results.base import json_copy
from margincal.results.cards import CheckpointCard

SCHEMA_VERSION = 1
SCHEMA = (
    ("model", "string"),
    ("row", "string"),
    ("kind", "string"),
    ("draw", "int32"),
    ("record", "int32"),
    ("question", "string"),
    ("gold", "string"),
    ("generated", "string"),
    ("rouge_l", "float64"),
    ("rouge_l_f1", "float64"),
    ("fact_recall", "float64"),
    ("degenerate", "bool"),
    ("config", "string"),
    ("correct", "float64"),
)


def sample_rows(builder: CardBuilder, cards: dict[str, CheckpointCard]) -> list[dict]:
    """Every model's per-sample answers (the audited checkpoints', θ_ref's and θ0's), unattacked and under each card
    row; ``cards`` gives each row's budget (as the card's JSON writes it)."""
    degenerate = card_rules().degenerate
    plan = builder.plan
    budgets = {
        label: json_copy(v.budget)
        for card in cards.values()
        for label, v in {**card.attacks, **card.quantization}.items()
    }
    rows = []

    def add(model: str, row: str, kind: str, draw: int | None, records: list[int], samples: list[dict]) -> None:
        config = json.dumps(budgets.get(row, {}), sort_keys=True)
        for record, s in zip(records, samples, strict=True):
            rows.append(
                {
                    "model": model,
                    "row": row,
                    "kind": kind,
                    "draw": draw,
                    "record": record,
                    "question": s["question"],
                    "gold": s["gold"],
                    "generated": s["generated"],
                    "rouge_l": s.get("rouge_l"),
                    "rouge_l_f1": s.get("rouge_l_f1"),
                    "fact_recall": s.get("fact_recall"),
                    "degenerate": degenerate(s["generated"]),
                    "config": config,
                    "correct": s.get("correct"),
                }
            )

    for model in plan.models:
        unattacked = builder.evals[model]["splits"]["forget"]["samples"]
        add(model, "unattacked", "unattacked", None, list(range(len(unattacked))), unattacked)
        for spec in plan.budget.specs():
            for draw in range(plan.budget.draws):
                result = builder.result(f"{model}/attack/{spec.label}/d{draw}", "attack.json")
                add(model, spec.label, "attack", draw, result["heldout"], result["samples"])
        for preset in plan.budget.quantizers:
            result = builder.result(f"{model}/quantize/{preset}", "quantized.json")
            add(model, preset, "quantize", None, list(range(len(result["samples"]))), result["samples"])
    for name, searched in builder.searches.items():  # each searched family's preset and winner, on the pool draws
        for preset, record in searched.items():
            for which, reported in record["reported"].items():
                label = searched_label(preset, reported["k"], reported["params"])
                row = f"{'searched' if which == 'winner' else 'preset'} {label} of {name}"
                budgets[row] = {"k": reported["k"], **reported["params"]}
                for model in [name, *(r for r in plan.models if r not in plan.audited)]:
                    for draw in range(plan.budget.draws):
                        ran = reported.get("row", which)  # the candidate's own runs (cards before issue 73: which)
                        done = f"{model}/{SEARCHED}/{reported_label(name, preset, ran, draw)}"
                        result = builder.result(done, "attack.json")
                        add(model, row, SEARCHED, draw, result["heldout"], result["samples"])
    return rows


def write_samples(rows: list[dict], path: Path) -> Path:
    """``rows`` as a Parquet table of :data:`SCHEMA` (its version in the file's metadata)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(name, kind) for name, kind in SCHEMA], metadata={"schema": str(SCHEMA_VERSION)})
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, path)
    return path
