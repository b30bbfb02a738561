"""MMLU (and any multiple-choice task) through lm-evaluation-harness, on an in-memory model.

``lm_eval_accuracy(model, tokenizer, ["mmlu"])`` runs the harness's own task (zero-shot, log-likelihood of each
choice letter); it needs the hub for the dataset. ``local_task`` writes a task definition for a local JSON-lines
file in MMLU's layout (``question``, ``choices``, ``answer`` index) with the same prompt as lm-eval's ``mmlu``
template, so the wrapper runs offline; the package ships ``tasks/general_mc.jsonl`` (16 hand-written
general-knowledge questions) for tests and the mini benchmark.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from unittest import mock

from margincal.core.errors import require

LM_EVAL = "pip install 'margincal[mmlu]' (or use --mmlu local, the offline multiple-choice set)"

TASKS_DIR = Path(__file__).with_name("tasks")
GENERAL_MC = TASKS_DIR / "general_mc.jsonl"
MMLU_PROMPT = (
    "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\nD. {{choices[3]}}\nAnswer:"
)


def local_task(jsonl: str | Path, name: str, directory: str | Path) -> Path:
    """Write an lm-eval task YAML for ``jsonl`` (MMLU layout, four choices) into ``directory``; returns it."""
    jsonl = Path(jsonl).resolve()
    if not jsonl.exists():
        raise FileNotFoundError(f"multiple-choice file not found: {jsonl}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spec = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(jsonl)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": MMLU_PROMPT,
        "doc_to_choice": ["A", "B", "C", "D"],
        "doc_to_target": "answer",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }
    path = directory / f"{name}.yaml"
    path.write_text(json.dumps(spec, indent=2))  # JSON is valid YAML
    return path


@contextlib.contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    """Keep lm-eval's expected WARNING lines (a pre-initialised model, num_fewshot 0), its progress bars and the
    ``git describe`` it runs for its own results header (``fatal: not a git repository`` outside a checkout) off
    the terminal. Its failures still raise."""
    evaluator = require("lm_eval.evaluator", "MMLU through lm-eval (--mmlu mmlu)", LM_EVAL)

    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with (
            mock.patch.object(evaluator, "get_git_commit_hash", lambda: None),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            yield
    finally:
        logger.setLevel(level)


def lm_eval_accuracy(
    model,
    tokenizer,
    tasks: Sequence[str] = ("mmlu",),
    include_path: str | Path | None = None,
    batch_size: int = 8,
    limit: int | None = None,
    builtin: bool = True,
) -> dict[str, dict[str, float]]:
    """Zero-shot accuracy (and its standard error) per task from ``lm_eval.simple_evaluate``; ``include_path`` adds
    a directory of task YAMLs, and ``builtin=False`` leaves lm-eval's own tasks unindexed (their index takes about
    15 s on a 2-core CPU, needless for local tasks alone)."""
    require("lm_eval", "MMLU through lm-eval (--mmlu mmlu)", LM_EVAL)
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    with _quiet_lm_eval():
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
        path = str(include_path) if include_path else None
        manager = TaskManager(include_path=path, include_defaults=builtin)
        result = simple_evaluate(
            model=lm, tasks=list(tasks), num_fewshot=0, task_manager=manager, limit=limit, log_samples=False
        )
    return {
        task: {"acc": float(r["acc,none"]), "acc_stderr": float(r.get("acc_stderr,none", float("nan")))}
        for task, r in result["results"].items()
        if "acc,none" in r
    }


def mmlu_accuracy(model, tokenizer, which: str) -> tuple[float, dict]:
    """(accuracy, lm-eval's per-task results) for ``which``: ``local`` (the shipped offline multiple-choice set) or
    an lm-eval task name such as ``mmlu`` (needs the hub)."""
    import tempfile

    task = "margincal_general_mc" if which == "local" else which
    with tempfile.TemporaryDirectory() as tasks:
        if which == "local":
            local_task(GENERAL_MC, task, tasks)
        local = which == "local"
        accs = lm_eval_accuracy(model, tokenizer, [task], include_path=tasks if local else None, builtin=not local)
    return accs[task]["acc"], accs
