"""The lm-eval wrapper on the shipped multiple-choice set, offline, against our own log-likelihood argmax."""

import json

import pytest
import torch

from margincal.evaluation.mmlu import GENERAL_MC, lm_eval_accuracy, local_task


def own_accuracy(model, tokenizer, docs) -> float:
    """Zero-shot MMLU scoring by hand: argmax over letters of log p(" X" | prompt), lm-eval's context split."""
    hits = 0
    for doc in docs:
        context = (
            doc["question"].strip()
            + "".join(f"\n{L}. {c}" for L, c in zip("ABCD", doc["choices"], strict=True))
            + "\nAnswer:"
        )
        ctx_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
        scores = []
        for letter in "ABCD":
            whole = tokenizer(context + " " + letter, add_special_tokens=False)["input_ids"]
            cont = whole[len(ctx_ids) :]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([whole[:-1]])).logits[0].float(), -1)
            scores.append(sum(float(logp[len(ctx_ids) - 1 + j, t]) for j, t in enumerate(cont)))
        hits += int(max(range(4), key=scores.__getitem__) == doc["answer"])
    return hits / len(docs)


def test_lm_eval_wrapper_matches_hand_scoring(tiny_model, tiny_tokenizer, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # outside any git checkout: lm-eval's `git describe` would print "fatal: ..."
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    local_task(GENERAL_MC, "margincal_general_mc", tmp_path / "tasks")
    tasks = tmp_path / "tasks"
    result = lm_eval_accuracy(tiny_model, tiny_tokenizer, ["margincal_general_mc"], include_path=tasks, builtin=False)
    docs = [json.loads(line) for line in GENERAL_MC.read_text().splitlines()]
    assert result["margincal_general_mc"]["acc"] == pytest.approx(own_accuracy(tiny_model, tiny_tokenizer, docs))
    printed = capfd.readouterr()
    assert not any(s in printed.err + printed.out for s in ("WARNING", "fatal:", "it/s]")), printed.err


def test_local_task_rejects_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="multiple-choice file not found"):
        local_task(tmp_path / "nope.jsonl", "x", tmp_path)
