"""Panels: shipped files load and dry-run, stage keys share what they should, and smoke-size panels run end to end
(locally, after kill -9, on a local Ray instance with 2 workers and as submitit jobs) into a report."""

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SMOKE, tensorboard_scalars

from margincal.config.files import CONFIG_DIR
from margincal.core.artifacts import own as claim
from margincal.mini.models import STAGES
from margincal.pipeline.executors import dry_run, run_panel
from margincal.pipeline.panel import expand_cells, load_panel
from margincal.pipeline.plan import plan_panel
from margincal.reporting.panel import write_report
from margincal.store.stage_store import Store

MINI_SMOKE = [s for s in SMOKE if s.startswith("mini.")]
FAST = [
    "methods=[GradDiff, NPO]",
    "variants=[reference]",
    "attackers=[{preset: lora_r8, k: [4], set: {train.steps: 3, train.batch_size: 4}}, "
    "{preset: fpft, k: [4], set: {train.steps: 2, train.batch_size: 4}}]",
    "method_overrides={GradDiff: {train: {steps: 3}}, NPO: {train: {steps: 3}}}",
    "mc.train.steps=4",
    "eval.batch_size=16",
]


def smoke_panel(smoke_mini, tmp_path, *extra):
    """Overrides for a 2-method smoke panel on the session's smoke-size mini models (cache shared)."""
    store = tmp_path / "store"
    return [*MINI_SMOKE, *FAST, f"store={store}", f"out={tmp_path / 'out'}", *extra]


EXPECTED_CELLS = {
    "demo": 4,
    "mini-head2head": 15,
    "mini-ksweep": 15,
    "mini-ablations": 55,
    "mini-deploy": 30,
    "mini-multiseed": 15,
    "mini-mc": 3,
    "tofu-1b-f10": 14,
    "tofu-1b-f05": 14,
    "tofu-1b-f01": 14,
    "tofu-3b-f10": 14,
    "tofu-8b-f10": 13,
    "muse-news": 13,
    "muse-books": 13,
    "phi35": 14,
    "testbed": 45,
    "testbed-ablations": 165,
    "testbed-deploy": 90,
    "testbed-gpu": 15,
    "testbed-ksweep": 45,
    "testbed-pareto": 135,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_CELLS))
def test_shipped_panels_are_valid_and_dry_run(name, tmp_path, monkeypatch):
    import margincal.data.hub as hub

    cfg = load_panel(CONFIG_DIR / "panels" / f"{name}.yaml", [f"store={tmp_path}"])
    assert len(expand_cells(cfg)) == EXPECTED_CELLS[name]
    if cfg.scale == "paper":  # its plan reads |D_f| and the models' context from the hub (or data=DIR, local models)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
        with pytest.raises(FileNotFoundError, match="instead|not found"):  # one clear line, exit 2
            dry_run(cfg)
        return
    rows = dry_run(cfg)  # configuration only: no model is loaded
    assert len(rows) == EXPECTED_CELLS[name] == len({r["id"] for r in rows})
    assert all(not any(r["stages"].values()) for r in rows)  # an empty store has nothing cached


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("methods=[NoSuch]", "unknown method"),
        ("variants=[nosuch]", "unknown MC variant"),
        ("attackers=[{preset: nosuch}]", "unknown attacker"),
        ("executor=pbs", "executor must be one of local, ray, slurm"),
        ("slurm.tasks_per_job=2", r"slurm.tasks_per_job must be an integer in \[1, 1\]"),
        ('slurm.partition="gpu\\n#SBATCH --x"', "slurm.partition must be a value on one line"),
        ('slurm.additional={"time; rm": 1}', "slurm.additional.time; rm must name an sbatch option"),
        ("executor=slurm", "store must be on a file system the compute nodes share"),
        ("tiers=[forget07]", "no reference"),
        ("method_overrides={SimNPO: {}}", "not in the panel"),
        ("scale=huge", "scale must be one of mini, paper"),
    ],
)
def test_bad_panels_stop_early(override, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        load_panel(CONFIG_DIR / "panels" / "tofu-1b-f10.yaml", ["methods=[GradDiff]", f"store={tmp_path}", override])


def test_stage_keys_share_what_is_shared():
    cfg = load_panel("mini-ablations", ["methods=[GradDiff, NPO]", "seeds=[0, 1]"])
    plans = {(p.cell.method, p.cell.seed, p.cell.variant): p.graph.keys() for p in plan_panel(cfg)}
    a, b = plans[("GradDiff", 0, "reference")], plans[("GradDiff", 0, "two_sided")]
    assert a["baseline/unlearn"] == b["baseline/unlearn"] and a["baseline/evaluate"] == b["baseline/evaluate"]
    assert a["mc/polish"] != b["mc/polish"] and a["mc/evaluate"] != b["mc/evaluate"]
    assert a["baseline/unlearn"] != plans[("GradDiff", 1, "reference")]["baseline/unlearn"]  # the seed matters
    assert a["reference/evaluate"] == plans[("NPO", 1, "hp_low")]["reference/evaluate"]  # θ_ref evaluated once
    assert a["theta0/attack/lora_r8@20"] == plans[("NPO", 0, "reference")]["theta0/attack/lora_r8@20"]
    assert a["theta0/attack/lora_r8@20"] != plans[("NPO", 1, "reference")]["theta0/attack/lora_r8@20"]  # D_rel seed


def _stage_dirs(store: Path) -> dict[str, str]:
    """Finished stage directory → its stage.json text; every published directory must be complete."""
    out = {}
    for stage_dir in store.iterdir():
        if stage_dir.name.startswith(".") or stage_dir.name == "anchors":
            continue
        for d in stage_dir.iterdir():
            if not d.name.startswith("."):
                assert (d / Store.META).exists(), f"published without stage.json: {d}"
                out[str(d)] = (d / Store.META).read_text()
    return out


@pytest.fixture(scope="module")
def local_panel(smoke_mini, tmp_path_factory):
    """The 2-method smoke panel run by the local executor on one torch thread (as the other executors' workers run
    each cell, so their records can be compared to the bit), from plans built before the run: every resolver is
    made to fail while the cells run. Returns (its directory, the panel summary)."""
    import torch

    from margincal.config import settings
    from margincal.pipeline import executors, panel

    root = tmp_path_factory.mktemp("local")
    cfg = load_panel("mini-head2head", smoke_panel(smoke_mini, root))
    plans = plan_panel(cfg)

    def resolved_already(*args, **kwargs):
        raise AssertionError("a resolver was called after the plan was built")

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(executors, "plan_panel", lambda _: plans)  # the cells run from these plans alone
        for module, names in ((settings, settings.__dict__), (panel, panel.__dict__)):
            for name in [n for n in names if n.startswith("resolve_")]:
                patch.setattr(module, name, resolved_already)
        torch.set_num_threads(1)
        try:
            summary = run_panel(cfg)
        finally:
            torch.set_num_threads(threads)
    return root, summary


def test_local_panel_report_and_rerun(smoke_mini, local_panel):
    tmp_path, summary = local_panel
    cfg = load_panel("mini-head2head", smoke_panel(smoke_mini, tmp_path))
    assert summary["counts"] == {"done": 2, "failed": 0}
    stages = _stage_dirs(tmp_path / "store")
    # θ_ref, θ0, 2 baselines, 2 MC evaluated; 2 attackers on each of the 6 checkpoints; 2 unlearned, 2 polished
    counts = {name: sum(f"/{name}/" in p for p in stages) for name in ("evaluate", "attack", "unlearn", "polish")}
    assert counts == {"evaluate": 6, "attack": 12, "unlearn": 2, "polish": 2}
    record = json.loads((tmp_path / "out" / "cells" / "mini_mini_forget10_NPO_s0_reference.json").read_text())
    assert set(record["models"]) == {"reference", "theta0", "baseline", "mc"}
    assert set(record["models"]["mc"]["attacks"]) == {"lora_r8@4", "fpft@4"}
    assert record["models"]["baseline"]["summary"]["delta"] == pytest.approx(
        record["models"]["baseline"]["summary"]["m"] - record["m_ref"]
    )
    assert all(Path(p).exists() for p in record["sources"].values())
    assert (Path(record["sources"]["mc/polish"]) / "model" / "adapter_config.json").exists()  # the LoRA adapter
    # the cell's own stages' cost: 1 unlearn, 1 polish, 2 evaluations, 4 attacks, each recorded as it ran
    cost = record["cost"]
    assert set(cost["by_kind"]) == {"unlearn", "polish", "evaluate", "attack"} and cost["without_cost"] == 0
    assert cost["seconds"] == pytest.approx(sum(cost["by_kind"].values())) and cost["tokens"] > 0
    assert cost["stages"] == 8
    assert cost["unlearn_tokens_per_s"] > 0 and cost["peak_memory_gib"] > 0 and len(cost["devices"]) == 1

    report = write_report(tmp_path / "out", tmp_path / "report")
    text = report.read_text()
    assert "## T1 head-to-head" in text and "**MC wins (of 2)**" in text and "## T2 cross-axis" in text
    assert "## Cost per cell" in text and "| NPO | reference | 1 |" in text
    for name in (
        "cliff.png",
        "pareto.png",
        "bridge.png",
        "t2.csv",
        "mia.csv",
        "cost.csv",
        "cells/" + record["id"] + ".json",
    ):
        assert (tmp_path / "report" / name).exists(), name
    t1 = (tmp_path / "report" / "t1_mini_mini_forget10.csv").read_text().splitlines()
    assert t1[0].endswith("source") and all((tmp_path / "report" / row.split(",")[-1]).exists() for row in t1[1:])

    assert run_panel(cfg)["counts"]["done"] == 2  # a rerun reuses every stage: nothing is rewritten
    assert _stage_dirs(tmp_path / "store") == stages

    # the seed table, on copies of these records given two seeds of known utilities
    seeded = tmp_path / "seeded" / "cells"
    seeded.mkdir(parents=True)
    claim(seeded.parent, ["cells"])  # a results directory margincal writes (its marker lists cells/)
    for path in (tmp_path / "out" / "cells").glob("*.json"):
        rec = json.loads(path.read_text())
        for seed, (base, mc) in {0: (0.5, 0.4), 1: (0.6, 0.3)}.items():
            rec["cell"]["seed"], rec["id"] = seed, f"{rec['cell']['method']}_s{seed}"
            rec["models"]["baseline"]["summary"]["model_utility"] = base
            rec["models"]["mc"]["summary"]["model_utility"] = mc
            rec["models"]["baseline"]["summary"]["delta"] = 1.0 + 2 * seed
            (seeded / f"{rec['id']}.json").write_text(json.dumps(rec))
    assert "## Seeds: baseline → MC over 2 seeds" in write_report(tmp_path / "seeded").read_text()
    with open(tmp_path / "seeded" / "seeds.csv") as handle:
        rows = {(r["method"], r["metric"]): r for r in csv.DictReader(handle)}
    # changes −0.1 and −0.3: mean −0.2, s = √0.02, half-width t(0.975, 1) · s / √2 = tan(0.475 π) · 0.1
    for method in ("NPO", "mean over methods"):
        mu = rows[(method, "MU")]
        assert float(mu["change"]) == pytest.approx(-0.2, abs=1e-12)
        assert float(mu["ci_high"]) == pytest.approx(-0.2 + math.tan(0.475 * math.pi) * 0.1, abs=1e-9)
    assert float(rows[("NPO", "MU")]["baseline"]) == pytest.approx(0.55, abs=1e-12)
    # the bridge has one point per (method, checkpoint), the mean over its seeds (Δ 1 and 3 for the baselines)
    with open(tmp_path / "seeded" / "bridge.csv") as handle:
        bridge = {(r["method"], r["checkpoint"]): r for r in csv.DictReader(handle)}
    assert set(bridge) == {(m, role) for m in ("GradDiff", "NPO") for role in ("baseline", "mc")}
    assert all(r["seeds"] == "2" for r in bridge.values())
    assert float(bridge[("NPO", "baseline")]["delta"]) == pytest.approx(2.0, abs=1e-12)

    # T3 and the K-sweep, on copies of the seeded records given a second variant and a second budget of known values
    ablated = tmp_path / "ablated" / "cells"
    ablated.mkdir(parents=True)
    claim(ablated.parent, ["cells"])
    for path in seeded.glob("*.json"):
        rec = json.loads(path.read_text())
        seed = rec["cell"]["seed"]
        for role in rec["models"]:  # K = 1: baseline 0.5 + 0.1 seed, MC 0.2
            rec["models"][role]["attacks"]["lora_r8@1"] = {"rouge_l": {"baseline": 0.5 + 0.1 * seed}.get(role, 0.2)}
        for variant, shift in (("reference", 0.0), ("forget_only", -0.1 - 0.1 * seed)):
            rec["cell"]["variant"], rec["id"] = variant, f"{rec['cell']['method']}_s{seed}_{variant}"
            mu = {0: 0.4, 1: 0.3}[seed] + shift
            rec["models"]["mc"]["summary"]["model_utility"] = mu
            (ablated / f"{rec['id']}.json").write_text(json.dumps(rec))
    text = write_report(tmp_path / "ablated").read_text()
    assert "## T3 ablation matrix" in text and "## K-sweep: LoRA" in text
    with open(tmp_path / "ablated" / "t3.csv") as handle:
        t3 = {r["variant"]: r for r in csv.DictReader(handle)}
    # forget_only − reference MU: −0.1 (seed 0) and −0.2 (seed 1) for both methods: −0.15 ± tan(0.475 π) · 0.05
    assert float(t3["forget_only"]["mu_vs_main"]) == pytest.approx(-0.15, abs=1e-12)
    assert float(t3["forget_only"]["mu_vs_main_high"]) == pytest.approx(-0.15 + math.tan(0.475 * math.pi) * 0.05)
    assert float(t3["reference"]["mu_vs_main"]) == 0.0 and t3["forget_only"]["n"] == "4"
    # the fronts: one baseline row per (base, seed) and one row per MC cell, with the cell's values
    pareto = json.loads((tmp_path / "ablated" / "pareto.json").read_text())
    assert len(pareto) == 3 * len(list(seeded.glob("*.json"))) and "## Pareto fronts" in text
    row = next(r for r in pareto if (r["base"], r["configuration"], r["seed"]) == ("NPO", "forget_only", 1))
    assert (
        row["mu"] == pytest.approx(0.1)
        and row["steps_run"] == json.loads(next(seeded.glob("*.json")).read_text())["polish"]["steps"]
    )
    # and against the cell's own baseline: MC K4-LoRA minus the baseline's, as in the smoke records (both seeds alike)
    smoke = [json.loads(p.read_text())["models"] for p in (tmp_path / "out" / "cells").glob("*.json")]
    own = [m["mc"]["attacks"]["lora_r8@4"]["rouge_l"] - m["baseline"]["attacks"]["lora_r8@4"]["rouge_l"] for m in smoke]
    assert float(t3["forget_only"]["attack_vs_baseline"]) == pytest.approx(sum(own) / len(own), abs=1e-12)
    # K-sweep change at K = 1: 0.2 − 0.5 = −0.3 (seed 0), −0.4 (seed 1), so −0.35 over seeds
    row = next(line for line in text.splitlines() if line.startswith("| **MC − baseline, mean over methods**"))
    assert "-0.350 [" in row.split("|")[3]


def test_unknown_method_hyperparameter_stops_before_any_compute(tmp_path):
    with pytest.raises(ValueError, match="bogus"):
        load_panel("mini-head2head", ["methods=[NPO]", "method_overrides.NPO.hparams.bogus=1"])


def _seed_shared(local_panel, store: Path, method: str | None = None) -> None:
    """Copy θ_ref's and θ0's stages (evaluations, attacks: shared by every cell) from the local panel's store, and
    with ``method`` that method's cell's own stages too."""
    records = _records(local_panel[0] / "out", local_panel[0] / "store").values()
    own = [r for r in records if r["cell"]["method"] == method]
    sources = {p for r in records for role, p in r["sources"].items() if role[:1] in "rt"}
    sources |= {p for r in own for p in r["sources"].values()}
    for source in sources:
        shutil.copytree(source.replace("<store>", str(local_panel[0] / "store")), store / source[len("<store>/") :])


def test_failing_cell_is_recorded_and_the_panel_goes_on(smoke_mini, local_panel, tmp_path, monkeypatch):
    shutil.copytree(local_panel[0] / "store", tmp_path / "store")  # the GradDiff cell is stored: only NPO runs
    cfg = load_panel("mini-head2head", smoke_panel(smoke_mini, tmp_path, "method_overrides.NPO.train.lr=1e30"))
    summary = run_panel(cfg)
    assert summary["counts"] == {"done": 1, "failed": 1}
    failed = json.loads((tmp_path / "out" / "cells" / "mini_mini_forget10_NPO_s0_reference.json").read_text())
    assert failed["status"] == "failed" and "NonFiniteLossError" in failed["error"]
    assert "Traceback" in failed["traceback"]
    # a first report whose files fail to move in half-way (a full disk) leaves the directory margincal's: the rerun
    # replaces them
    import margincal.reporting.panel as report_module

    real, moved, out = os.replace, [], (tmp_path / "out").resolve()

    def failing(src, dst):  # the second file moved into the results directory fails
        if Path(dst).resolve().parent == out:
            if moved:
                raise OSError(28, "No space left on device")
            moved.append(dst)
        real(src, dst)

    monkeypatch.setattr(report_module.os, "replace", failing)
    with pytest.raises(OSError):
        write_report(tmp_path / "out")
    monkeypatch.setattr(report_module.os, "replace", real)
    assert "## Failed cells" in write_report(tmp_path / "out").read_text()


def test_a_dead_worker_leaves_a_failed_record_unless_its_cell_had_finished(tmp_path):
    """A Ray task or SLURM job lost (killed, out of memory): its cell gets a failed record naming the worker's error;
    a cell whose record was written during this run (it finished before the worker died) keeps it."""
    from types import SimpleNamespace

    from margincal.pipeline.executors import worker_died

    (tmp_path / "cells").mkdir()
    cfg = SimpleNamespace(out_dir=tmp_path)
    lost = SimpleNamespace(cfg=cfg, cell=SimpleNamespace(id="lost", method="NPO"))
    finished = SimpleNamespace(cfg=cfg, cell=SimpleNamespace(id="finished", method="NPO"))
    (tmp_path / "cells" / "lost.json").write_text('{"status": "done"}')  # a record of an earlier run
    since = time.time() + 1
    (tmp_path / "cells" / "finished.json").write_text('{"status": "done"}')
    os.utime(tmp_path / "cells" / "finished.json", (since + 1, since + 1))  # written during this run
    err = RuntimeError("Job 42 (task: 0) with path x\nhas not produced any output (state: OUT_OF_MEMORY)")
    assert worker_died(finished, err, since) == {"id": "finished", "status": "done"}
    result = worker_died(lost, err, since)
    assert result["status"] == "failed" and result["error"].startswith("the worker died: RuntimeError: Job 42")
    record = json.loads((tmp_path / "cells" / "lost.json").read_text())
    assert record["status"] == "failed" and record["cell"] == {"id": "lost", "method": "NPO"}
    assert "OUT_OF_MEMORY" in record["traceback"]


def test_kill_9_then_resume(smoke_mini, local_panel, tmp_path):
    _seed_shared(local_panel, tmp_path / "store", "GradDiff")  # NPO's cell runs, is killed and resumes
    args = [sys.executable, "-m", "margincal.cli", "panel", "mini-head2head", *smoke_panel(smoke_mini, tmp_path)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    unlearned = (tmp_path / "store").glob  # GradDiff's unlearned model is stored already: wait for NPO's
    while proc.poll() is None and len(list(unlearned("unlearn/[!.]*/stage.json"))) < 2:  # no deadline: a loaded
        time.sleep(0.02)  # machine is slower, not wrong; a run that ends first fails the assertions below
    os.killpg(proc.pid, signal.SIGKILL)  # mid-run: some stages finished, one possibly half-written
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = _stage_dirs(tmp_path / "store")  # also asserts that nothing half-written was published
    assert sum("/unlearn/" in p for p in before) == 2
    assert not (tmp_path / "out" / "panel.json").exists()

    cfg = load_panel("mini-head2head", smoke_panel(smoke_mini, tmp_path))
    assert run_panel(cfg)["counts"] == {"done": 2, "failed": 0}
    after = _stage_dirs(tmp_path / "store")
    assert all(after[p] == text for p, text in before.items())  # finished stages were not run again
    assert len(after) == 22 + len(STAGES) - 1  # the pipeline stages and the shipped mini models (no base model)
    assert not list((tmp_path / "store").glob("*/.*.tmp-*"))  # leftovers of the killed writer are gone


def _records(out: Path, store: Path) -> dict[str, dict]:
    """The panel's cell records with what may differ between runs left out: costs, timings, the store's location."""
    records = {}
    for path in sorted((out / "cells").glob("*.json")):
        record = json.loads(path.read_text().replace(str(store), "<store>"))
        record.pop("cost")
        record["unlearn"].pop("seconds")
        record["polish"].pop("seconds")
        records[path.name] = record
    return records


def test_local_ray_and_slurm_executors_write_identical_records(smoke_mini, local_panel, tmp_path):
    """The same panel through the three executors, each cell on one thread: identical records (every metric, to
    the bit). Ray computes NPO's cell and the SLURM job GradDiff's (the stages both cells share, and the other cell's,
    stored from the local run), the two runs at once. Ray runs the two cells at once; submitit's local backend packs
    both cells into one job of two tasks, which is preempted once GradDiff's first stage is stored and requeued: the
    cells resume from the store, so no finished stage runs again."""
    pytest.importorskip("ray")
    pytest.importorskip("submitit")
    import threading

    local = _records(local_panel[0] / "out", local_panel[0] / "store")
    assert len(local) == 2

    # θ_ref's and θ0's stages (shared by the cells) and one cell's own come from the local run: Ray's workers compute
    # NPO's cell (unlearn, polish, the evaluations and attacks of its baseline and MC polish), the SLURM job GradDiff's.
    # The two runs compute different cells, so they run at once (a thread each, one torch thread per worker).
    _seed_shared(local_panel, tmp_path / "ray" / "store", "GradDiff")
    ray = ["executor=ray", "ray.num_cpus=2", "ray.cell_cpus=1", "report_to=tensorboard"]  # curves from the workers
    ray = load_panel("mini-head2head", smoke_panel(smoke_mini, tmp_path / "ray", *ray))
    root = tmp_path / "slurm"
    slurm = [
        "executor=slurm",
        "slurm.backend=local",
        "slurm.cells_per_job=2",  # one job, whose two tasks (processes) run a cell each
        "slurm.tasks_per_job=2",
        "slurm.cpus_per_cell=1",
        "slurm.gpus_per_job=0",
    ]
    cfg = load_panel("mini-head2head", smoke_panel(smoke_mini, root, *slurm))
    _seed_shared(local_panel, root / "store", "NPO")
    first = plan_panel(cfg)[0].cell.id  # task 0's cell: the task that requeues the job
    marker = root / "out" / "cells" / f".{first}.running"
    summaries: dict = {}
    drivers = [
        threading.Thread(target=lambda: summaries.update(ray=run_panel(ray)), daemon=True),  # Ctrl-C ends the test
        threading.Thread(target=lambda: summaries.update(slurm=run_panel(cfg)), daemon=True),
    ]
    for driver in drivers:
        driver.start()
    unlearned = (root / "store").glob  # NPO's unlearned model is stored already: wait for GradDiff's
    while drivers[1].is_alive():  # no deadline: a loaded machine is slower, not wrong
        if marker.exists() and len(list(unlearned("unlearn/[!.]*/stage.json"))) == 2:
            break
        time.sleep(0.05)
    before = _stage_dirs(root / "store")
    os.kill(int(marker.read_text().split(" pid ")[1].split()[0]), signal.SIGUSR2)  # SLURM's preemption signal
    for driver in drivers:
        driver.join()
    assert summaries["ray"]["counts"] == {"done": 2, "failed": 0}
    assert _records(tmp_path / "ray" / "out", tmp_path / "ray" / "store") == local
    logged = [d.parent for d in (tmp_path / "ray" / "store").glob("*/[!.]*/tensorboard")]
    assert {d.parent.name for d in logged} == {"unlearn", "polish", "attack"}  # the stages the workers trained in
    curves = {d: tensorboard_scalars(d / "tensorboard") for d in logged}
    (unlearned,) = [d for d in curves if d.parent.name == "unlearn"]
    history = json.loads((unlearned / "history.json").read_text())
    assert curves[unlearned]["unlearn NPO/loss"] == [(r["step"] + 1, pytest.approx(r["loss"])) for r in history]
    summary = summaries["slurm"]
    assert summary["counts"] == {"done": 2, "failed": 0}
    after = _stage_dirs(root / "store")
    assert all(after[p] == text for p, text in before.items())  # finished stages were not run again
    assert _records(root / "out", root / "store") == local
    for cell in local:  # the job's first run (task 0 preempted; task 1 had finished), then the requeued one
        log = (root / "out" / "slurm" / "cells" / cell.replace(".json", ".log")).read_text()
        assert log.count(": job ") == 2 and ": done at " in log.rstrip().splitlines()[-1]
        if cell == f"{first}.json":
            assert "this job is preempted" in log and "Requeued job" in log
    assert write_report(root / "out").exists()


def test_slurm_jobs_carry_the_panel_settings(smoke_mini, tmp_path, monkeypatch):
    """On a cluster (here: sbatch, srun and sacct stand-ins on PATH; sbatch says job 42 was submitted) the cells
    become one job array capped at array_parallelism, whose script carries the slurm settings; without the SLURM
    commands the executor stops with one line before planning."""
    import dataclasses

    pytest.importorskip("submitit")
    from margincal.pipeline.executors import CellJob, _slurm_executor

    overrides = [
        "executor=slurm",
        "slurm.partition=gpu",
        "slurm.account=lab",
        "slurm.time_min=30",
        "slurm.cpus_per_cell=3",
        "slurm.mem_gb=20",
        "slurm.array_parallelism=1",
        "slurm.setup=['module load cuda']",
        "slurm.additional={gres: 'gpu:a100:1'}",
        "slurm.backend=local",  # load_panel refuses a store under /tmp for the slurm backend; set it below
    ]
    cfg = load_panel("mini-head2head", smoke_panel(smoke_mini, tmp_path, *overrides))
    cfg = dataclasses.replace(cfg, slurm=dataclasses.replace(cfg.slurm, backend="slurm"))
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    with pytest.raises(ValueError, match=r"sbatch, srun, sacct is not on this machine's PATH: run the panel on"):
        _slurm_executor(cfg)

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"sbatch": 'echo "Submitted batch job 42"', "srun": "", "sacct": ""}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    jobs = _slurm_executor(cfg).map_array(CellJob(3, tmp_path / "logs"), [[p] for p in plan_panel(cfg)])
    assert [j.job_id for j in jobs] == ["42_0", "42_1"]
    script = (tmp_path / "out" / "slurm" / "jobs" / "42_submission.sh").read_text()  # submitit keeps it there
    for line in (
        "#SBATCH --array=0-1%1",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=lab",
        "#SBATCH --time=30",
        "#SBATCH --cpus-per-task=3",
        "#SBATCH --mem=20GB",
        "#SBATCH --gres=gpu:a100:1",
        "#SBATCH --job-name=margincal-mini-head2head",
        f"#SBATCH --output={tmp_path / 'out' / 'slurm' / 'jobs'}/%A_%a_0_log.out",
        "module load cuda",
    ):
        assert line in script.splitlines(), line


def test_set_blocks_reach_the_resolvers_as_data():
    """A variant's and an attacker's ``set:`` are data, not re-parsed text: ``stop_delta: null`` is None (it used to
    read as the string 'None'), and a bad value is named at its ``set`` key."""
    cfg = load_panel("demo", ["variants=[{name: x, preset: reference, set: {stop_delta: null, kappa: 2.5}}]"])
    from margincal.pipeline.panel import mc_config, variants

    mc = mc_config(cfg, variants(cfg)[0], seed=0)
    assert (mc.stop_delta, mc.kappa) == (None, 2.5)
    with pytest.raises(ValueError, match=r"variants\[0\]\.set\.kappa must be a positive number, got -1"):
        load_panel("demo", ["variants=[{name: x, preset: reference, set: {kappa: -1}}]"])
    with pytest.raises(ValueError, match=r"attackers\[0\]\.set\.train\.steps must be an integer in \[1"):
        load_panel("demo", ["attackers=[{preset: lora_r8, k: [4], set: {train.steps: 0}}]"])


def test_an_sbatch_refusal_is_one_line_and_leaves_nothing(smoke_mini, tmp_path, monkeypatch):
    """sbatch refusing the job array (here: a stand-in that rejects the partition) stops the panel with one line
    naming sbatch's reason, an error the CLI prints with exit 2, and the panel's new output directory is gone."""
    import dataclasses

    pytest.importorskip("submitit")
    from margincal.core.errors import RefusedError

    cfg = load_panel("mini-head2head", smoke_panel(smoke_mini, tmp_path, "executor=slurm", "slurm.backend=local"))
    cfg = dataclasses.replace(cfg, slurm=dataclasses.replace(cfg.slurm, backend="slurm", partition="gpu"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {
        "sbatch": 'echo "sbatch: error: invalid partition specified: gpu" >&2; exit 1',
        "srun": "",
        "sacct": "",
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert not cfg.out_dir.exists()
    with pytest.raises(
        RefusedError, match=r"^sbatch refused the panel's jobs: sbatch: error: invalid partition"
    ) as err:
        run_panel(cfg)
    assert "\n" not in str(err.value) and isinstance(err.value, ValueError)  # the CLI's one line, exit 2
    assert not cfg.out_dir.exists()


def test_a_ray_start_up_that_fails_is_one_line(smoke_mini, tmp_path, monkeypatch):
    """Ray failing to start (no cluster at ray.address) stops the panel with Ray's reason in one line, before any cell
    runs, and the panel's new output directory is gone."""
    import dataclasses

    ray = pytest.importorskip("ray")
    from margincal.core.errors import RefusedError

    def no_cluster(**kwargs):
        raise ConnectionError(f"Could not find any running Ray instance.\nPlease start one ({kwargs['address']}).")

    monkeypatch.setattr(ray, "init", no_cluster)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    cfg = load_panel("mini-head2head", smoke_panel(smoke_mini, tmp_path, "executor=ray"))
    cfg = dataclasses.replace(cfg, ray=dataclasses.replace(cfg.ray, address="10.0.0.9:6379"))
    with pytest.raises(RefusedError, match=r"^Ray did not start the cluster at ray.address=10.0.0.9:6379: Could not "):
        run_panel(cfg)
    assert not cfg.out_dir.exists()


def test_hf_kind_cell_through_local_directories(smoke_mini, tmp_path):
    """The real-scale path: a model family of saved checkpoints (as hub ids would be) and TOFU-format files."""
    family = tmp_path / "family.yaml"
    family.write_text(
        f"name: smoke-hf\nkind: hf\ntarget: {smoke_mini.paths.theta0}\n"
        f"references: {{forget10: {smoke_mini.paths.ref}}}\ndtype: float32\n"
    )
    overrides = smoke_panel(
        smoke_mini,
        tmp_path,
        f"models=[{family}]",
        f"data={smoke_mini.data}",
        "methods=[NPO]",
        "method_overrides={NPO: {train: {steps: 3}}}",
    )
    cfg = load_panel("mini-head2head", overrides)
    assert run_panel(cfg)["counts"] == {"done": 1, "failed": 0}
    record = json.loads((tmp_path / "out" / "cells" / "mini_family_forget10_NPO_s0_reference.json").read_text())
    assert record["models"]["mc"]["summary"]["model_utility"] > 0
    assert all(str(smoke_mini.paths.theta0) not in p for p in record["sources"].values())  # artifacts in the store


def test_dry_run_says_whether_the_mini_models_are_stored(smoke_mini, tmp_path):
    other = load_panel("demo", [*MINI_SMOKE, "mini.finetune.steps=31", *FAST, f"store={tmp_path / 'empty'}"])
    assert all("will be built" in row["models"] for row in dry_run(other))
    empty = load_panel("demo", [*MINI_SMOKE, *FAST, f"store={tmp_path / 'empty'}"])
    assert all(row["models"].startswith("mini models shipped with margincal") for row in dry_run(empty))
    stored = load_panel("demo", [*MINI_SMOKE, *FAST, f"store={smoke_mini.cfg.store_dir}"])
    assert all(row["models"].startswith("mini models stored") for row in dry_run(stored))
    assert not (tmp_path / "empty").exists()  # a dry run writes nothing


def test_local_checkpoints_are_keyed_by_their_weights(smoke_mini, tmp_path):
    """Retraining into the same directory gives new stage keys (and anchor identities); unchanged weights do not."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from margincal.pipeline.panel import expand_cells
    from margincal.pipeline.plan import plan_cell

    theta0 = tmp_path / "theta0"
    shutil.copytree(smoke_mini.paths.theta0, theta0)
    family = tmp_path / "family.yaml"
    family.write_text(f"name: f\nkind: hf\ntarget: {theta0}\nreferences: {{forget10: {smoke_mini.paths.ref}}}\n")
    overrides = [*MINI_SMOKE, *FAST, f"models=[{family}]", f"data={smoke_mini.data}", f"store={tmp_path / 'store'}"]

    def keys() -> dict:
        cfg = load_panel("demo", overrides)
        return plan_cell(cfg, expand_cells(cfg)[0]).graph.keys()

    first = keys()
    assert keys() == first and len(list((tmp_path / "store" / "digests").iterdir())) == 2  # hashed once each
    weights = load_file(theta0 / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + torch.ones_like(weights[name])
    save_file(weights, theta0 / "model.safetensors", metadata={"format": "pt"})  # "retrained" in place
    second = keys()
    assert second["reference/evaluate"] == first["reference/evaluate"]  # θ_ref untouched
    assert (
        second["theta0/evaluate"] != first["theta0/evaluate"]
        and second["baseline/unlearn"] != first["baseline/unlearn"]
    )
