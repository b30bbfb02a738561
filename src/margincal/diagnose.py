"""``margincal diagnose``: the margin-cliff numbers of any checkpoint on a TOFU-format forget split.

One scoring pass per model gives m(D_f) and ℓ; with a reference, Δ, the Thm. 1 certificate and the crossing
flag; with a retain split, the forget/retain overlap ε.
"""

from __future__ import annotations

from pathlib import Path

from margincal.data.records import encode_qa
from margincal.data.tofu import load_qa_json
from margincal.margin import diagnose, diagnostic_margins, overlap_epsilon
from margincal.models import load_model, load_tokenizer
from margincal.scoring import score_dataset


def diagnose_checkpoint(
    model: str,
    forget: str | Path,
    ref: str | None = None,
    retain: str | Path | None = None,
    aggregate: str = "mean",
    max_length: int = 512,
    batch_size: int = 16,
    dtype: str = "float32",
    device: str = "cpu",
    template: str | None = None,
) -> dict:
    """Diagnose ``model`` (HF id or directory) on the forget split, optionally against ``ref``."""
    records = load_qa_json(forget)
    out: dict = {"model": model, "forget": str(forget), "n": len(records), "aggregate": aggregate}

    def score(name: str):
        tok = load_tokenizer(name, template)
        examples = encode_qa(tok, records, max_length)
        return score_dataset(load_model(name, dtype, device), examples, tok.pad_token_id, batch_size)

    m_ref = None
    if ref is not None:
        ref_stats = score(ref)
        m_ref = diagnose(ref_stats, how=aggregate).m
        out["ref"] = {"model": ref, "m": m_ref}
    stats = score(model)
    out["diagnosis"] = diagnose(stats, m_ref, how=aggregate).to_dict()
    out["diagnostic_margins"] = diagnostic_margins(stats).tolist()
    if retain is not None:
        retain_records = load_qa_json(retain)
        out["overlap_epsilon"] = overlap_epsilon(
            [f"{r.question} {r.answer}" for r in records], [f"{r.question} {r.answer}" for r in retain_records]
        )
    return out
