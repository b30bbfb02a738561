"""Markdown tables and the demo report, built only from a results record (every number traceable)."""

from __future__ import annotations


def _f(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def arrow(base: float, mc: float, lower_is_better: bool, spec: str = ".3f") -> str:
    """``base → mc`` with the MC value in bold when it improves on the baseline."""
    better = mc < base if lower_is_better else mc > base
    mc_s = format(mc, spec)
    return f"{format(base, spec)} → {'**' + mc_s + '**' if better else mc_s}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _attack_rouge(row: dict) -> float | None:
    return row.get("attack", {}).get("rouge_l")


def demo_report(record: dict, figure: str) -> str:
    """The demo's ``report.md``."""
    man, models, m_ref = record["manifest"], record["models"], record["m_ref"]
    cfg = man["config"]
    k = cfg["attack"]["k"]
    parts = [
        "# margincal demo — mini benchmark",
        "",
        f"Forget tier `{cfg['tier']}`, run seed {man['seed']}, benchmark `{man['benchmark_fingerprint'][:12]}`, "
        f"git `{man['git_commit'][:12]}`, created {man['created']}, total {record['timings_s']['total']:.0f} s. "
        f"All numbers below are read from `results.json` in this directory.",
        "",
        f"Retain reference margin on the forget set: **m_ref = {m_ref:+.3f}**; forget/retain word-bigram overlap "
        f"ε = {record['overlap_epsilon']:.3f}. "
        "Δ = m(D_f) − m_ref; Δ ≤ 0 means the model has crossed the margin cliff. "
        f"K{k}-LoRA is the held-out forget ROUGE-L after a LoRA r={cfg['attack']['train']['lora']['r']} relearn "
        f"attack on K={k} forget samples ({cfg['attack']['train']['steps']} steps).",
        "",
        "## Baseline → MC",
        "",
    ]
    rows = []
    for row in models.values():
        if row["kind"] != "mc":
            continue
        base = models[row["base"]]
        bd, md = base["forget"]["diagnosis"], row["forget"]["diagnosis"]
        rows.append(
            [
                row["base"],
                arrow(bd["delta"], md["delta"], lower_is_better=True, spec="+.2f"),
                arrow(base["forget"]["rouge_l"], row["forget"]["rouge_l"], lower_is_better=True),
                arrow(base["retain"]["rouge_l"], row["retain"]["rouge_l"], lower_is_better=False),
                arrow(_attack_rouge(base), _attack_rouge(row), lower_is_better=True),
            ]
        )
    parts.append(
        markdown_table(["Method", "Δ (↓)", "forget ROUGE-L (↓)", "retain ROUGE-L (↑)", f"K{k}-LoRA ROUGE-L (↓)"], rows)
    )
    parts += ["", "Bold marks an MC improvement over its baseline.", ""]
    parts += _reading(models, m_ref, k)
    parts += ["", "## Every model", ""]
    rows = []
    for label, row in models.items():
        d = row["forget"]["diagnosis"]
        rows.append(
            [
                label,
                _f(row["forget"]["rouge_l"]),
                _f(row["retain"]["rouge_l"]),
                _f(row["forget"]["q_a_prob"]),
                _f(d["m"], "+.2f"),
                _f(d.get("delta"), "+.2f"),
                _f(d["log_odds"], "+.2f"),
                "—" if d.get("certified") is None else ("yes" if d["certified"] else "no"),
                _f(_attack_rouge(row)),
            ]
        )
    parts.append(
        markdown_table(
            [
                "Model",
                "forget ROUGE-L",
                "retain ROUGE-L",
                "forget Q_A_Prob",
                "m(D_f)",
                "Δ",
                "ℓ",
                "cliff certified (ℓ > m_ref)",
                f"K{k}-LoRA ROUGE-L",
            ],
            rows,
        )
    )
    parts += [
        "",
        "ℓ is the mean gold log-odds at the diagnostic positions; m ≥ ℓ always, and ℓ > m_ref certifies Δ > 0 "
        "(paper Thm. 1).",
        "",
        "## Forget margins against the retain reference",
        "",
        f"![forget-set margin diagnostic per model]({figure})",
        "",
        "## Example: one held-out forget question after the attack",
        "",
    ]
    parts += _example(models)
    parts += ["", "## Stage timings (s)", ""]
    parts.append(markdown_table(["stage", "seconds"], [[s, f"{v:.1f}"] for s, v in record["timings_s"].items()]))
    return "\n".join(parts) + "\n"


def _reading(models: dict, m_ref: float, k: int) -> list[str]:
    """Plain-language summary computed from the numbers (no claims the data do not support)."""
    pairs = [(row, models[row["base"]]) for row in models.values() if row["kind"] == "mc"]
    base_above = sum(b["forget"]["diagnosis"]["delta"] > 0 for _, b in pairs)
    mc_crossed = sum(m["forget"]["diagnosis"]["delta"] <= 0 for m, _ in pairs)
    k_wins = sum(_attack_rouge(m) < _attack_rouge(b) for m, b in pairs)
    retain_cost = [b["retain"]["rouge_l"] - m["retain"]["rouge_l"] for m, b in pairs]
    mean_cost = sum(retain_cost) / len(retain_cost) if retain_cost else 0.0
    return [
        f"**Reading.** {base_above}/{len(pairs)} baselines stop above the retain reference (Δ > 0, the margin "
        f"cliff); MC crosses it (Δ ≤ 0) on {mc_crossed}/{len(pairs)}; MC lowers K{k}-LoRA recovery on "
        f"{k_wins}/{len(pairs)}, with a mean retain ROUGE-L change of {-mean_cost:+.3f}.",
    ]


def _example(models: dict) -> list[str]:
    ref = next(iter(models.values()))
    if "attack" not in ref:
        return ["(no attack was run)"]
    idx = 0
    sample = ref["attack"]["samples"][idx]
    rows = [["gold", sample["gold"]]]
    for label, row in models.items():
        if "attack" in row:
            rows.append([f"{label} attacked", row["attack"]["samples"][idx]["generated"] or "(empty)"])
    return [markdown_table(["", "answer"], [[a, b.replace("|", "/")] for a, b in rows])]
