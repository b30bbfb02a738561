"""Held-out monitors of a training run: signals computed every few optimizer steps on fixed samples (issue 27).

Each pass computes, under ``no_grad`` and timed part by part (``seconds/forget`` the forget sample's scoring, Δ and the
TOFU-kind members; ``seconds/mia``, ``seconds/utility``):

* ``delta``: Δ = m_θ(D_f) − m_ref on evaluation forget records outside the training pool, encoded and aggregated
  as the benchmark's evaluator does (:class:`DeltaCheck`);
* ``auc/<d>``: the membership AUC of each forward-only detector d (loss, min-k, zlib;
  :mod:`margincal.evaluation.mia`, forget labelled 0) on forget vs holdout samples (TOFU kind: the members are Δ's
  forget sample, scored once for both), and ``privleak/<d>``, its privleak (%) against θ_ref's AUC on the same
  samples (0: θ_ref's membership signal);
* ``utility``: the utility proxy, the mean answer NLL (nats/token) of utility records no method trains on (TOFU
  and the mini: real authors and world facts, less a split used as a training environment; MUSE: retain knowmem
  QA under its few-shot prompts; the CLI's ``--utility`` files, role ``utility``, when given);
Samples are drawn once per run (seeded), so every pass compares the same records. A polish's probe KL is not
re-measured here: the training loss computes it at every step, and the monitor hook records its mean between passes
(:meth:`margincal.training.controller.MonitorHook.observe`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch

from margincal.config.settings import BenchmarkSpec, MonitorConfig
from margincal.core.errors import InputError
from margincal.data.benchmarks import shots_of
from margincal.data.records import EncodedQA, QARecord, encode_qa, encode_text, is_passage, seeded_subset
from margincal.evaluation import mia
from margincal.evaluation.wmdp import encode_choices
from margincal.model.margin import diagnose
from margincal.model.scoring import score_dataset
from margincal.results.base import Diagnosis
from margincal.results.metric_table import privleak


@dataclasses.dataclass
class DeltaCheck:
    """Δ(θ) = m_θ − m_ref on a fixed check set of evaluation forget records, as the benchmark's evaluator diagnoses
    it: ``examples`` are those records encoded as the evaluator encodes them, ``aggregate`` is the benchmark's
    (mean: TOFU and mini; median: MUSE). Build it with :func:`delta_check`; calling it returns Δ."""

    examples: list[EncodedQA]
    indices: list[int]  # positions of the check records among the evaluation forget records
    aggregate: str
    m_ref: float
    pad_id: int
    batch_size: int = 32

    def diagnosis(self, model) -> Diagnosis:
        stats = score_dataset(model, self.examples, self.pad_id, self.batch_size)
        return diagnose(stats, self.m_ref, how=self.aggregate)

    def __call__(self, model) -> float:
        return float(self.diagnosis(model).delta)

    def row(self, model) -> dict:
        """A monitor row with Δ alone (the Δ-stop variant's monitor)."""
        return {"delta": self(model)}


def _tokens(example: EncodedQA) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(example.prompt_ids), tuple(example.answer_ids)


def delta_check(
    tokenizer,
    spec: BenchmarkSpec,
    records: Sequence[QARecord],
    m_ref: float,
    shots: Sequence[QARecord] = (),
    pool: Sequence[EncodedQA] = (),
    size: int | None = None,
    seed: int = 0,
    batch_size: int = 32,
) -> DeltaCheck:
    """The Δ check of Δ-stop and of the coercivity trace, on the scale of ``m_ref`` (θ_ref's m(D_f) by the
    benchmark's evaluator, :func:`margincal.pipeline.stages.reference_margin`).

    ``records`` are the evaluation forget records, ``shots`` the split's few-shot pairs
    (:func:`margincal.data.benchmarks.shots_of`): they are encoded by the evaluator's encoder
    (:func:`margincal.data.records.encode_qa` with those shots, as :func:`margincal.evaluation.muse.evaluate_muse`
    does; TOFU-kind benchmarks have no few-shot) and Δ is :func:`margincal.model.margin.diagnose` with
    ``spec.aggregate``, so a check over the same records gives the evaluator's Δ. ``pool`` is the polish pool (training
    encodings): records whose plain QA encoding (the training encoding of QA records) is a pool example are left out,
    which holds out the pool where training forget = evaluation forget (TOFU, mini; WMDP's questions when MC hinges on
    them, each encoded as its evaluator encodes it); training passages (MUSE's raw news) match no record. If every
    record is in the pool, all are used. ``size`` (None: all) draws a seeded subset of the rest
    (:func:`~margincal.data.records.seeded_subset`)."""

    def encoded(recs: Sequence[QARecord], shots: Sequence[QARecord] = ()) -> list[EncodedQA]:
        if spec.kind == "wmdp":  # four-choice questions: the answer-letter margin, encoded as the evaluator does
            return encode_choices(tokenizer, recs, spec.description, spec.max_length)
        return encode_qa(tokenizer, recs, spec.max_length, shots=shots)

    chosen = list(range(len(records)))
    if pool:
        used = {_tokens(e) for e in pool}
        rest = [e.index for e in encoded(records) if _tokens(e) not in used]
        chosen = rest or chosen
    chosen = seeded_subset(chosen, size, seed + 1)
    examples = encoded([records[i] for i in chosen], shots)
    return DeltaCheck(examples, chosen, spec.aggregate, m_ref, tokenizer.pad_token_id, batch_size)


def _encode(tokenizer, records: Sequence[QARecord], max_length: int, shots: Sequence[QARecord] = ()):
    """Records as their evaluator scores them: passages as plain text, QA pairs through the prompt template."""
    if records and all(is_passage(r) for r in records):
        return encode_text(tokenizer, [r.answer for r in records], max_length)
    return encode_qa(tokenizer, records, max_length, shots=shots)


def utility_roles(spec) -> list[str]:
    """The evaluation roles the utility proxy reads: records no method trains on (see the module docstring)."""
    if spec.kind == "muse":
        return ["retain"]
    trained = {v for v in spec.train_splits.values() if isinstance(v, str)}
    return [r for r in ("real_authors", "world_facts") if r in spec.splits and spec.splits[r] not in trained]


@dataclasses.dataclass
class MonitorSamples:
    """The fixed samples of one run's monitors (build with :func:`monitor_samples`). ``forget`` is the Δ check's
    held-out forget sample (its ``m_ref`` is None without θ_ref); ``members`` the membership sample when it is not
    that one (MUSE's privleak passages), so a TOFU-kind pass scores the forget sample once for both."""

    forget: DeltaCheck
    m_ref: float | None
    members: list[EncodedQA] | None
    nonmembers: list[EncodedQA]
    utility: list[EncodedQA]
    pad_id: int
    texts: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # zlib's answer texts per MIA side


def monitor_samples(
    tokenizer,
    spec,
    splits: dict[str, list[QARecord]],
    cfg: MonitorConfig,
    seed: int,
    m_ref: float | None = None,
    pool: Sequence[EncodedQA] = (),
) -> MonitorSamples:
    """Seeded samples of at most ``cfg.n`` records per signal from the evaluation ``splits`` (role → records).

    ``pool`` is the training forget pool, left out of the forget sample where training forget = evaluation forget
    (:func:`delta_check`)."""
    if not spec.membership:
        raise InputError(f"the monitors read membership inference; benchmark {spec.name} has no membership splits")
    n, length = cfg.n, spec.max_length
    forget = delta_check(
        tokenizer, spec, splits["forget"], m_ref or 0.0, shots_of(spec, splits, "forget"), pool, n, seed
    )
    members_role, nonmembers_role = spec.membership
    for role in (members_role, nonmembers_role):
        if role not in splits:
            raise InputError(f"the monitors need the {role!r} split of benchmark {spec.name} (membership inference)")
    members = (
        None if members_role == "forget" else _encode(tokenizer, seeded_subset(splits[members_role], n, seed), length)
    )
    nonmembers = _encode(tokenizer, seeded_subset(splits[nonmembers_role], n, seed + 2), length)
    roles = ["utility"] if "utility" in splits else utility_roles(spec)
    if not roles:
        raise InputError(f"benchmark {spec.name} has no utility split that no method trains on (the utility proxy)")
    per_role = max(1, n // len(roles))
    utility: list[EncodedQA] = []
    for role in roles:
        shots = shots_of(spec, splits, role)
        utility += _encode(tokenizer, seeded_subset(splits[role], per_role, seed + 3), length, shots)
    texts = {
        "members": mia.answer_texts(tokenizer, members if members is not None else forget.examples),
        "nonmembers": mia.answer_texts(tokenizer, nonmembers),
    }
    return MonitorSamples(forget, m_ref, members, nonmembers, utility, tokenizer.pad_token_id, texts)


def detector_scores(stats, texts: Sequence[str], detectors: Sequence[str]) -> dict[str, torch.Tensor]:
    """Loss-like membership scores of ``detectors`` from one scoring pass (zlib also needs the answer texts)."""
    return {d: mia.zlib_score(stats, texts) if d == "zlib" else mia.TOKEN_DETECTORS[d](stats) for d in detectors}


class Monitors:
    """Calling it on a model returns one row of signals (see the module docstring) with each signal's seconds."""

    def __init__(
        self,
        samples: MonitorSamples,
        detectors: Sequence[str],
        reference: torch.nn.Module | None = None,
        batch_size: int = 32,
    ):
        self.samples, self.detectors, self.batch_size = samples, tuple(detectors), batch_size
        self.reference_auc = None
        if reference is not None:
            with torch.no_grad():
                self.reference_auc = self._aucs(reference.eval(), self._score(reference, samples.forget.examples))

    def _score(self, model, examples: Sequence[EncodedQA]):
        return score_dataset(model, examples, self.samples.pad_id, self.batch_size)

    def _aucs(self, model, forget_stats) -> dict[str, float]:
        s = self.samples
        members = forget_stats if s.members is None else self._score(model, s.members)
        scores = {
            "members": detector_scores(members, s.texts["members"], self.detectors),
            "nonmembers": detector_scores(self._score(model, s.nonmembers), s.texts["nonmembers"], self.detectors),
        }
        return {d: mia.auc(scores["members"][d].tolist(), scores["nonmembers"][d].tolist()) for d in self.detectors}

    def __call__(self, model) -> dict[str, float]:
        s, row = self.samples, {}
        with torch.no_grad():
            start = time.perf_counter()
            forget = self._score(model, s.forget.examples)  # Δ's sample, and the members of a TOFU-kind benchmark
            if s.m_ref is not None:
                row["delta"] = float(diagnose(forget, s.m_ref, how=s.forget.aggregate).delta)
            row["seconds/forget"] = time.perf_counter() - start
            start = time.perf_counter()
            for d, value in self._aucs(model, forget).items():
                row[f"auc/{d}"] = value
                if self.reference_auc is not None:
                    row[f"privleak/{d}"] = privleak(value, self.reference_auc[d])
            row["seconds/mia"] = time.perf_counter() - start
            start = time.perf_counter()
            row["utility"] = float(self._score(model, s.utility).nll_mean().mean())
            row["seconds/utility"] = time.perf_counter() - start
        return row
