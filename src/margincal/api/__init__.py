"""margincal as a library: the public functions ``import margincal`` exposes, each returning a typed result
(:mod:`margincal.results.outputs`). The CLI parses its arguments and calls one of them.

A model is a local directory, a hub id (``org/name@revision``) or a model in memory (any ``torch.nn.Module`` with
a transformers ``config``, such as a ``PreTrainedModel``) with its tokenizer; data are TOFU-format files or lists of
records (:class:`~margincal.data.records.QARecord` or TOFU rows as dicts); settings are the typed config
dataclasses, mappings of their fields, or ``key=value`` overrides. Every input is checked before the first forward
pass (:class:`~margincal.core.errors.InputError`, one line; a file or model that does not exist: ``FileNotFoundError``).
:func:`evaluate`, :func:`unlearn` and :func:`attack` (without its instrumentation) on a model named by path or
hub id, :func:`audit` and :func:`run_panel` run as plans through the store
(:func:`margincal.pipeline.graph.run_graph`), so a repeated call, or a panel or audit that needs the same stage,
reads it from there; on a model in memory they compute (the model is copied, never changed), as :func:`polish`
does, and write to ``out``.

Every function's docstring has an example; in them ``mini`` is a mini export (``margincal mini export DIR`` on
the command line, :func:`mini_export` here, or ``margincal.load("DIR/mini.json")``: the mini θ0, θ_ref and split
files) and ``tmp`` a scratch directory. ``tests/integration/test_api.py`` runs them on the smoke-size mini::

    import margincal

    mini = margincal.load("runs/mini/mini.json")
    d = margincal.diagnose(mini.theta0, f"{mini.dir}/forget10.json", ref=mini.ref)
    print(d.delta, d.label)
"""

from margincal.api.audits import audit, population
from margincal.api.evaluation import diagnose, evaluate
from margincal.api.mini import mini_export
from margincal.api.panels import report, run_panel
from margincal.api.training import anchors, attack, polish, unlearn
from margincal.core.errors import InputError
from margincal.results.cards import CheckpointCard
from margincal.results.outputs import (
    AttackResult,
    AuditCard,
    Diagnosis,
    Evaluation,
    MiniExport,
    PanelResult,
    Polished,
    Result,
    Unlearned,
    load,
)

__all__ = [  # margincal.PUBLIC names the same, in this order (tests/integration/test_api.py)
    "diagnose",
    "evaluate",
    "unlearn",
    "polish",
    "attack",
    "anchors",
    "audit",
    "population",
    "run_panel",
    "report",
    "mini_export",
    "load",
    "InputError",
    "Result",
    "Diagnosis",
    "Evaluation",
    "Unlearned",
    "Polished",
    "AttackResult",
    "AuditCard",
    "CheckpointCard",
    "PanelResult",
    "MiniExport",
]
