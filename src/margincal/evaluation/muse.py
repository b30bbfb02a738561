"""The MUSE evaluator (Shi et al. 2024; MUSE-News and MUSE-Books), as open-unlearning runs it
(``configs/eval/muse_metrics``).

* knowmem forget / retain: greedy answers to few-shot prompts (every ICL pair of the split's ``*_icl`` set placed
  before the question by the model's prompt template: ``Question: q\\nAnswer: a\\n\\n`` blocks for Llama-2-7b-hf),
  cut at the stop words; ROUGE-L F1 (open-unlearning's MUSE ``rougeL_f1``, the headline ``rouge_l``) and recall,
  averaged over questions.
* verbmem (where the benchmark has the split): greedy continuations (128 new tokens, no stop words) of the forget
  passages' prefixes, ROUGE-L F1 against the true continuations (``forget_verbmem_ROUGE``).
* Margin diagnostic on the forget answers under the same prompt, median-aggregated (paper App. "MUSE-News").
* MIA: loss and min-k AUCs (members = privleak ``forget`` passages, non-members = ``holdout``), privleak on the
  min-k AUC against θ_ref's.

``parts`` restricts the work to the forget role's ``diagnosis`` and/or ``rouge``, computed exactly as in a full
evaluation (same few-shot prompts, stop strings, F1 and aggregate): the attack stage reads these.
"""

from __future__ import annotations

from functools import cached_property

from margincal.config.settings import EvalSettings
from margincal.data.benchmarks import shots_of
from margincal.data.records import EncodedQA, QARecord, encode_completions, encode_qa, encode_text
from margincal.evaluation import metrics as M
from margincal.evaluation import mia
from margincal.evaluation.request import EvalRequest
from margincal.evaluation.tofu import MiaScores, RoleScores
from margincal.model.generation import generate_answers
from margincal.model.scoring import TokenStats, score_dataset
from margincal.results.metric_table import MUSE, detectors, fill


class VerbmemScores(RoleScores):
    """The verbmem role's scores (open-unlearning's ``forget_verbmem_ROUGE``): each forget-passage prefix encoded
    as its ``CompletionDataset`` does (BOS, no template, the continuation after one space, at most ``max_length``
    tokens), greedy continuations of ``verbmem_new_tokens`` tokens with no stop words (cut at EOS), and ROUGE-L
    against the continuation's tokens decoded (what open-unlearning takes as the ground truth)."""

    def __init__(self, records, model, tokenizer, spec, settings: EvalSettings):
        super().__init__("verbmem", records, spec, None)
        self.model, self.tokenizer, self.settings = model, tokenizer, settings

    @cached_property
    def examples(self) -> list[EncodedQA]:
        prefixes, texts = [r.question for r in self.records], [r.answer for r in self.records]
        return encode_completions(self.tokenizer, prefixes, texts, self.spec.max_length, insert_space=True)

    @cached_property
    def generated(self) -> list[str]:
        new = self.spec.verbmem_new_tokens
        return generate_answers(self.model, self.tokenizer, self.examples, new, self.settings.generation_batch_size)

    @cached_property
    def stats(self) -> TokenStats:
        return score_dataset(self.model, self.examples, self.tokenizer.pad_token_id, self.settings.batch_size)

    @cached_property
    def _rouge(self) -> tuple[list[tuple[float, float]], list[dict]]:
        truths = [self.tokenizer.decode(e.answer_ids, skip_special_tokens=True).strip() for e in self.examples]
        gold = [QARecord(r.question, truth) for r, truth in zip(self.records, truths, strict=True)]
        return M.rouge_l_samples(gold, self.generated)


class MuseScores(RoleScores):
    """A knowmem role's shared scores: greedy answers and gold statistics under the few-shot prompt."""

    def __init__(self, role, records, model, tokenizer, spec, settings: EvalSettings, reference, shots=()):
        super().__init__(role, records, spec, reference)
        self.model, self.tokenizer, self.settings, self.shots = model, tokenizer, settings, shots

    @cached_property
    def examples(self) -> list[EncodedQA]:
        return encode_qa(self.tokenizer, self.records, self.spec.max_length, shots=self.shots)

    @cached_property
    def generated(self) -> list[str]:
        return generate_answers(
            self.model,
            self.tokenizer,
            self.examples,
            self.spec.max_new_tokens,
            self.settings.generation_batch_size,
            self.spec.stop,
        )

    @cached_property
    def stats(self) -> TokenStats:
        return score_dataset(self.model, self.examples, self.tokenizer.pad_token_id, self.settings.batch_size)


def evaluate_muse(model, tokenizer, request: EvalRequest) -> dict:
    """knowmem ROUGE-L, the margin diagnostic and the MUSE MIA AUCs (the rows of :data:`~.metric_table.MUSE`);
    ``reference`` is θ_ref's result."""
    spec, splits, settings, reference, parts = request
    ref_summary = request.ref_summary
    out: dict = {"splits": {}, "summary": {}}
    for role in ("forget",) if parts is not None else ("forget", "retain"):
        if role not in splits:
            continue
        shots = shots_of(spec, splits, role)
        scores = MuseScores(role, splits[role], model, tokenizer, spec, settings, reference, shots)
        split = out["splits"][role] = {"n": len(splits[role])}
        fill(MUSE, role, scores, split, out["summary"], ref_summary, parts)
    if parts is None and "verbmem" in splits:
        scores = VerbmemScores(splits["verbmem"], model, tokenizer, spec, settings)
        split = out["splits"]["verbmem"] = {"n": len(splits["verbmem"])}
        fill(MUSE, "verbmem", scores, split, out["summary"], ref_summary)
    if parts is None:
        members = {}
        if all(role in splits for role in spec.membership):
            for role in spec.membership:
                examples = encode_text(tokenizer, [r.answer for r in splits[role]], spec.max_length)
                stats = score_dataset(model, examples, tokenizer.pad_token_id, settings.batch_size)
                members[role] = {d: mia.TOKEN_DETECTORS[d](stats) for d in detectors(MUSE)}
        fill(MUSE, None, MiaScores(members, *spec.membership), {}, out["summary"], ref_summary)
    return out
