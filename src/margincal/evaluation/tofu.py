"""The TOFU evaluator (also the mini benchmark's): forget metrics, model utility, the five MIA AUCs and the margin
diagnostic of one checkpoint.

Per split, one batched scoring pass per answer kind (gold, paraphrased, all perturbed answers flattened) feeds
every probability metric, and one batched greedy-decoding pass feeds ROUGE-L. θ_ref's result (its JSON) is the
``reference``: its per-sample forget truth ratios give forget_quality, its min-k AUC privleak and its m(D_f) the
cliff gap Δ, so θ_ref is evaluated once and reused for every unlearned model (as TOFU's retain logs are).

Roles: ``forget`` (members), ``holdout`` (non-members), ``retain``, ``real_authors``, ``world_facts``; any
subset may be given, and the summary holds what those allow. ``parts`` restricts the work to the forget role's
``diagnosis`` (m, ℓ, Δ, per-sample diagnostic margins) and/or ``rouge`` (greedy answers): what the attack stage and
``margincal diagnose`` read, computed exactly as in a full evaluation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace

import torch

from margincal.config import BenchmarkSpec, EvalSettings
from margincal.data.records import EncodedQA, QARecord, encode_qa
from margincal.evaluation import metrics as M
from margincal.evaluation import mia
from margincal.generation import generate_answers
from margincal.margin import diagnose, diagnostic_margins
from margincal.scoring import TokenStats, score_dataset

PARTS = ("diagnosis", "rouge")


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

    def __init__(self, model, tokenizer, max_length: int, settings: EvalSettings, max_new_tokens: int):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.max_length, self.max_new_tokens = max_length, max_new_tokens
        self._encoded: dict[tuple[int, str], tuple[Sequence[QARecord], list[EncodedQA]]] = {}
        self._stats: dict[tuple[int, str], TokenStats] = {}

    def examples(self, records: Sequence[QARecord], answer_field: str = "answer") -> list[EncodedQA]:
        """The records tokenised once per (split, answer field) and reused by scoring, generation and gradnorm
        (the cache holds the records too, so the ``id`` key cannot be reused by another list); the field
        ``perturbed`` is every perturbed answer of every record, flattened."""
        key = (id(records), answer_field)
        if key not in self._encoded:
            if answer_field == "perturbed":
                flat = [replace(r, answer=a) for r in records for a in r.perturbed_answers]
                encoded = encode_qa(self.tokenizer, flat, self.max_length)
            else:
                encoded = encode_qa(self.tokenizer, records, self.max_length, answer_field)
            self._encoded[key] = (records, encoded)
        return self._encoded[key][1]

    def score(self, records: Sequence[QARecord], fields: Sequence[str]) -> None:
        """Score the answer kinds ``fields`` (``answer``, ``paraphrased_answer``, ``perturbed``) of ``records`` in
        one pass; :meth:`stats` and :meth:`perturbed` then read the cached statistics."""
        todo = [f for f in dict.fromkeys(fields) if (id(records), f) not in self._stats]
        if not todo:
            return
        parts = [self.examples(records, f) for f in todo]
        stats = score_dataset(self.model, [e for p in parts for e in p], self.tokenizer.pad_token_id,
                              self.settings.batch_size)  # fmt: skip
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
            raise ValueError("every record needs at least one perturbed answer for the truth ratio")
        return self.stats(records, "perturbed"), owner

    def generate(self, splits: Sequence[Sequence[QARecord]]) -> list[list[str]]:
        """Greedy answers to the prompts of each of ``splits``, decoded together."""
        examples = [self.examples(records) for records in splits]
        flat = generate_answers(self.model, self.tokenizer, [e for ex in examples for e in ex], self.max_new_tokens,
                                self.settings.generation_batch_size)  # fmt: skip
        out, start = [], 0
        for ex in examples:
            out.append(flat[start : start + len(ex)])
            start += len(ex)
        return out


def _kinds(records: Sequence[QARecord], *extra: str) -> list[str]:
    """The answer kinds a split's metrics read: gold, and the paraphrased / perturbed ones it has of ``extra``."""
    have = {"paraphrased_answer": _has(records, "paraphrased_answer"), "perturbed": _has(records, "perturbed_answers")}
    return ["answer", *(k for k in extra if have[k])]


def _rouge(records: Sequence[QARecord], generated: Sequence[str]) -> tuple[list[float], list[dict]]:
    """ROUGE-L recall per sample (TOFU's) and the sample records kept in the JSON."""
    scores, samples = M.rouge_l_samples(records, generated)
    return [recall for recall, _ in scores], samples


def _fact_recall(split: dict, summary: dict) -> None:
    """Add the forget split's mean fact recall (records with attribute values only, e.g. the mini's)."""
    recall = M.mean_fact_recall(split["samples"])
    if recall is not None:
        split["fact_recall"] = summary["forget_fact_recall"] = recall


def reference_margin(reference: dict | None) -> float | None:
    """m_ref = θ_ref's m(D_f), read from its evaluation result (any benchmark)."""
    return (reference or {}).get("summary", {}).get("m")


def _truth_ratios(scorer: SplitScorer, records, correct: TokenStats | None = None) -> torch.Tensor:
    """Raw per-sample truth ratios; the correct answer is the paraphrase when there is one, else ``correct``."""
    pert, owner = scorer.perturbed(records)
    pert_mean = M.group_mean(pert.nll_mean(), owner, len(records))
    if correct is None:
        correct = scorer.stats(records, "paraphrased_answer")
    return M.truth_ratio(correct.nll_mean(), pert_mean)


def _has(records: Sequence[QARecord], field: str) -> bool:
    return all(getattr(r, field) for r in records)


def evaluate_tofu(
    model,
    tokenizer,
    spec: BenchmarkSpec,
    splits: dict[str, Sequence[QARecord]],
    settings: EvalSettings,
    reference: dict | None = None,
    parts: Sequence[str] | None = None,
) -> dict:
    """All TOFU metrics the given splits allow (or only ``parts`` of the forget role); ``reference`` is θ_ref's
    result of this function."""
    scorer = SplitScorer(model, tokenizer, spec.max_length, settings, spec.max_new_tokens)
    ref_splits = (reference or {}).get("splits", {})
    m_ref = reference_margin(reference)
    out: dict = {"splits": {}, "summary": {}}
    summary = out["summary"]
    if parts is not None:
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            raise ValueError(f"unknown evaluation part(s) {unknown}; use {PARTS}")
        records = splits["forget"]
        split = {"n": len(records)}
        if "diagnosis" in parts:
            stats = scorer.stats(records)
            split.update(diagnosis=diagnose(stats, m_ref, how=spec.aggregate).to_dict(),
                         diagnostic_margins=diagnostic_margins(stats).tolist())  # fmt: skip
            summary.update(m=split["diagnosis"]["m"], log_odds=split["diagnosis"]["log_odds"])
            if m_ref is not None:
                summary.update(delta=split["diagnosis"]["delta"], certified=split["diagnosis"]["certified"])
        if "rouge" in parts:
            rouge, split["samples"] = _rouge(records, scorer.generate([records])[0])
            split["rouge_l"] = summary["forget_Q_A_ROUGE"] = float(sum(rouge) / len(rouge))
            _fact_recall(split, summary)
        out["splits"]["forget"] = split
        return out
    ref_forget = ref_splits.get("forget", {})
    if "forget" in splits and ref_forget and ref_forget.get("digest") != records_digest(splits["forget"]):
        raise ValueError("the reference was evaluated on a different forget split; re-evaluate θ_ref on it")
    mia_scores: dict[str, dict[str, torch.Tensor]] = {}
    decoded = [role for role in ("forget", "retain", "real_authors", "world_facts") if role in splits]
    generated = dict(zip(decoded, scorer.generate([splits[role] for role in decoded]), strict=True))

    for role in ("forget", "holdout"):
        if role not in splits:
            continue
        records = splits[role]
        gradnorm = None
        if settings.gradnorm:
            examples = scorer.examples(records)
            gradnorm, gold = mia.gradnorm_scores(model, examples, tokenizer.pad_token_id, settings.batch_size)
            scorer.keep(records, "answer", gold)
        scorer.score(records, _kinds(records, "paraphrased_answer", "perturbed") if role == "forget" else ["answer"])
        stats = scorer.stats(records)
        scores = {
            "loss": mia.loss_score(stats),
            "min_k": mia.min_k_score(stats),
            "min_k_plus_plus": mia.min_k_plus_plus_score(stats),
            "zlib": mia.zlib_score(stats, mia.answer_texts(tokenizer, scorer.examples(records))),
        }
        if gradnorm is not None:
            scores["gradnorm"] = gradnorm
        mia_scores[role] = scores
        split = {
            "n": len(records),
            "digest": records_digest(records),
            "mia_scores": {k: v.tolist() for k, v in scores.items()},
        }
        if role == "forget":
            rouge, samples = _rouge(records, generated[role])
            split.update(
                q_a_prob=float(M.q_a_prob(stats).mean()),
                rouge_l=float(sum(rouge) / len(rouge)),
                exact_memorization=float(M.exact_memorization(stats).mean()),
                extraction_strength=float(M.extraction_strength(stats).mean()),
                diagnosis=diagnose(stats, m_ref, how=spec.aggregate).to_dict(),
                diagnostic_margins=diagnostic_margins(stats).tolist(),
                samples=samples,
            )
            summary.update(
                forget_Q_A_Prob=split["q_a_prob"],
                forget_Q_A_ROUGE=split["rouge_l"],
                exact_memorization=split["exact_memorization"],
                extraction_strength=split["extraction_strength"],
                m=split["diagnosis"]["m"],
                log_odds=split["diagnosis"]["log_odds"],
            )
            _fact_recall(split, summary)
            summary["F_agg"] = float(
                sum(
                    summary[k]
                    for k in ("forget_Q_A_Prob", "forget_Q_A_ROUGE", "exact_memorization", "extraction_strength")
                )
                / 4
            )
            if m_ref is not None:
                summary.update(delta=split["diagnosis"]["delta"], certified=split["diagnosis"]["certified"])
            if _has(records, "paraphrased_answer") and _has(records, "perturbed_answers"):
                ratios = _truth_ratios(scorer, records)
                split["truth_ratios"] = ratios.tolist()
                summary["forget_truth_ratio"] = M.closer_to_1_better(ratios)
                if "truth_ratios" in ref_forget:
                    summary["forget_quality"] = M.forget_quality(ratios.tolist(), ref_forget["truth_ratios"])
        out["splits"][role] = split

    if "retain" in splits:
        records = splits["retain"]
        scorer.score(records, _kinds(records, "paraphrased_answer", "perturbed"))
        stats = scorer.stats(records)
        rouge, samples = _rouge(records, generated["retain"])
        split = {"n": len(records), "q_a_prob": float(M.q_a_prob(stats).mean()), "rouge_l": sum(rouge) / len(rouge)}
        summary.update(retain_Q_A_Prob=split["q_a_prob"], retain_Q_A_ROUGE=split["rouge_l"])
        if _has(records, "paraphrased_answer") and _has(records, "perturbed_answers"):
            summary["retain_Truth_Ratio"] = split["truth_ratio"] = M.true_better(_truth_ratios(scorer, records))
        split["samples"] = samples
        out["splits"]["retain"] = split

    for role, key in (("real_authors", "ra"), ("world_facts", "wf")):
        if role not in splits:
            continue
        records = splits[role]
        scorer.score(records, ["answer", "perturbed"])
        stats = scorer.stats(records)
        pert, owner = scorer.perturbed(records)
        rouge, samples = _rouge(records, generated[role])
        prob = M.prob_normalised(stats.nll_mean(), pert.nll_mean(), owner)
        ratios = M.truth_ratio(stats.nll_mean(), M.group_mean(pert.nll_mean(), owner, len(records)))
        split = {
            "n": len(records),
            "q_a_prob_normalised": float(prob.mean()),
            "rouge_l": sum(rouge) / len(rouge),
            "truth_ratio": M.true_better(ratios),
            "samples": samples,
        }
        summary.update(
            {f"{key}_Q_A_Prob_normalised": split["q_a_prob_normalised"], f"{key}_Q_A_ROUGE": split["rouge_l"]}
        )
        summary[f"{key}_Truth_Ratio"] = split["truth_ratio"]
        out["splits"][role] = split

    if all(k in summary for k in M.MU_KEYS):
        summary["model_utility"] = M.model_utility(summary)
    if {"forget", "holdout"} <= set(mia_scores):
        aucs = {
            name: mia.auc(mia_scores["forget"][name].tolist(), mia_scores["holdout"][name].tolist())
            for name in mia_scores["forget"]
        }
        summary.update({f"mia_{name}_auc": value for name, value in aucs.items()})
        summary["mia_agg"] = float(sum(aucs.values()) / len(aucs))
        summary["mia_advantage"] = mia.advantage(aucs)
        ref_auc = (reference or {}).get("summary", {}).get("mia_min_k_auc", 0.5)
        summary["privleak"] = mia.privleak(aucs["min_k"], ref_auc)
    return out
