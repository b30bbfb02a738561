"""Four findings an independent review found stated more strongly than their records allow, read back: each test
recomputes the claim's number and interval from the committed record and parses the same number from the
hand-written write-up, so it fails when either drifts.

1. the cliff-at-the-plateau premise (``results/testbed/premises.json``, the head-to-head cells);
2. MC against the oracle-imitation control on the rebuilt population (the control's own card; the audits as first
   run, whose populations ``rebuilt/first-selection/`` keeps beside issue 58's reruns);
3. Δ's ranking of the preset's recovery against the searched worst case (the first build's population in the tree;
   the rebuilt population as first run);
4. MC's K20-LoRA change on the testbed (the head-to-head cells) and the retain-only medians (``rebuilt/retain*``).

The same recomputations are read back from docs/results.md, and the bullets of README.md's "What the results found"
each from the record it links (the last section): a number in either that drifts from its record fails here.
"""

import functools
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import pyarrow.parquet as pq
from conftest import ROOT
from scipy import stats

from margincal.results.stats import MeanInterval, mean_interval

RESULTS = ROOT / "results"
TESTBED = RESULTS / "testbed"
WORST = RESULTS / "audit" / "testbed-worst"
REBUILT = WORST / "rebuilt"
CONTROL = WORST / "control"
README = ROOT / "README.md"
DOCS = ROOT / "docs" / "results.md"
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


@functools.cache
def _json(path: Path) -> dict:
    """A record read once per session (audit cards are about 1 MB); callers only read it."""
    return json.loads(path.read_text())


@functools.cache
def _cells() -> tuple[dict, ...]:
    """The testbed head-to-head's cell records (15 methods × 3 seeds)."""
    return tuple(json.loads(p.read_text()) for p in sorted((TESTBED / "head2head" / "cells").glob("*.json")))


# 1. The premise ------------------------------------------------------------------------------------------------------


class Premises(NamedTuple):
    """premises.json's methods (seed 0) read three ways: Δ > 0 at the plateau, certified (ℓ > m_ref), retain kept
    (retain ROUGE-L ≥ 0.9, among those above), and the whole premise row (all three)."""

    methods: dict
    above: set
    certified: set
    kept: set
    row: set


def _premises() -> Premises:
    methods = _json(TESTBED / "premises.json")["methods"]
    above = {m for m, v in methods.items() if v["delta"] > 0}
    certified = {m for m, v in methods.items() if v["certified"]}
    kept = {m for m in above if methods[m]["retain_rougeL"] >= 0.9}
    return Premises(methods, above, certified, kept, above & certified & kept)


# "… for 5 (SimNPO, UNDIAL, JensUn, PDU and, barely, RMU at +0.64), 3 of them [are] certified, [and] 1 (SimNPO) meet…"
PREMISE_NAMES = (
    r"\(([^()]+?) and, barely, (\w+) at [^)]+\)[,;] \d+ of them (?:are )?certified, (?:and )?\d+ \((\w+)\) mee"
)


def _premise_names(text: str) -> tuple[set, set]:
    """The methods a README or docs sentence names above the cliff, and the one it names meeting the whole row."""
    named = re.search(PREMISE_NAMES, text)
    return set(named.group(1).split(", ")) | {named.group(2)}, {named.group(3)}


def test_the_premise_counts_are_read_from_premises_json_and_the_cells():
    """Δ > 0 at the plateau for 5 of 15 methods (RMU too, Δ +0.64), certified (ℓ > m_ref) for 3, the whole premise row
    (with retain ≥ 0.9) for 1; the head-to-head's baselines are above the cliff in 15 of 45 cells, the same 5 methods on
    every seed. No reading gives round 1's four (SimNPO, UNDIAL, JensUn, PDU). The docs page states the same counts."""
    methods, above, certified, kept, row = _premises()
    assert above == {"SimNPO", "UNDIAL", "JensUn", "PDU", "RMU"} and _r(methods["RMU"]["delta"]) == 0.64
    assert certified == {"SimNPO", "UNDIAL", "JensUn"} and kept == {"SimNPO", "PDU"} and row == {"SimNPO"}
    cells = _cells()
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
    # docs/results.md
    docs = _text(DOCS)
    crossed = sum(v["delta"] <= 0 for v in methods.values())
    assert _after(docs, "there too", 2) == [crossed, len(methods)]
    stated = [len(above), len(methods), _r(methods["RMU"]["delta"]), len(certified), len(row)]
    assert _after(docs, "at a plateau of each method's own loss for only", 5) == stated
    assert _premise_names(docs) == (above, row)


# 2. MC against the oracle-imitation control --------------------------------------------------------------------------

WRITE_UPS_Q2 = (
    RESULTS / "audit" / "README.md",
    WORST / "README.md",
    REBUILT / "README.md",
    WORST / "control" / "README.md",
    DOCS,
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
        pattern = rf"(?:from its card (?:added )?\(|searched, half B: )({NUMBER}) \[({NUMBER}), ({NUMBER})\]"
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
    docs = _text(DOCS)
    stated = [_r(diff["mean"]), _r(diff["ci"][0]), _r(diff["ci"][1]), diff["first_lower"], diff["n"]]
    assert _after(docs, "On that build MC - control under the searched attacker is", 5) == stated
    assert (
        _after(docs, "MC is not distinguishable from the control on either (", 6)
        == later["d_f-seed1"] + later["d_f-seed2"]
    )
    for path in WRITE_UPS_Q2:
        assert "**MC is less robust than the control**" not in path.read_text(), path
        assert "worse on one" not in _text(path), path


# 3. Δ's ranking of the preset's recovery against the searched worst case ---------------------------------------------


def _spearmans(pop: dict) -> tuple[dict, dict, dict]:
    """Δ's Spearman with the searched worst case, with the preset's recovery, and their paired gap (each r, ci)."""
    worst = pop["worst_case"]
    preset = worst.get("preset_on_half_b") or worst["preset_on_report_set"]
    return worst["predictors"]["delta"]["spearman"], preset["delta"]["spearman"], worst["spearman_gap"]["delta"]


def test_the_first_build_ranks_the_searched_worst_case_no_worse():
    """On the first build Δ's Spearman is higher with the searched worst case (+0.63) than with the preset (+0.55);
    the paired gap on the 30 checkpoints with both is −0.01 [−0.17, +0.18]; with their intervals (docs) +0.63 [+0.29,
    +0.84] and +0.55 [+0.16, +0.83]."""
    searched, preset, gap = _spearmans(json.loads((WORST / "d_f" / "population.json").read_text()))
    assert searched["r"] > preset["r"]
    numbers = [_r(searched["r"]), _r(preset["r"]), _r(gap["r"]), _r(gap["ci"][0]), _r(gap["ci"][1])]
    assert numbers == [0.63, 0.55, -0.01, -0.17, 0.18]
    rebuilt, audit = _text(REBUILT / "README.md"), _text(RESULTS / "audit" / "README.md")
    assert _after(rebuilt, "on the first build the point estimates go the other way (", 5) == numbers
    assert _after(audit, "higher with the searched worst case than with the preset (", 5) == numbers
    docs = _text(DOCS)
    assert _after(docs, "on the first build the point estimates go the other way (", 5) == numbers
    with_intervals = [_r(x) for s in (searched, preset, gap) for x in (s["r"], *s["ci"])]
    assert with_intervals == [0.63, 0.29, 0.84, 0.55, 0.16, 0.83, -0.01, -0.17, 0.18]
    assert _after(docs, "predicts the worst case about as well as the preset**: Spearman", 9) == with_intervals


def test_the_rebuilt_seeds_show_the_ranking_gap_on_two_of_three():
    """As first run on the rebuilt population, Δ's Spearman is lower with the searched worst case (−0.08 to +0.47)
    than with the preset (+0.47 to +0.64) on each seed, but the gap's interval lies below 0 on seeds 0 and 1 only:
    seed 2's is −0.12 [−0.27, +0.005], not shown by the plan's rule. Seeds 0 and 1's gaps: −0.45 [−0.78, −0.12] (Δ's
    Spearman +0.06 against +0.64) and −0.44 [−0.69, −0.21]."""
    gaps, searched, preset = {}, [], []
    for name in ("d_f", "d_f-seed1", "d_f-seed2"):
        s, p, gap = _spearmans(_first_run(name))
        assert s["r"] < p["r"], name
        searched.append(s["r"])
        preset.append(p["r"])
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
    # docs/results.md
    seed0 = [_r(searched[0]), _r(preset[0]), *(_r(x) for x in gaps["d_f"])]
    assert seed0 == [0.06, 0.64, -0.45, -0.78, -0.12]
    shown = [_r(gaps[name][0]) for name in ("d_f", "d_f-seed1")]
    assert shown == [-0.45, -0.44]
    docs = _text(DOCS)
    assert _after(docs, "worse than the preset** (Spearman", 5) == seed0
    assert _after(docs, "takes away Δ's ranking (gaps", 2) == shown
    assert _after(docs, "agreed that Δ predicts the searched worst case worse than the preset (gap", 2) == shown
    assert _after(docs, "both intervals below 0); on seed 2 the gap is", 4) == [*seed2, _r(searched[2])]
    assert _after(docs, "lower with the searched worst case (", 2) == ranges[:2]
    assert _after(docs, "than with the preset's recovery (", 2) == ranges[2:]
    assert _after(docs, "shown on seeds 0 and 1 only (on seed 2 the gap is", 3) == seed2
    assert "better than the searched worst case's does" not in docs


# 4. MC's K20-LoRA change, and the retain-only medians ----------------------------------------------------------------


def _k20(model: dict) -> float:
    return model["attacks"][K20]["rouge_l"]


def _utility(model: dict) -> float:
    return model["summary"]["model_utility"]


class Change(NamedTuple):
    """MC − baseline of one measure over the head-to-head cells: the mean over methods with its Student-t interval
    over the three seeds, each method's over its seeds, and the mean of the methods' seed means with its interval
    over the methods."""

    over_seeds: MeanInterval
    per_method: dict[str, MeanInterval]
    over_methods: MeanInterval


def _change(measure) -> Change:
    change = defaultdict(dict)
    for r in _cells():
        change[r["cell"]["method"]][r["cell"]["seed"]] = measure(r["models"]["mc"]) - measure(r["models"]["baseline"])
    over_seeds = mean_interval([statistics.mean(v[s] for v in change.values()) for s in (0, 1, 2)])
    per_method = {m: mean_interval(list(v.values())) for m, v in change.items()}
    return Change(over_seeds, per_method, mean_interval([i.mean for i in per_method.values()]))


def _panel_means(measure) -> list[float]:
    """The head-to-head's panel means of one measure, baseline and MC (as benchmarks/results_summary.py prints)."""
    return [statistics.mean(measure(r["models"][role]) for r in _cells()) for role in ("baseline", "mc")]


def _k20_spread() -> tuple[Change, int, set, list]:
    """The K20-LoRA change, how many methods go lower, whose interval over seeds lies below 0, and which go the wrong
    way (largest first)."""
    change = _change(_k20)
    per_method = change.per_method
    lower = sum(i.mean < 0 for i in per_method.values())
    shown = {m for m, i in per_method.items() if i.high < 0}
    wrong = sorted((m for m, i in per_method.items() if i.mean > 0), key=lambda m: -per_method[m].mean)
    return change, lower, shown, wrong


def test_the_k20_change_states_its_spread_over_methods():
    """MC − baseline in K20-LoRA ROUGE-L on the testbed: −0.054 on average, [−0.057, −0.051] over the three seeds of
    the mean over methods, [−0.096, −0.012] over the 15 methods' seed means; lower for 11 of 15, the interval over
    seeds below 0 for 3 (UNDIAL, SAMNPO, CRNPO), the wrong way for 4 (GradAscent, RMU, PDU, GradDiff). The docs page
    states it as a decrease: by 0.054, [0.051, 0.057], [0.012, 0.096], UNDIAL by 0.27 [0.11, 0.42]."""
    (over_seeds, per_method, over_methods), lower, shown, wrong = _k20_spread()
    assert (over_seeds.n, over_methods.n) == (3, 15)
    seeds_ci = [_r(over_seeds.low, 3), _r(over_seeds.high, 3)]
    methods_ci = [_r(over_methods.low, 3), _r(over_methods.high, 3)]
    assert _r(over_seeds.mean, 3) == _r(over_methods.mean, 3) == -0.054
    assert seeds_ci == [-0.057, -0.051] and methods_ci == [-0.096, -0.012]
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
    # docs/results.md, as a decrease
    undial = per_method["UNDIAL"]
    stated = [
        -_r(over_methods.mean, 3),
        len(per_method),
        -seeds_ci[1],
        -seeds_ci[0],
        -methods_ci[1],
        -methods_ci[0],
        lower,
        len(per_method),
        len(shown),
        -_r(undial.mean),
        -_r(undial.high),
        -_r(undial.low),
        len(wrong),
    ]
    docs = _text(DOCS)
    assert _after(docs, "MC lowers K20-LoRA ROUGE-L by", 13) == stated
    listed = re.search(r"\d+ go the wrong way \(([^)]+?), each interval including 0\)", docs)
    assert re.split(r", (?:and )?", listed.group(1)) == wrong
    assert all(per_method[m].low < 0 < per_method[m].high for m in wrong)


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


# README.md's "What the results found" --------------------------------------------------------------------------------

FINDINGS = "## What the results found"
README_FINDINGS = (  # each bullet's bold lead, in order; every one has its test below
    "The mini demo is a working pipeline, not evidence",
    "On the plateau testbed the paper's premise mostly fails",
    "MC lowers K20-LoRA ROUGE-L a little on average, not for every method",
    "MC costs model utility and rarely crosses the cliff",
    "Δ predicts relearning no better than simpler scores",
    "Under the worst case as the strongest valid attack, MC's advantage survives on all three seeds",
    "MC is not shown more robust than the oracle-imitation control on any seed",
    "One build or seed of the mini testbed did not predict the next",
)
FIXED = ("d_f", "d_f-seed1", "d_f-seed2")  # the rebuilt population's D_f audits rerun with the fixed selection
BUILDS = (  # an audit of each build of θ_ref and θ0: the first, the second (AMD; the control's cards), the third (Xeon)
    WORST / "d_f",
    CONTROL / "d_f",
    REBUILT / "d_f",
)


def _findings_section() -> str:
    text = README.read_text()
    start = text.index(f"\n{FINDINGS}\n")
    return text[start : text.index("\n## ", start + 1)]


def _findings() -> str:
    """README.md's section "What the results found" as one line (`_after`'s anchors must occur once in it)."""
    return _text_of(_findings_section())


def _bullets() -> dict[str, str]:
    """The section's bullets by their bold lead, each as one line."""
    bullets = [_text_of(b) for b in re.findall(r"^- .*(?:\n  .*)*", _findings_section(), re.M)]
    return {re.match(r"- \*\*(.+?)\*\*", b).group(1): b for b in bullets}


def test_readme_every_finding_has_its_check_and_the_demo_states_no_number():
    """The section holds exactly the eight bullets checked here (a new one needs its check); the first, on the mini
    demo, states no number to read back."""
    bullets = _bullets()
    assert list(bullets) == list(README_FINDINGS)
    assert re.findall(NUMBER, bullets[README_FINDINGS[0]]) == []


def test_readme_the_premise_counts():
    """10 of the 15 plateau-trained baselines cross on their own; Δ > 0 at the plateau for 5 (RMU at +0.64), 3 of them
    certified, 1 (SimNPO) meeting the whole premise row; counts at seed 0 (premises.json)."""
    methods, above, certified, _, row = _premises()
    crossed = sum(v["delta"] <= 0 for v in methods.values())
    assert [crossed, len(methods), len(above), len(certified), len(row)] == [10, 15, 5, 3, 1]
    assert certified <= above  # "3 of them"
    text = _findings()
    assert _after(text, "the paper's premise mostly fails**:", 2) == [crossed, len(methods)]
    stated = [len(above), _r(methods["RMU"]["delta"]), len(certified), len(row)]
    assert _after(text, "Δ > 0 at the plateau for", 4) == stated
    assert _premise_names(text) == (above, row)
    assert _after(text, "counts at seed", 1) == [_json(TESTBED / "premises.json")["seed"]]
    # the opening lines claim no more: the paper's claim as the paper's, beside what the testbed found
    opening = README.read_text(encoding="utf-8").split("## ")[0]
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8").split("Read in order")[0]
    assert "every published method stops above" not in opening + home
    assert "it reports that published methods stop above" in opening and "reports that published methods" in home
    assert "most baselines crossed the cliff on their own" in opening and crossed > len(methods) / 2
    assert _after(home, "On this project's plateau testbed", 2) == [crossed, len(methods)]


def test_readme_the_k20_change_and_its_spread():
    """MC lowers K20-LoRA ROUGE-L by 0.054 (0.466 → 0.412): [0.051, 0.057] over the three seeds of the mean over
    methods, [0.012, 0.096] over the 15 methods; 11 of 15 lower, 3 shown per method, 4 the wrong way (GradAscent, RMU,
    PDU, GradDiff)."""
    (over_seeds, per_method, over_methods), lower, shown, wrong = _k20_spread()
    baseline, mc = _panel_means(_k20)
    assert _r(baseline - mc, 3) == -_r(over_methods.mean, 3)  # a paired mean over 45 cells
    stated = [
        -_r(over_methods.mean, 3),
        _r(baseline, 3),
        _r(mc, 3),
        -_r(over_seeds.high, 3),
        -_r(over_seeds.low, 3),
        len(per_method),
        -_r(over_methods.high, 3),
        -_r(over_methods.low, 3),
        lower,
        len(per_method),
        len(shown),
        len(wrong),
    ]
    assert stated == [0.054, 0.466, 0.412, 0.051, 0.057, 15, 0.012, 0.096, 11, 15, 3, 4]
    text = _findings()
    assert _after(text, "not for every method**: by", 12) == stated
    assert re.search(r"\d+ the wrong way \(([^)]+)\)", text).group(1).split(", ") == wrong


def test_readme_and_docs_the_utility_cost_and_the_one_crossing():
    """MU −0.059 [−0.095, −0.022] over three seeds (0.657 → 0.599); of the 5 methods above the cliff (baseline Δ > 0 in
    every cell) MC crosses only RMU, in every cell; the others in none."""
    over_seeds = _change(_utility).over_seeds
    baseline, mc = _panel_means(_utility)
    assert over_seeds.n == 3
    stated = [_r(over_seeds.mean, 3), _r(over_seeds.low, 3), _r(over_seeds.high, 3), _r(baseline, 3), _r(mc, 3)]
    assert stated == [-0.059, -0.095, -0.022, 0.657, 0.599]
    deltas = defaultdict(lambda: defaultdict(list))
    for r in _cells():
        for role in ("baseline", "mc"):
            deltas[role][r["cell"]["method"]].append(r["models"][role]["summary"]["delta"])
    above = {m for m, v in deltas["baseline"].items() if min(v) > 0}
    crossed = {m for m in above if max(deltas["mc"][m]) <= 0}
    assert above == _premises().above and crossed == {"RMU"}
    assert all(min(deltas["mc"][m]) > 0 for m in above - crossed)  # "only": no other crosses on any seed
    text = _findings()
    assert _after(text, "rarely crosses the cliff**: MU", 6) == [*stated, len(above)]
    assert set(re.findall(r"MC crosses only (\w+)", text)) == crossed
    docs = _text(DOCS)  # as a cost
    assert _after(docs, "It costs model utility", 3) == [-stated[0], -stated[2], -stated[1]]
    assert len(crossed) == 1 and len(above) == 5
    assert "it crosses only one of the five methods above the cliff" in docs


def test_readme_and_docs_the_population_spearmans():
    """Over the testbed's 30 checkpoints (results/audit/population.json) Spearman with the K20-LoRA recovered fraction:
    Δ +0.43 [−0.01, +0.72], the membership advantage +0.51 [+0.10, +0.79], forget ROUGE-L +0.35 [−0.08, +0.72]
    (bootstrap intervals over checkpoints, as recorded; each r recomputed from the checkpoints' rows)."""
    pop = _json(RESULTS / "audit" / "population.json")
    rows = pop["checkpoints"]
    stated = []
    for key in ("delta", "mia_advantage", "forget_rouge_l"):
        spearman = pop["predictors"][key]["spearman"]
        r = stats.spearmanr([c[key] for c in rows], [c["recovered_fraction"] for c in rows]).statistic
        assert math.isclose(r, spearman["r"]) and spearman["n"] == len(rows), key
        stated += [_r(spearman["r"]), _r(spearman["ci"][0]), _r(spearman["ci"][1])]
    assert len(rows) == 30 and stated == [0.43, -0.01, 0.72, 0.51, 0.1, 0.79, 0.35, -0.08, 0.72]
    text = _findings()
    assert _after(text, "over the testbed's", 1) == [len(rows)]
    assert _after(text, "recovered fraction is", 9) == stated
    docs = _text(DOCS)
    assert _after(docs, "on the testbed's", 1) == [len(rows)]
    assert _after(docs, "Spearman correlation with the K20-LoRA recovered fraction is", 9) == stated


class FixedSelection(NamedTuple):
    """One rebuilt D_f audit rerun with the fixed selection: MC − baseline under the preset on the report set (mean,
    interval, pairs), the pairs with both searched rows valid, and the card's searched winners invalid at this scale
    (each lowering θ0's own held-out score past the sanity rule) out of its checkpoints."""

    preset: list[float]
    pairs: int
    valid_pairs: int
    invalid: int
    checkpoints: int


def _fixed_selection(name: str) -> FixedSelection:
    paired = _json(REBUILT / name / "population.json")["paired"]["MC − baseline"]
    preset = paired["preset_report"]
    assert preset["ci"][1] < 0 and paired["worst_case"]["ci"][0] < 0 < paired["worst_case"]["ci"][1], name
    card = _json(REBUILT / name / "card.json")["checkpoints"]
    sanity = [e["searched"]["lora_r8"]["searched"]["sanity"] for e in card.values()]
    invalid = [s["why"] for s in sanity if not s["valid"]]
    assert all(why.startswith("it lowers θ0") for why in invalid), name
    rounded = [_r(preset["mean"]), _r(preset["ci"][0]), _r(preset["ci"][1])]
    return FixedSelection(rounded, preset["n"], paired["worst_case"]["n"], len(invalid), len(card))


def test_readme_and_docs_the_preset_holds_and_the_search_is_not_shown():
    """With the fixed selection (rebuilt/d_f*): MC − baseline under the preset −0.11 [−0.17, −0.04], −0.10 [−0.17,
    −0.02], −0.12 [−0.18, −0.06] over each seed's 15 pairs (each interval below 0); 11, 10 and 13 of 31 searched
    winners invalid (10–13), leaving 5, 7 and 6 valid pairs (5–7), whose searched interval contains 0."""
    reads = [_fixed_selection(name) for name in FIXED]
    presets = [x for read in reads for x in read.preset]
    assert presets == [-0.11, -0.17, -0.04, -0.1, -0.17, -0.02, -0.12, -0.18, -0.06]
    invalid, valid = [read.invalid for read in reads], [read.valid_pairs for read in reads]
    assert invalid == [11, 10, 13] and valid == [5, 7, 6]
    assert {read.pairs for read in reads} == {15} and {read.checkpoints for read in reads} == {31}
    text = _findings()
    assert _after(text, "under the preset it held on three seeds:", 9) == presets
    assert _after(text, "(over each seed's", 4) == [reads[0].pairs, min(invalid), max(invalid), reads[0].checkpoints]
    assert _after(text, "own answers and left", 2) == [min(valid), max(valid)]
    docs = _text(DOCS)
    stated = [min(invalid), max(invalid), reads[0].checkpoints]
    assert _after(docs, "the preset itself broke the utility bound. But", 3) == stated
    assert _after(docs, "**not shown** on any seed (", 2) == [min(valid), max(valid)]
    assert _after(docs, "**holds on all three** (", 3) == [read.preset[0] for read in reads]


VALID = WORST / "valid"  # issue 73: the worst case as the strongest valid attack (Addendum 6)


def test_readme_and_docs_the_worst_case_is_valid_on_every_row_and_mc_survives_on_three_seeds():
    """valid/d_f, d_f-seed1, d_f-seed2 (issue 73, a fourth build): every one of the 31 searched rows of each seed is
    valid on the report set; MC − baseline under the worst case −0.11 [−0.17, −0.04], −0.08 [−0.15, −0.01], −0.13
    [−0.22, −0.03] over all 15 pairs (each interval below 0: survives), under the preset on the same records −0.10,
    −0.09, −0.08; MC − control +0.09 [+0.01, +0.17] on seed 0 (above 0), containing 0 on seeds 1 and 2 (+0.07,
    +0.03); Δ's Spearman gap worst case − preset below 0 with its interval on seed 2 only (−0.15 [−0.30, −0.01])."""
    worst, preset, control, gap = [], [], [], []
    for name in FIXED:
        pop = _json(VALID / name / "population.json")
        card = _json(VALID / name / "card.json")["checkpoints"]
        rows = [e["searched"]["lora_r8"]["searched"] for e in card.values()]
        assert len(rows) == 31 and all(r is not None and r["sanity"]["valid"] for r in rows), name
        w, p = pop["paired"]["MC − baseline"]["worst_case"], pop["paired"]["MC − baseline"]["preset_report"]
        c, g = pop["paired"]["MC − OracleImitation-v2"]["worst_case"], pop["worst_case"]["spearman_gap"]["delta"]
        assert w["ci"][1] < 0 and w["n"] == p["n"] == c["n"] == 15, name
        worst += [_r(w["mean"]), _r(w["ci"][0]), _r(w["ci"][1])]
        preset.append(_r(p["mean"]))
        control.append([_r(c["mean"]), _r(c["ci"][0]), _r(c["ci"][1])])
        gap.append([_r(g["r"]), _r(g["ci"][0]), _r(g["ci"][1])])
    assert worst == [-0.11, -0.17, -0.04, -0.08, -0.15, -0.01, -0.13, -0.22, -0.03]
    assert preset == [-0.1, -0.09, -0.08]
    assert control[0][1] > 0 and all(lo < 0 < hi for _, lo, hi in control[1:])
    assert [g[2] < 0 for g in gap] == [False, False, True]
    text = _findings()
    assert _after(text, "MC - baseline recovered fraction", 9) == worst
    assert _after(text, "under the preset on the same records", 3) == preset
    assert _after(text, "under the worst case on seed 0 (", 3) == control[0]
    docs = _text(DOCS)
    assert _after(docs, "MC - baseline under the worst case is", 9) == worst
    assert _after(docs, "the preset on the same records -0.10,", 2) == preset[1:]
    assert _after(docs, "MC - control is", 3) == control[0]
    assert _after(docs, "not distinguishable on seeds 1 and 2 (", 2) == [c[0] for c in control[1:]]
    gaps = "Δ never ranks the worst case better than it ranks the preset: gaps"
    assert _after(docs, gaps, 2) == [g[0] for g in gap[:2]]
    assert _after(docs, "and -0.15", 2) == gap[2][1:]


def test_readme_and_docs_the_control_matches_the_outputs_not_the_margin():
    """The control's forget ROUGE-L 0.375 against θ_ref's 0.364 (its card, and the unattacked rows of both on D_f in
    its samples.parquet), yet Δ +3.03 (its card); MC and the control are not distinguishable on any seed (the fixed
    selection's MC − control interval contains 0 on all three)."""
    entry = _json(CONTROL / "d_f" / "card.json")["checkpoints"]["OracleImitation-v2"]
    samples = pq.read_table(CONTROL / "d_f" / "samples.parquet", columns=["model", "row", "rouge_l"]).to_pylist()
    unattacked = defaultdict(list)
    for s in samples:
        if s["row"] == "unattacked":
            unattacked[s["model"]].append(s["rouge_l"])
    control, reference = statistics.mean(unattacked["OracleImitation-v2"]), statistics.mean(unattacked["reference"])
    assert math.isclose(control, entry["forget"]["forget_Q_A_ROUGE"]) and len(unattacked["reference"]) == 200
    stated = [_r(control, 3), _r(reference, 3), _r(entry["delta"]["value"])]
    assert stated == [0.375, 0.364, 3.03]
    for name in FIXED:
        ci = _json(REBUILT / name / "population.json")["paired"]["MC − OracleImitation-v2"]["worst_case"]["ci"]
        assert ci[0] < 0 < ci[1], name
    assert _after(_findings(), "outputs (forget ROUGE-L", 3) == stated
    assert _after(_text(DOCS), "does reach them (", 3) == stated


def test_readme_and_docs_theta_refs_margin_differs_between_builds():
    """θ_ref's margin on D_f (m_ref in every checkpoint's Δ of an audit card) on its three builds: −4.48 (the first,
    testbed-worst/d_f), −4.80 (the second, the control's cards), −4.89 (the third, the fixed-selection reruns)."""
    margins = []
    for audit in BUILDS:
        m_ref = {e["delta"]["m_ref"] for e in _json(audit / "card.json")["checkpoints"].values()}
        assert len(m_ref) == 1, audit
        margins.append(_r(m_ref.pop()))
    assert margins == [-4.48, -4.8, -4.89]
    assert _after(_findings(), "its margin on D_f", 3) == margins
    assert _after(_text(DOCS), "θ_ref's margin on D_f", 2) == [margins[1], margins[0]]


DEMO_VALID = WORST.parent / "demo-worst-valid"  # issue 73: the demo's worst budget on all seven checkpoints


def test_the_demo_rerun_shows_every_valid_row_and_its_headline_presets_are_not_valid():
    """demo-worst-valid (issue 73): of 49 rows (7 checkpoints × 7 families) every one with an unbroken candidate shows
    a worst case (35) and the other 14 have none, with the reason; the LoRA-r8 and FPFT presets break the θ0 sanity
    rule on all seven checkpoints; over the rows whose preset is valid, worst case − preset is ≤ 0 on average in
    every family (LoRA-retain −0.038, LoRA-probe −0.042, format probe 0); MC − baseline −0.55 [−0.88, −0.22] under the
    worst case over its two pairs, −0.63 under the preset; MC − control −0.84 [−2.03, +0.34]. The README states them."""
    cards = _json(DEMO_VALID / "card.json")["checkpoints"]
    assert len(cards) == 7
    shown = empty = 0
    gains: dict[str, list[float]] = defaultdict(list)
    for card in cards.values():
        for family, row in card["searched"].items():
            candidates = row["candidates"]
            if any(not c["broken"] for c in candidates):
                assert row["searched"] is not None and row["searched"]["sanity"]["valid"], family
                shown += 1
            else:
                assert row["searched"] is None and row["why_none"].startswith("no valid attack"), family
                empty += 1
            preset = next(c for c in candidates if c["row"] == "preset")
            if family in ("lora_r8", "fpft"):
                assert preset["broken"] and preset["broken"][-1].startswith("the sanity rule"), family
            if not preset["broken"] and row["searched"] is not None:
                gains[family].append(row["gap"]["recovered_fraction"])
    assert (shown, empty) == (35, 14)
    means = {family: _r(statistics.mean(g), 3) for family, g in gains.items()}
    assert means == {"lora_r8_retain": -0.038, "lora_r8_ood": -0.042, "format_probe": 0.0}
    assert all(len(g) == 7 for g in gains.values())
    paired = _json(DEMO_VALID / "population.json")["paired"]
    mc, control = paired["MC − baseline"], paired["MC − OracleImitation"]["worst_case"]
    readings = [_r(mc["worst_case"]["mean"]), *map(_r, mc["worst_case"]["ci"]), _r(mc["preset_report"]["mean"])]
    assert readings == [-0.55, -0.88, -0.22, -0.63]
    assert [_r(control["mean"]), *map(_r, control["ci"])] == [-0.84, -2.03, 0.34]
    text = _text(DEMO_VALID / "README.md")
    assert _after(text, "the MC polishes recover less than their baselines under the worst case,", 3) == readings[:3]
    assert _after(text, "two pairs**: MC - control", 3) == [-0.84, -2.03, 0.34]
    assert _after(text, "preset averages", 1) == [means["lora_r8_retain"]]
    assert "the LoRA-r8 and FPFT presets are not valid attacks on the mini" in _text(DOCS)


def test_getting_started_the_demo_over_three_seeds():
    """Getting started's three-seed table is the record's (``results/demo-seeds/seeds.json``): every mean and interval
    to the digit shown, an interval of a bounded metric never past its range, and a clipped one marked."""
    record = _json(ROOT / "results" / "demo-seeds" / "seeds.json")
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert record["seeds"] == [0, 1, 2] and record["machine"] in page
    for label in ("GradDiff", "GradDiff+MC", "NPO", "NPO+MC"):
        row = next(line for line in page.splitlines() if line.startswith(f"| {label.replace('+', ' + ')} |"))
        cells = [c.strip() for c in row.strip("|").split("|")[1:]]
        for cell, name in zip(cells, ("Δ", "F.agg", "MU", "ROUGE-L"), strict=True):
            entry = record["rows"][label][name]
            numbers = [float(n) for n in re.findall(NUMBER, cell.replace("−", "-"))]
            digits = 2 if name == "Δ" else 3
            assert numbers == [round(v, digits) for v in (entry["mean"], *entry["ci"])], (label, name)
            assert cell.endswith("\\*") == entry["clipped"]
            if name != "Δ":
                assert 0 <= entry["ci"][0] <= entry["ci"][1] <= 1
    floor = record["floor"]
    assert f"is {floor['mean']:.3f} [{floor['ci'][0]:.3f}, {floor['ci'][1]:.3f}]" in page
