"""Four findings an independent review found stated more strongly than their records allow, read back: each test
recomputes the claim's number and interval from the committed record and parses the same number from the
hand-written write-up, so it fails when either drifts.

1. the cliff-at-the-plateau premise (``results/testbed/premises.json``, the head-to-head cells);
2. MC against the oracle-imitation control on the rebuilt population (the control's own card; the audits as first
   run, whose populations ``rebuilt/first-selection/`` keeps beside issue 58's reruns);
3. Δ's ranking of the preset's recovery against the searched worst case (the first build's population in the tree;
   the rebuilt population as first run);
4. MC's K20-LoRA change on the testbed (the head-to-head cells) and the retain-only medians (``rebuilt/retain*``).
"""

import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

from scipy import stats

from margincal.evaluation.stats import mean_interval

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
TESTBED = RESULTS / "testbed"
WORST = RESULTS / "audit" / "testbed-worst"
REBUILT = WORST / "rebuilt"
K20 = "lora_r8@20"
FIRST_RUN = REBUILT / "first-selection"  # the rebuilt population's D_f audits as first run (old selection)
NUMBER = r"[+-]?\d+(?:\.\d+)?"


def _text(path: Path) -> str:
    """A write-up as one line: Unicode minus as ASCII, every run of whitespace one space (a claim may wrap)."""
    return _text_of(path.read_text())


def _text_of(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("−", "-"))


def _after(text: str, anchor: str, count: int) -> list[float]:
    """The first ``count`` numbers after the one occurrence of ``anchor`` in ``text``."""
    assert text.count(anchor) == 1, f"{anchor!r} occurs {text.count(anchor)} times"
    found = [float(x) for x in re.findall(NUMBER, text[text.index(anchor) + len(anchor) :])[:count]]
    assert len(found) == count, anchor
    return found


def _r(value: float, digits: int = 2) -> float:
    return round(value, digits) + 0.0  # -0.0 → 0.0


def _first_run(name: str) -> dict:
    """A rebuilt D_f audit's population.json as first run (old selection)."""
    return json.loads((FIRST_RUN / name / "population.json").read_text())


# 1. The premise ------------------------------------------------------------------------------------------------------


def test_the_premise_counts_are_read_from_premises_json_and_the_cells():
    """Δ > 0 at the plateau for 5 of 15 methods (RMU too, Δ +0.64), certified (ℓ > m_ref) for 3, the whole premise row
    (with retain ≥ 0.9) for 1; the head-to-head's baselines are above the cliff in 15 of 45 cells, the same 5 methods on
    every seed. No reading gives round 1's four (SimNPO, UNDIAL, JensUn, PDU)."""
    methods = json.loads((TESTBED / "premises.json").read_text())["methods"]
    above = {m for m, v in methods.items() if v["delta"] > 0}
    certified = {m for m, v in methods.items() if v["certified"]}
    kept = {m for m in above if methods[m]["retain_rougeL"] >= 0.9}
    row = above & certified & kept
    assert above == {"SimNPO", "UNDIAL", "JensUn", "PDU", "RMU"} and _r(methods["RMU"]["delta"]) == 0.64
    assert certified == {"SimNPO", "UNDIAL", "JensUn"} and kept == {"SimNPO", "PDU"} and row == {"SimNPO"}
    cells = [json.loads(p.read_text()) for p in sorted((TESTBED / "head2head" / "cells").glob("*.json"))]
    cells_above = [r["cell"] for r in cells if r["models"]["baseline"]["summary"]["delta"] > 0]
    assert (len(cells_above), len(cells)) == (15, 45)
    for seed in (0, 1, 2):
        assert {c["method"] for c in cells_above if c["seed"] == seed} == above

    text = _text(TESTBED / "README.md")
    # the introduction
    assert _after(text, "Δ > 0 at the plateau for", 4) == [len(above), len(methods), len(certified), len(row)]
    # the premise table, round 2
    assert f"{len(above)} of 15 above, {len(certified)} certified, {len(kept)} with retain ≥ 0.9 |" in text
    # the conclusion of the premise rounds
    names = re.search(r"stay above the cliff at a plateau of their own loss \(Δ > 0\): ([^(]+?) and (\w+), ", text)
    assert set(names.group(1).split(", ")) | {names.group(2)} == above
    assert _after(text, "RMU barely (Δ", 1) == [_r(methods["RMU"]["delta"])]
    counted = re.search(r"(\d+) of the head-to-head's (\d+) baseline cells, these five on every seed", text)
    assert [int(counted.group(1)), int(counted.group(2))] == [len(cells_above), len(cells)]
    listed = re.search(
        r"(\d+) are certified \(ℓ > m_ref: ([^)]+)\), and (\d+), (\w+), meets the whole premise row", text
    )
    assert int(listed.group(1)) == len(certified) and set(listed.group(2).split(", ")) == certified
    assert int(listed.group(3)) == len(row) and {listed.group(4)} == row
    # the comparison with the paper
    assert f"{len(cells_above)} of {len(cells)} cells (SimNPO, UNDIAL, JensUn, PDU, RMU)" in text
    assert "holds for 4 of the 15" not in text and "holds for SimNPO, UNDIAL, JensUn and PDU" not in text


# 2. MC against the oracle-imitation control --------------------------------------------------------------------------

WRITE_UPS_Q2 = (
    RESULTS / "audit" / "README.md",
    WORST / "README.md",
    REBUILT / "README.md",
    WORST / "control" / "README.md",
)


def _control_card() -> dict:
    """The control's own searched recovered fraction on half B, with its interval (control/d_f/card.json)."""
    card = json.loads((WORST / "control" / "d_f" / "card.json").read_text())
    return card["checkpoints"]["OracleImitation-v2"]["searched"]["lora_r8"]["searched"]["recovered_fraction"]


def test_the_controls_own_interval_is_quoted_from_its_card():
    """Wherever a write-up adds the control's own noise, it quotes the control's card: searched recovered fraction on
    half B 0.12 [0.04, 0.20]."""
    rf = _control_card()
    card = [_r(rf["value"]), _r(rf["ci"][0]), _r(rf["ci"][1])]
    assert card == [0.12, 0.04, 0.2]
    for path in WRITE_UPS_Q2:
        pattern = rf"(?:from its card \(|searched, half B: )({NUMBER}) \[({NUMBER}), ({NUMBER})\]"
        quoted = [[float(x) for x in q] for q in re.findall(pattern, _text(path))]
        assert quoted and all(q == card for q in quoted), path


def test_mc_against_the_control_counts_the_controls_noise():
    """Rebuilt seed 0 as first run: MC − control +0.09 [+0.01, +0.16] is a Student-t interval over the 14 polishes
    against one control checkpoint. The control's value in that population is its own card's; with the card's interval
    added (the two intervals' standard errors in quadrature, t with 13 degrees of freedom for the polishes, normal
    for the control's bootstrap interval) it is about [−0.02, +0.19], which contains 0. Seeds 1 and 2: −0.01 [−0.07,
    +0.06] and −0.03 [−0.14, +0.08]."""
    pop = _first_run("d_f")
    diff = pop["paired"]["MC − OracleImitation-v2"]["worst_case"]
    control = next(c for c in pop["checkpoints"] if c["name"] == "OracleImitation-v2")["worst_case"]
    rf = _control_card()
    assert control == rf["value"]  # the card is the record of this control checkpoint
    assert (_r(diff["mean"]), _r(diff["ci"][0]), _r(diff["ci"][1]), diff["n"], diff["first_lower"]) == (
        0.09,
        0.01,
        0.16,
        14,
        3,
    )
    se_polishes = (diff["ci"][1] - diff["ci"][0]) / 2 / stats.t.ppf(0.975, diff["n"] - 1)
    se_control = (rf["ci"][1] - rf["ci"][0]) / 2 / stats.norm.ppf(0.975)
    half = stats.norm.ppf(0.975) * math.hypot(se_polishes, se_control)
    combined = [_r(diff["mean"] - half), _r(diff["mean"] + half)]
    assert combined == [-0.02, 0.19]
    for path in WRITE_UPS_Q2:
        quoted = [[float(a), float(b)] for a, b in re.findall(rf"about \[({NUMBER}), ({NUMBER})\]", _text(path))]
        assert quoted and all(q == combined for q in quoted), path

    later = {}
    for name in ("d_f-seed1", "d_f-seed2"):
        w = _first_run(name)["paired"]["MC − OracleImitation-v2"]["worst_case"]
        later[name] = [_r(w["mean"]), _r(w["ci"][0]), _r(w["ci"][1])]
        assert w["ci"][0] < 0 < w["ci"][1], name
    assert later == {"d_f-seed1": [-0.01, -0.07, 0.06], "d_f-seed2": [-0.03, -0.14, 0.08]}
    audit = _text(RESULTS / "audit" / "README.md")
    assert _after(audit, "not distinguishable on either:", 6) == later["d_f-seed1"] + later["d_f-seed2"]
    control_readme = _text(WORST / "control" / "README.md")
    assert _after(control_readme, "not distinguishable either (", 6) == later["d_f-seed1"] + later["d_f-seed2"]
    for path in WRITE_UPS_Q2:
        assert "**MC is less robust than the control**" not in path.read_text(), path
        assert "worse on one" not in _text(path), path


# 3. Δ's ranking of the preset's recovery against the searched worst case ---------------------------------------------


def _spearmans(pop: dict) -> tuple[float, float, dict]:
    worst = pop["worst_case"]
    preset = worst.get("preset_on_half_b") or worst["preset_on_report_set"]
    return (
        worst["predictors"]["delta"]["spearman"]["r"],
        preset["delta"]["spearman"]["r"],
        worst["spearman_gap"]["delta"],
    )


def test_the_first_build_ranks_the_searched_worst_case_no_worse():
    """On the first build Δ's Spearman is higher with the searched worst case (+0.63) than with the preset (+0.55);
    the paired gap on the 30 checkpoints with both is −0.01 [−0.17, +0.18]."""
    searched, preset, gap = _spearmans(json.loads((WORST / "d_f" / "population.json").read_text()))
    assert searched > preset
    numbers = [_r(searched), _r(preset), _r(gap["r"]), _r(gap["ci"][0]), _r(gap["ci"][1])]
    assert numbers == [0.63, 0.55, -0.01, -0.17, 0.18]
    rebuilt, audit = _text(REBUILT / "README.md"), _text(RESULTS / "audit" / "README.md")
    assert _after(rebuilt, "on the first build the point estimates go the other way (", 5) == numbers
    assert _after(audit, "higher with the searched worst case than with the preset (", 5) == numbers


def test_the_rebuilt_seeds_show_the_ranking_gap_on_two_of_three():
    """As first run on the rebuilt population, Δ's Spearman is lower with the searched worst case (−0.08 to +0.47)
    than with the preset (+0.47 to +0.64) on each seed, but the gap's interval lies below 0 on seeds 0 and 1 only:
    seed 2's is −0.12 [−0.27, +0.005], not shown by the plan's rule."""
    gaps, searched, preset = {}, [], []
    for name in ("d_f", "d_f-seed1", "d_f-seed2"):
        s, p, gap = _spearmans(_first_run(name))
        assert s < p, name
        searched.append(s)
        preset.append(p)
        gaps[name] = (gap["r"], *gap["ci"])
    assert [name for name, (_, _, high) in gaps.items() if high < 0] == ["d_f", "d_f-seed1"]
    seed2 = [_r(gaps["d_f-seed2"][0]), _r(gaps["d_f-seed2"][1]), _r(gaps["d_f-seed2"][2], 3)]
    assert seed2 == [-0.12, -0.27, 0.005]
    ranges = [_r(min(searched)), _r(max(searched)), _r(min(preset)), _r(max(preset))]
    assert ranges == [-0.08, 0.47, 0.47, 0.64]
    rebuilt = _text(REBUILT / "README.md")
    assert _after(rebuilt, "lower with the searched worst case (", 2) == ranges[:2]
    assert _after(rebuilt, "than with the preset's recovery (", 2) == ranges[2:]
    assert _after(rebuilt, "shown on seeds 0 and 1 only (seed 2: gap", 3) == seed2
    assert _after(_text(RESULTS / "audit" / "README.md"), "seed 2 does not show it (gap", 3) == seed2
    assert "better than the searched worst case's does" not in rebuilt


# 4. MC's K20-LoRA change, and the retain-only medians ----------------------------------------------------------------


def test_the_k20_change_states_its_spread_over_methods():
    """MC − baseline in K20-LoRA ROUGE-L on the testbed: −0.054 on average, [−0.057, −0.051] over the three seeds of
    the mean over methods, [−0.096, −0.012] over the 15 methods' seed means; lower for 11 of 15, the interval over
    seeds below 0 for 3 (UNDIAL, SAMNPO, CRNPO), the wrong way for 4 (GradAscent, RMU, PDU, GradDiff)."""
    change = defaultdict(dict)
    for path in sorted((TESTBED / "head2head" / "cells").glob("*.json")):
        r = json.loads(path.read_text())
        mc, base = r["models"]["mc"]["attacks"][K20], r["models"]["baseline"]["attacks"][K20]
        change[r["cell"]["method"]][r["cell"]["seed"]] = mc["rouge_l"] - base["rouge_l"]
    over_seeds = mean_interval([statistics.mean(v[s] for v in change.values()) for s in (0, 1, 2)])
    per_method = {m: mean_interval(list(v.values())) for m, v in change.items()}
    over_methods = mean_interval([i.mean for i in per_method.values()])
    assert (over_seeds.n, over_methods.n) == (3, 15)
    seeds_ci = [_r(over_seeds.low, 3), _r(over_seeds.high, 3)]
    methods_ci = [_r(over_methods.low, 3), _r(over_methods.high, 3)]
    assert _r(over_seeds.mean, 3) == _r(over_methods.mean, 3) == -0.054
    assert seeds_ci == [-0.057, -0.051] and methods_ci == [-0.096, -0.012]
    lower = sum(i.mean < 0 for i in per_method.values())
    shown = {m for m, i in per_method.items() if i.high < 0}
    wrong = sorted((m for m, i in per_method.items() if i.mean > 0), key=lambda m: -per_method[m].mean)
    assert lower == 11 and shown == {"UNDIAL", "SAMNPO", "CRNPO"}
    assert wrong == ["GradAscent", "RMU", "PDU", "GradDiff"]

    row = next(line for line in (TESTBED / "README.md").read_text().splitlines() if line.startswith("| MC lowers K20"))
    text = _text_of(row)
    assert _after(text, "| mean over methods", 1) == [_r(over_methods.mean, 3)]
    assert _after(text, "over the three seeds of that mean", 2) == seeds_ci
    assert _after(text, "over the 15 methods' seed means", 2) == methods_ci
    assert _after(text, "lower for", 2) == [lower, len(per_method)]
    assert _after(text, "per method (over seeds) the interval excludes 0 for", 4) == [
        len(shown),
        _r(per_method["UNDIAL"].mean, 3),
        _r(per_method["UNDIAL"].low, 3),
        _r(per_method["UNDIAL"].high, 3),
    ]
    claimed = re.search(r"(\d+) go the wrong way, (\w+) (\S+), (\w+) (\S+), (\w+) (\S+) and (\w+) (\S+) \(", text)
    assert int(claimed.group(1)) == len(wrong)
    assert [(claimed.group(i), float(claimed.group(i + 1))) for i in (2, 4, 6, 8)] == [
        (m, _r(per_method[m].mean, 3)) for m in wrong
    ]
    mini = _text(RESULTS / "mini" / "README.md")
    assert _after(mini, "over the 15 methods", 4) == [-methods_ci[1], -methods_ci[0], lower, len(wrong)]


def test_the_retain_only_medians_are_read_from_their_populations():
    """Retain-only relearning, searched recovered fraction: the polishes' medians −0.19, −0.30, −0.27 on seeds 0–2
    (the write-up said −0.20, −0.31, −0.28), the baselines' −0.09, −0.15, −0.22, the control +0.03."""
    polishes, baselines, controls = [], [], set()
    for name in ("retain", "retain-seed1", "retain-seed2"):
        rows = json.loads((REBUILT / name / "population.json").read_text())["checkpoints"]
        valid = [r for r in rows if r["worst_case"] is not None]
        polishes.append(_r(statistics.median(r["worst_case"] for r in valid if r["name"].endswith("+MC"))))
        baselines.append(
            _r(statistics.median(r["worst_case"] for r in valid if "+" not in r["name"] and "Oracle" not in r["name"]))
        )
        controls |= {_r(r["worst_case"]) for r in valid if r["name"] == "OracleImitation-v2"}
    assert polishes == [-0.19, -0.3, -0.27] and baselines == [-0.09, -0.15, -0.22] and controls == {0.03}
    text = _text(REBUILT / "README.md")
    assert _after(text, "median searched recovered fraction of the polishes", 3) == polishes
    assert _after(text, "on seeds 0, 1, 2; of the baselines", 3) == baselines
    assert _after(text, "-0.22; the control", 1) == list(controls)
    assert _after(text, "The polishes go lowest (median", 1) == polishes[:1]
