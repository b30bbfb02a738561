"""TOFU-format QA files: a JSON array or JSON-lines of objects with ``question`` and ``answer`` (and optionally
``paraphrased_answer`` and ``perturbed_answer``), as in the TOFU dataset and ``MiniBenchmark.to_json_dir``."""

from __future__ import annotations

import json
from pathlib import Path

from margincal.data.records import QARecord


def load_qa_json(path: str | Path) -> list[QARecord]:
    """Read a TOFU-format split; stops with a clear error on a missing file, an empty split or a bad row."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"QA file not found: {path}")
    text = path.read_text().strip()
    if not text:
        raise ValueError(f"{path} is empty")
    rows = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines() if line]
    records = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise ValueError(f"{path} row {i} has no 'question'/'answer' fields")
        perturbed = row.get("perturbed_answer") or ()
        records.append(
            QARecord(
                question=row["question"],
                answer=row["answer"],
                paraphrased_answer=row.get("paraphrased_answer"),
                perturbed_answers=tuple([perturbed] if isinstance(perturbed, str) else perturbed),
            )
        )
    if not records:
        raise ValueError(f"{path} holds no QA records")
    return records
