"""TOFU-format QA splits: objects with ``question`` and ``answer`` (optionally ``paraphrased_answer`` and
``perturbed_answer``), as in TOFU, MUSE knowmem and ``MiniBenchmark.to_json_dir``.

``load_split(source, name)`` reads a split from

* a file: a JSON array or JSON lines (``.json``/``.jsonl``) or Parquet (``.parquet``);
* a local directory in the hub layout: ``<dir>/<config>.<ext>``, ``<dir>/<config>/<split>.<ext>`` or
  ``<dir>/<split>.<ext>``;
* a Hugging Face dataset id (``locuslab/TOFU``, ``muse-bench/MUSE-News``) through ``datasets.load_dataset``.

``name`` is ``config`` (split ``train``, TOFU's layout) or ``config/split`` (MUSE: ``knowmem/forget_qa``).
"""

from __future__ import annotations

from pathlib import Path

from margincal.config.typed import brief
from margincal.core.errors import InputError, require
from margincal.core.inputs import MAX_JSON_BYTES, checked, parse_json, path_kind, read_text
from margincal.data.hub import could_be_hub_id, require_hub
from margincal.data.records import CHOICE_LETTERS, QARecord, choice_prompt

DATASETS = "pip install 'datasets>=2.19', or pass a local directory of TOFU-format files"

EXTENSIONS = (".json", ".jsonl", ".parquet")


def _text(row: dict, key: str, where: str, optional: bool = False) -> str | None:
    """``row[key]`` as a string (None for an absent or null optional field); any other value stops naming it."""
    value = row.get(key)
    if value is None and optional:
        return None
    if key not in row:
        raise InputError(f"{where} lacks the field {key!r}")
    if not isinstance(value, str):
        raise InputError(f"{where}: {key!r} must be a string, got {brief(value)}")
    return value


ROW_FIELDS = {  # the kinds of row a split may hold, as messages name them → the fields each needs
    "a QA row (TOFU, MUSE knowmem)": ("question", "answer"),
    "a four-choice row (WMDP, MMLU)": ("question", "choices", "answer"),
    "an Alpaca row": ("instruction", "output"),
    "a passage row (MUSE)": ("text",),
    "a completion row (MUSE verbmem)": ("prompt", "gt"),
}
ROW_KINDS = [f"{kind}: {', '.join(fields)}" for kind, fields in ROW_FIELDS.items()]


def unmatched(row: object, where: str) -> str:
    """Why ``row`` is of no kind in :data:`ROW_FIELDS`: the fields each kind it shares a field with still lacks (a
    WMDP row without ``answer``: "lacks 'answer' of a four-choice row ..."), or, sharing none, every kind."""
    if not isinstance(row, dict):
        return f"{where} is {brief(row)}, not an object of fields; give {' or '.join(ROW_KINDS)}"
    near = [(i, need) for i, need in enumerate(ROW_FIELDS.values()) if set(need) & set(row)]
    if not near:
        keys = ", ".join(repr(k) for k in list(row)[:6]) or "no fields"
        return f"{where} has {keys}, which is no kind of row margincal reads: {'; '.join(ROW_KINDS)}"
    lacks = [
        f"lacks {', '.join(repr(f) for f in need if f not in row)} of {ROW_KINDS[i]}"
        for i, need in near
        if any(f not in row for f in need)
    ]
    return f"{where} {'; or '.join(lacks)}"


def record_from_row(row: dict, where: str) -> QARecord:
    """One QA record from a TOFU-format row, or from a raw-passage row ``{"text": ...}`` (MUSE privleak; the
    passage becomes the answer of an empty question), or from a completion row ``{"prompt": ..., "gt": ...}`` (MUSE
    verbmem: the prefix and the passage's true continuation), or from an Alpaca row (``instruction``, ``input``,
    ``output``); any other row, or a field that is not a string (``perturbed_answer``: a string or a list of them),
    stops with a clear error. An optional ``facts`` object (attribute → value, as ``margincal mini export`` writes)
    lists what the answer states, for fact recall."""
    if isinstance(row, dict) and "instruction" in row and "output" in row:  # Alpaca (its "text" is the prompt copy)
        extra = _text(row, "input", where, optional=True) or ""
        question = _text(row, "instruction", where) + (f"\n\n{extra}" if extra else "")
        return QARecord(question=question, answer=_text(row, "output", where))
    if isinstance(row, dict) and "choices" in row:  # multiple choice: WMDP / MMLU (cais/wmdp, cais/mmlu)
        return choice_record(row, where)
    if isinstance(row, dict) and "text" in row and "question" not in row:
        return QARecord(question="", answer=_text(row, "text", where), meta={"kind": "passage"})
    if isinstance(row, dict) and "prompt" in row and "gt" in row and "question" not in row:
        return QARecord(
            question=_text(row, "prompt", where), answer=_text(row, "gt", where), meta={"kind": "completion"}
        )
    if not isinstance(row, dict) or "question" not in row or "answer" not in row:
        raise InputError(unmatched(row, where))
    if type(row["answer"]) is int and 0 <= row["answer"] < len(CHOICE_LETTERS):  # a four-choice row without choices
        raise InputError(
            f"{where} has no 'choices' field: its 'answer' is the index {row['answer']}, as in {ROW_KINDS[1]}; "
            "give the row its 'choices' (a list of 4 strings), or a QA row's answer as a string"
        )
    perturbed = row.get("perturbed_answer") or []
    perturbed = [perturbed] if isinstance(perturbed, str) else perturbed
    if not isinstance(perturbed, list) or not all(isinstance(p, str) for p in perturbed):
        raise InputError(f"{where}: 'perturbed_answer' must be a string or a list of strings, got {brief(perturbed)}")
    facts = row.get("facts")
    if isinstance(facts, dict):  # a Parquet struct column fills the attributes a row lacks with null
        facts = {k: v for k, v in facts.items() if v is not None}
    if facts is not None and not (
        isinstance(facts, dict) and facts and all(isinstance(v, str) and v for v in facts.values())
    ):
        raise InputError(f"{where}: 'facts' must map attribute names to non-empty strings, got {brief(facts)}")
    return QARecord(
        question=_text(row, "question", where),
        answer=_text(row, "answer", where),
        paraphrased_answer=_text(row, "paraphrased_answer", where, optional=True),
        perturbed_answers=tuple(perturbed),
        meta={"content": facts} if facts else {},
    )


def choice_record(row: dict, where: str) -> QARecord:
    """A four-choice row (``question``, ``choices``: four strings, ``answer``: the correct one's index 0–3, as
    cais/wmdp and cais/mmlu hold them) as a record: the question rendered as lm-eval renders it
    (:func:`~margincal.data.records.choice_prompt`), the answer its letter."""
    if "question" not in row or "answer" not in row:
        raise InputError(unmatched(row, where))
    choices, answer = row.get("choices"), row.get("answer")
    if (
        not isinstance(choices, list)
        or len(choices) != len(CHOICE_LETTERS)
        or not all(isinstance(c, str) for c in choices)
    ):
        raise InputError(f"{where}: 'choices' must be a list of {len(CHOICE_LETTERS)} strings, got {brief(choices)}")
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(CHOICE_LETTERS):
        raise InputError(f"{where}: 'answer' must be the correct choice's index 0-3, got {brief(answer)}")
    question = _text(row, "question", where)
    return QARecord(choice_prompt(question, choices), CHOICE_LETTERS[answer], meta={"kind": "choice"})


def records_from_rows(rows, where: str) -> list[QARecord]:
    """The QA records of TOFU-format rows (dicts, as a data file holds them), each checked; ``where`` names them in
    messages."""
    records = [record_from_row(row, f"{where} row {i}") for i, row in enumerate(rows)]
    if not records:
        raise InputError(f"{where} holds no QA records")
    return records


QA_FILE = "a TOFU-format JSON, JSON-lines or Parquet file"


def load_qa_json(path: str | Path) -> list[QARecord]:
    """Read a TOFU-format file (JSON, JSON lines or Parquet) through :mod:`margincal.core.inputs` (a regular file of at
    most :data:`~margincal.core.inputs.MAX_JSON_BYTES`, not empty); stops clearly on a missing file, an empty split or a
    bad row."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        size = checked(path, "the QA file", "file", QA_FILE).stat().st_size  # a regular file: its size is honest
        if size > MAX_JSON_BYTES:
            raise InputError(f"the QA file {path} is {size >> 20} MiB; at most {MAX_JSON_BYTES >> 20} MiB (split it)")
        return records_from_rows(pq.read_table(path).to_pylist(), str(path))
    text = read_text(path, "the QA file", MAX_JSON_BYTES, QA_FILE).strip()
    lines = [text] if text.startswith("[") else text.splitlines()
    rows = []
    for n, line in enumerate(lines, 1):
        where = f"{path}" if len(lines) == 1 else f"{path} line {n}"
        try:
            parsed = parse_json(line, where) if line.strip() else None
        except ValueError as err:  # strict and bounded (margincal.core.inputs.parse_json)
            raise InputError(str(err).replace(" is not valid JSON:", " is not valid JSON / JSON lines:")) from None
        if parsed is not None:
            rows += parsed if len(lines) == 1 and isinstance(parsed, list) else [parsed]
    return records_from_rows(rows, str(path))


def _local_file(root: Path, config: str, split: str | None) -> Path | None:
    stems = [f"{config}/{split}", f"{config}", f"{split}"] if split else [config]
    for stem in stems:
        for ext in EXTENSIONS:
            if (root / f"{stem}{ext}").exists():
                return root / f"{stem}{ext}"
    return None


def benchmark_source(data: str | Path) -> str | Path:
    """``data`` checked as a benchmark's source, the place every split of it is read from: a local directory of
    split files or a hub dataset id. One file cannot hold a benchmark's splits (read as each of them, forget and
    holdout would be one set): it stops, saying what to give."""
    kind = path_kind(Path(data))
    if kind not in ("directory", "missing"):
        raise InputError(
            f"--data {brief(str(data))} is not a directory: give the directory that holds the benchmark's split "
            "files (forget10.json, retain90.json, ...; margincal mini export DIR writes the mini's) or a hub "
            "dataset id; a single QA file goes to --forget"
        )
    return data


def load_split(source: str | Path, name: str) -> list[QARecord]:
    """Records of split ``name`` (``config`` or ``config/split``) from a file, a local directory or a hub id."""
    config, _, split = name.partition("/")
    path = Path(source)
    kind = path_kind(path)
    if kind not in ("directory", "missing"):  # a file; any other kind is named by the opener
        return load_qa_json(path)
    if kind == "directory":
        found = _local_file(path, config, split or None)
        if found is None:
            raise FileNotFoundError(
                f"split {name!r} not found in {path}: expected {config}.json|.jsonl|.parquet"
                + (f" or {config}/{split}.<ext>" if split else "")
            )
        return load_qa_json(found)

    if not could_be_hub_id(str(source)):
        raise FileNotFoundError(f"no such data file or directory: {path}")

    load_dataset = require("datasets", f"reading {str(source)!r} from the hub", DATASETS).load_dataset

    layout = f"{config}.json|.jsonl|.parquet" + (f" or {config}/{split}.<ext>" if split else "")
    require_hub(
        str(source),
        f"Save the dataset where the hub is reachable (datasets.load_dataset({str(source)!r}, {config!r}).to_json/"
        f"to_parquet, one file per config and split) and pass the directory as --data DIR (or the panel's data / "
        f"train_splits source); it must hold {layout}.",
        local="file or directory",
    )
    try:
        rows = load_dataset(str(source), config, split=split or "train")
    except Exception as err:  # hub unreachable, unknown id or config
        raise FileNotFoundError(
            f"could not load {source!r} ({config}, split {split or 'train'}) from the Hugging Face hub: {err}. "
            f"Without hub access, download it elsewhere and pass a local directory holding {config}.json|.jsonl|"
            ".parquet with the same field names."
        ) from err
    return records_from_rows(rows, f"{source}:{name}")
