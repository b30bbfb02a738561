"""An audit card as a Hugging Face model card: the section a publisher adds to a released checkpoint's ``README.md``
and the Hub's ``model-index`` results, written through :mod:`huggingface_hub`'s model-card API (``ModelCardData``,
``EvalResult``) so the Hub and ``huggingface_hub.ModelCard.load`` read it.

Each row of the card becomes one ``model-index`` result of the task ``relearn-robustness`` on the audited benchmark:
``recovered_fraction`` of an attack or quantizer (0 the θ_ref floor, 1 the θ0 ceiling under the same attack; lower
is more robust), the searched worst case of each threat family, and the margin diagnostic Δ = m(D_f) − m_ref.
"""

from __future__ import annotations

from pathlib import Path

from margincal.auditing.card import fmt, fmt_ci, fmt_fraction
from margincal.core.artifacts import atomic_write_text
from margincal.reporting.tables import markdown_table
from margincal.results.cards import CheckpointCard

TASK = "relearn-robustness"


def model_card_text(card: CheckpointCard, benchmark: str, tier: str, budget: str, command: str) -> str:
    """The model card of ``card``: YAML metadata with the ``model-index`` results, then a Markdown section (Δ, each
    row's recovered fraction with its interval, the searched worst cases, how to reproduce)."""
    from huggingface_hub import ModelCard, ModelCardData

    data = ModelCardData(model_name=card.name, eval_results=_results(card, benchmark, tier) or None)
    return str(
        ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(_section(card, benchmark, tier, budget, command)))
    )


def write_model_card(path: Path, card: CheckpointCard, benchmark: str, tier: str, budget: str, command: str) -> Path:
    """``path`` (a new file inside the audit's output, never a user's) with :func:`model_card_text`."""
    atomic_write_text(path, model_card_text(card, benchmark, tier, budget, command))
    return path


def _results(card: CheckpointCard, benchmark: str, tier: str) -> list:
    """The ``model-index`` results: Δ, and every row's recovered fraction that has a value."""
    from huggingface_hub import EvalResult

    def result(metric: str, name: str, value: float) -> EvalResult:
        return EvalResult(
            task_type=TASK,
            task_name="relearn robustness (margincal audit)",
            dataset_type=benchmark,
            dataset_name=f"{benchmark} {tier}",
            dataset_split=tier,
            metric_type=metric,
            metric_name=name,
            metric_value=round(float(value), 4),
        )

    out = [result("margin_cliff_gap", "Δ = m(D_f) − m_ref", card.delta.value)] if card.delta.value is not None else []
    rows = {**card.attacks, **card.quantization}
    for label, row in rows.items():
        if row.recovered_fraction.value is not None:
            out.append(result("recovered_fraction", f"recovered fraction: {label}", row.recovered_fraction.value))
    for family, searched in card.searched.items():
        worst = searched.searched
        if worst is not None and worst.recovered_fraction.value is not None:
            name = f"recovered fraction: searched worst case of {family}"
            out.append(result("recovered_fraction", name, worst.recovered_fraction.value))
    return out


def _section(card: CheckpointCard, benchmark: str, tier: str, budget: str, command: str) -> list[str]:
    """The card's Markdown section."""
    rows = [
        [f"`{label}`", fmt_fraction(row.recovered_fraction), fmt(row.rouge_l)]
        for label, row in {**card.attacks, **card.quantization}.items()
    ]
    worst = [
        [f"`{family}`", f"`{s.searched.label or family}`", fmt_fraction(s.searched.recovered_fraction)]
        for family, s in card.searched.items()
        if s.searched is not None
    ]
    certified = {True: "certified above the cliff (ℓ > m_ref)", False: "not certified", None: "not computed"}
    lines = [
        f"# {card.name}",
        "",
        "## Relearn robustness (margincal audit)",
        "",
        f"Audited on {benchmark} {tier} with the `{budget}` budget of margincal's audit (`margincal audit`).",
        "A relearn attacker fine-tunes this model on a few forget examples; each row is the share of what the "
        "retain-only reference θ_ref (the floor, 0) and the model before unlearning θ0 (the ceiling, 1) reach under "
        "the same attack that this model reaches on held-out forget questions (ROUGE-L): lower is more robust. "
        "Intervals are 95 % bootstrap intervals over D_rel draws and held-out records.",
        "",
        f"- Margin diagnostic: Δ = m(D_f) − m_ref = {fmt_ci(card.delta, '+.2f')} ({certified[card.certified]}).",
        "",
        markdown_table(["attack", "recovered fraction", "held-out ROUGE-L after it"], rows),
        "",
    ]
    if worst:
        lines += [
            "Searched worst case per threat family (the strongest valid attack the budget ran):",
            "",
            markdown_table(["family", "attack", "recovered fraction"], worst),
            "",
        ]
    return lines + [f"Reproduce: `{command}`", ""]
