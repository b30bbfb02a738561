"""The TOFU evaluator (also the mini benchmark's): forget metrics, model utility, the five MIA AUCs and the margin
diagnostic of one checkpoint.

Per split, one batched scoring pass per answer kind (gold, paraphrased, all perturbed answers flattened) feeds
every probability metric, and one batched greedy-decoding pass feeds ROUGE-L. θ_ref's result (its JSON) is the
``reference``: its per-sample forget truth ratios give forget_quality, its min-k AUC privleak and its m(D_f) the
cliff gap Δ, so θ_ref is evaluated once and reused for every unlearned model (as TOFU's retain logs are).

Roles: ``forget`` and ``holdout`` (members and non-members: the spec's ``membership``), ``retain``,
``real_authors``, ``world_facts``; any subset may be given, and the summary holds what those allow. ``parts``
restricts the work to the forget role's ``diagnosis`` (m, ℓ, Δ, per-sample diagnostic margins) and/or ``rouge``
(greedy answers): what the attack stage and ``margincal diagnose`` read, computed exactly as in a full evaluation.

What is computed, and under which JSON keys, is the metric table's :data:`~.metric_table.TOFU` rows; this module
runs the passes (:class:`SplitScorer`, per :data:`ROLES`) and serves their results to the rows (:class:`TofuScores`).
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import torch

from margincal.config.settings import BenchmarkSpec, EvalSettings
from margincal.core.errors import InputError
from margincal.data.records import EncodedQA, QARecord, encode_qa
from margincal.evaluation import metrics as M
from margincal.evaluation import mia
from margincal.evaluation.request import EvalRequest
from margincal.model.generation import generate_answers
from margincal.model.margin import diagnose
from margincal.model.scoring import TokenStats, score_dataset
from margincal.results.metric_table import PARTS, TOFU, fill, metric_value


def records_digest(records: Sequence[QARecord]) -> str:
    """Identity of a split's questions and answers (guards reusing a reference computed on other data)."""
    h = hashlib.sha256()
    for r in records:
        h.update(f"{r.question}\x00{r.answer}\x01".encode())
    return h.hexdigest()[:16]


class SplitScorer:
    """Scores one model on QA records: gold / paraphrased / perturbed answer passes and greedy generation.

    ``score`` runs every requested answer kind of a split in one :func:`score_dataset` call, so a question's
    answers share one forward of its prompt; ``generate`` decodes several splits' prompts in one batched pass.
    """

    def __init__(
        self,
        model,
        tokenizer,
        max_length: int,
        settings: EvalSettings,
        max_new_tokens: int,
        shots: dict[int, Sequence[QARecord]] | None = None,
    ):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.max_length, self.max_new_tokens = max_length, max_new_tokens
        self.shots = shots or {}  # id(records) -> QA pairs placed before each of their questions
        self._encoded: dict[tuple[int, str], tuple[Sequence[QARecord], list[EncodedQA]]] = {}
        self._stats: dict[tuple[int, str], TokenStats] = {}

    def examples(self, records: Sequence[QARecord], answer_field: str = "answer") -> list[EncodedQA]:
        """The records tokenised once per (split, answer field) and reused by scoring, generation and gradnorm
        (the cache holds the records too, so the ``id`` key cannot be reused by another list); the field
        ``perturbed`` is every perturbed answer of every record, flattened."""
        key = (id(records), answer_field)
        if key not in self._encoded:
            shots = self.shots.get(id(records), ())
            if answer_field == "perturbed":
                flat = [replace(r, answer=a) for r in records for a in r.perturbed_answers]
                encoded = encode_qa(self.tokenizer, flat, self.max_length, shots=shots)
            else:
                encoded = encode_qa(self.tokenizer, records, self.max_length, answer_field, shots=shots)
            self._encoded[key] = (records, encoded)
        return self._encoded[key][1]

    def score(self, records: Sequence[QARecord], fields: Sequence[str]) -> None:
        """Score the answer kinds ``fields`` (``answer``, ``paraphrased_answer``, ``perturbed``) of ``records`` in
        one pass; :meth:`stats` and :meth:`perturbed` then read the cached statistics."""
        todo = [f for f in dict.fromkeys(fields) if (id(records), f) not in self._stats]
        if not todo:
            return
        parts = [self.examples(records, f) for f in todo]
        stats = score_dataset(
            self.model, [e for p in parts for e in p], self.tokenizer.pad_token_id, self.settings.batch_size
        )
        start = 0
        for field, part in zip(todo, parts, strict=True):
            self._stats[(id(records), field)] = stats.select(torch.arange(start, start + len(part)))
            start += len(part)

    def keep(self, records: Sequence[QARecord], answer_field: str, stats: TokenStats) -> None:
        """Take the statistics of ``records``' ``answer_field`` answers from another pass over the same examples
        (the gradnorm detector's forward); :meth:`score` then skips that kind."""
        self.examples(records, answer_field)  # holds the records, so their id stays theirs
        self._stats[(id(records), answer_field)] = stats

    def stats(self, records: Sequence[QARecord], answer_field: str = "answer") -> TokenStats:
        self.score(records, [answer_field])
        return self._stats[(id(records), answer_field)]

    def perturbed(self, records: Sequence[QARecord]) -> tuple[TokenStats, list[int]]:
        """Every perturbed answer of every record; ``owner[j]`` is the record of answer ``j``."""
        owner = [i for i, r in enumerate(records) for _ in r.perturbed_answers]
        if len(set(owner)) != len(records):
            raise InputError("every record needs at least one perturbed answer for the truth ratio")
        return self.stats(records, "perturbed"), owner

    def generate(self, splits: Sequence[Sequence[QARecord]]) -> list[list[str]]:
        """Greedy answers to the prompts of each of ``splits``, decoded together."""
        examples = [self.examples(records) for records in splits]
        flat = generate_answers(
            self.model,
            self.tokenizer,
            [e for ex in examples for e in ex],
            self.max_new_tokens,
            self.settings.generation_batch_size,
        )
        out, start = [], 0
        for ex in examples:
            out.append(flat[start : start + len(ex)])
            start += len(ex)
        return out


def reference_margin(reference: dict | None) -> float | None:
    """m_ref = θ_ref's m(D_f), read from its evaluation result (any benchmark)."""
    return (reference or {}).get("summary", {}).get("m")


def _has(records: Sequence[QARecord], field: str) -> bool:
    return all(getattr(r, field) for r in records)


class RoleScores(abc.ABC):
    """The shared scores of one role that the metric table's functions read (:mod:`.metric_table`), each computed
    on first use and once: token statistics, greedy answers with their ROUGE-L (recall, F1) and samples, the margin
    diagnosis, perturbed answers and truth ratios; ``reference_split`` is θ_ref's result for the role. Statistics and
    answers come from the evaluator's passes (:class:`TofuScores`, ``muse.MuseScores``)."""

    truth_ratios = None  # benchmarks without perturbed answers

    def __init__(self, role: str, records: Sequence[QARecord], spec: BenchmarkSpec, reference: dict | None):
        self.role, self.records, self.spec = role, records, spec
        self.m_ref = reference_margin(reference)
        self.reference_split = (reference or {}).get("splits", {}).get(role, {})

    @property
    @abc.abstractmethod
    def stats(self) -> TokenStats:
        """Per-token statistics of the role's answers (a ``cached_property`` of each evaluator's scores)."""

    @property
    @abc.abstractmethod
    def generated(self) -> list[str]:
        """Greedy answers to the role's questions (a ``cached_property`` of each evaluator's scores)."""

    @cached_property
    def _rouge(self) -> tuple[list[tuple[float, float]], list[dict]]:
        return M.rouge_l_samples(self.records, self.generated)

    @property
    def rouge(self) -> list[tuple[float, float]]:
        """ROUGE-L (recall, F1) of each greedy answer against its gold answer."""
        return self._rouge[0]

    @property
    def samples(self) -> list[dict]:
        return self._rouge[1]

    @cached_property
    def diagnosis(self) -> dict:
        return diagnose(self.stats, self.m_ref, how=self.spec.aggregate).numbers()


@metric_value("samples")
def _samples(s: RoleScores) -> list[dict]:
    """The metric table's per-sample records of a role (greedy answers with their scores)."""
    return s.samples


@dataclass(frozen=True)
class Role:
    """How :func:`evaluate_tofu` scores a role: the answer kinds scored with the gold answers in one pass (when
    ``optional``, only those every record has, and no truth ratio unless it has them all), the answer the truth ratio
    sets against the perturbed ones and whether its greedy answers are decoded. The roles of the spec's
    ``membership`` are the membership-inference splits (gradnorm pass, detector scores kept)."""

    kinds: tuple[str, ...] = ()
    truth: str = "paraphrased_answer"
    optional: bool = True
    decoded: bool = True

    def available(self, records: Sequence[QARecord]) -> dict[str, bool]:
        """Per kind: whether it is scored (always, unless ``optional`` and some record lacks it)."""
        field = {"paraphrased_answer": "paraphrased_answer", "perturbed": "perturbed_answers"}
        return {k: not self.optional or _has(records, field[k]) for k in self.kinds}

    def scored(self, records: Sequence[QARecord]) -> list[str]:
        return ["answer", *(k for k, ok in self.available(records).items() if ok)]


# in evaluation order: members, non-members, then the utility roles
ROLES = {
    "forget": Role(("paraphrased_answer", "perturbed")),
    "holdout": Role(decoded=False),
    "retain": Role(("paraphrased_answer", "perturbed")),
    "real_authors": Role(("perturbed",), truth="answer", optional=False),
    "world_facts": Role(("perturbed",), truth="answer", optional=False),
}


class TofuScores(RoleScores):
    """A TOFU role's shared scores, read from the :class:`SplitScorer`'s cached passes."""

    def __init__(self, role, records, scorer: SplitScorer, spec, reference, generated: list[str] | None = None):
        super().__init__(role, records, spec, reference)
        self.scorer = scorer
        if generated is not None:
            self.generated = generated

    @cached_property
    def stats(self) -> TokenStats:
        return self.scorer.stats(self.records)

    @cached_property
    def generated(self) -> list[str]:
        return self.scorer.generate([self.records])[0]

    @cached_property
    def perturbed(self) -> tuple[TokenStats, list[int]]:
        return self.scorer.perturbed(self.records)

    @cached_property
    def truth_ratios(self) -> torch.Tensor | None:
        """Raw per-sample truth ratios against the role's truth answer; None when the records lack its kinds."""
        role = ROLES[self.role]
        if not all(role.available(self.records).values()):
            return None
        pert, owner = self.perturbed
        pert_mean = M.group_mean(pert.nll_mean(), owner, len(self.records))
        return M.truth_ratio(self.scorer.stats(self.records, role.truth).nll_mean(), pert_mean)

    def detector_scores(self, gradnorm: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """The five MIA detectors' per-sample scores (gradnorm when it was run)."""
        texts = mia.answer_texts(self.scorer.tokenizer, self.scorer.examples(self.records))
        scores = {name: score(self.stats) for name, score in mia.TOKEN_DETECTORS.items()}
        scores["zlib"] = mia.zlib_score(self.stats, texts)
        if gradnorm is not None:
            scores["gradnorm"] = gradnorm
        return scores


class MiaScores:
    """Per-detector scores of the member and non-member splits: what the table's AUC rows read."""

    def __init__(self, scores: dict[str, dict[str, torch.Tensor]], members: str, nonmembers: str):
        self.scores, self.members, self.nonmembers = scores, members, nonmembers

    def auc(self, detector: str) -> float | None:
        if self.members not in self.scores or self.nonmembers not in self.scores:
            return None
        member, nonmember = self.scores[self.members], self.scores[self.nonmembers]
        if detector not in member:
            return None
        return mia.auc(member[detector].tolist(), nonmember[detector].tolist())


def evaluate_tofu(model, tokenizer, request: EvalRequest) -> dict:
    """All TOFU metrics the given splits allow (or only ``parts`` of the forget role): the rows of
    :data:`~.metric_table.TOFU` in order, from one scoring pass per role; ``reference`` is θ_ref's result of this
    function. A ``forget_icl`` split (in-context relearning's D_rel) is placed before every forget question."""
    spec, splits, settings, reference, parts = request
    if parts is not None and set(parts) - set(PARTS):
        raise ValueError(f"unknown evaluation part(s) {sorted(set(parts) - set(PARTS))}; use {PARTS}")
    ref_forget = (reference or {}).get("splits", {}).get("forget", {})
    digest = records_digest(splits["forget"]) if parts is None and "forget" in splits else None
    if digest is not None and ref_forget and ref_forget.get("digest") != digest:
        raise InputError("the reference was evaluated on a different forget split; re-evaluate θ_ref on it")
    shots = {id(splits["forget"]): splits["forget_icl"]} if "forget_icl" in splits and "forget" in splits else {}
    scorer = SplitScorer(model, tokenizer, spec.max_length, settings, spec.max_new_tokens, shots)
    ref_summary = request.ref_summary
    out: dict = {"splits": {}, "summary": {}}
    roles = ["forget"] if parts is not None else [role for role in ROLES if role in splits]
    generated: dict[str, list[str]] = {}
    if parts is None:  # every role's greedy answers in one batched pass
        decoded = [role for role in roles if ROLES[role].decoded]
        generated = dict(zip(decoded, scorer.generate([splits[role] for role in decoded]), strict=True))
    members: dict[str, dict[str, torch.Tensor]] = {}
    for name in roles:
        records, role, member_role = splits[name], ROLES[name], name in spec.membership
        scores = TofuScores(name, records, scorer, spec, reference, generated.get(name))
        split = out["splits"][name] = {"n": len(records)}
        if parts is None:
            gradnorm = None
            if member_role and settings.gradnorm:  # its forward gives the gold-answer statistics too
                examples = scorer.examples(records)
                gradnorm, gold = mia.gradnorm_scores(model, examples, tokenizer.pad_token_id, settings.batch_size)
                scorer.keep(records, "answer", gold)
            scorer.score(records, role.scored(records))
            if member_role:
                members[name] = detectors = scores.detector_scores(gradnorm)
                split.update(digest=records_digest(records), mia_scores={k: v.tolist() for k, v in detectors.items()})
        fill(TOFU, name, scores, split, out["summary"], ref_summary, parts)
    if parts is None:
        fill(TOFU, None, MiaScores(members, *spec.membership), {}, out["summary"], ref_summary)
    return out
