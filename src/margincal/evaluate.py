"""``margincal evaluate``: every metric the paper's tables report, for one checkpoint on one benchmark.

The benchmark (``configs/benchmarks/<name>.yaml``) names the data source and maps roles (forget, holdout,
retain, ...) to split names; ``--data`` replaces the source by a local directory or another hub id. The result
is one JSON per (checkpoint, benchmark) with a manifest. Evaluate θ_ref first and pass its JSON as
``reference`` to every other model: its forget truth ratios, min-k AUC and m(D_f) are reused (forget_quality,
privleak, Δ) instead of being recomputed.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

from margincal.config import CONFIG_DIR, read_yaml
from margincal.data.records import QARecord

MINI_GENERATED = "generated in-process (MiniConfig defaults)"


def benchmark_spec(name: str) -> dict:
    """``configs/benchmarks/<name>.yaml``, or a benchmark YAML file of one's own (same fields); an unknown name stops
    with the list of shipped benchmarks."""
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else CONFIG_DIR / "benchmarks" / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in (CONFIG_DIR / "benchmarks").glob("*.yaml"))
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(known)}")
    return read_yaml(path)


def tier_fields(tier: str) -> dict[str, str]:
    """Placeholders of split names: ``{tier}``, and for ``forgetNN`` tiers ``{pct}``/``{retain_pct}`` (10, 90)."""
    fields = {"tier": tier}
    if tier.startswith("forget") and tier[6:].isdigit():
        pct = int(tier[6:])
        fields.update(pct=f"{pct:02d}", retain_pct=f"{100 - pct:02d}")
    return fields


def fill_split(name: str, spec: dict, tier: str) -> str:
    try:
        return name.format(**tier_fields(tier))
    except KeyError as err:
        raise ValueError(
            f"tier {tier!r} does not fit the {spec['name']} split {name!r}; use forget01, forget05 or forget10"
        ) from err


def split_names(spec: dict, tier: str) -> dict[str, str]:
    """Role → split name of the benchmark's evaluation splits with the tier placeholders filled in."""
    return {role: fill_split(name, spec, tier) for role, name in spec["splits"].items()}


def load_benchmark_splits(spec: dict, tier: str, data: str | None, bench=None) -> tuple[dict[str, list[QARecord]], str]:
    """The benchmark's evaluation splits from ``data`` (or its default source); without a source, the splits of the
    mini benchmark ``bench`` (a ``MiniBenchmark``; generated with default settings when None)."""
    from margincal.data.tofu import load_split

    names = split_names(spec, tier)
    source = data or spec.get("source")
    if source is None:
        from margincal.data.mini import generate

        source = MINI_GENERATED if bench is None else f"mini benchmark generated in-process (seed {bench.config.seed})"
        bench = bench or generate()
        splits = {role: bench.split(name) for role, name in names.items()}
    else:
        splits = {role: load_split(source, name) for role, name in names.items()}
    limit = spec.get("retain_n")
    if limit and "retain" in splits and len(splits["retain"]) > limit:
        keep = sorted(random.Random(0).sample(range(len(splits["retain"])), limit))
        splits["retain"] = [splits["retain"][i] for i in keep]
    return splits, str(source)


def evaluate_model(
    net, tok, spec: dict, splits: dict, reference: dict | None, batch_size: int = 32, gradnorm: bool = True
) -> dict:
    """Every metric of the benchmark's kind (``tofu`` or ``muse``) for a loaded model on loaded splits."""
    common = dict(max_length=spec["max_length"], batch_size=batch_size, max_new_tokens=spec["max_new_tokens"])
    if spec["kind"] == "muse":
        from margincal.evaluation.muse import evaluate_muse

        return evaluate_muse(
            net, tok, splits, **common, stop=tuple(spec.get("stop", ())), reference=reference,
            aggregate=spec["aggregate"],
        )  # fmt: skip
    from margincal.evaluation.tofu import evaluate_tofu

    return evaluate_tofu(
        net, tok, splits, **common, reference=reference, gradnorm=gradnorm, aggregate=spec["aggregate"]
    )


def evaluate_checkpoint(
    model: str,
    benchmark: str = "tofu",
    data: str | None = None,
    tier: str = "forget10",
    reference: str | Path | None = None,
    out: str | Path | None = None,
    gradnorm: bool = True,
    mmlu: str | None = None,
    batch_size: int = 32,
    dtype: str = "float32",
    device: str = "cpu",
    template: str | None = None,
) -> dict:
    """Evaluate ``model`` (HF id or directory); write the JSON to ``out`` when given and return it.

    ``mmlu``: ``"mmlu"`` runs lm-eval's MMLU (hub access), ``"local"`` the shipped offline multiple-choice set.
    """
    import json

    from margincal.models import load_model, load_tokenizer
    from margincal.pipeline.store import atomic_write_json, manifest

    spec = benchmark_spec(benchmark)
    ref = json.loads(Path(reference).read_text()) if reference else None
    if ref is not None and ref.get("benchmark") != spec["name"]:
        raise ValueError(f"reference {reference} is a {ref.get('benchmark')!r} result, not {spec['name']!r}")
    splits, source = load_benchmark_splits(spec, tier, data)
    tok = load_tokenizer(model, template)
    net = load_model(model, dtype, device)
    start = time.perf_counter()
    result = evaluate_model(net, tok, spec, splits, ref, batch_size, gradnorm)
    if mmlu:
        from margincal.evaluation.mmlu import mmlu_accuracy

        result["summary"]["mmlu_acc"], result["mmlu"] = mmlu_accuracy(net, tok, mmlu)
    config = {"model": model, "benchmark": spec["name"], "data": source, "tier": tier, "reference": str(reference),
              "template": dataclasses.asdict(tok.margincal_template)}  # fmt: skip
    record = {
        "benchmark": spec["name"],
        "model": model,
        "tier": tier,
        "seconds": time.perf_counter() - start,
        **result,
        "manifest": manifest({**config, "gradnorm": gradnorm, "mmlu": mmlu, "dtype": dtype}, seed=0),
    }
    if out is not None:
        atomic_write_json(out, record)
    return record
