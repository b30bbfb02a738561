"""Property-based fuzzing of every user input (benchmarks/fuzz_inputs.py, a bounded number of examples here): panel
files, ``key=value`` overrides, TOFU-format data files and cell records each exit 0 or 2, with one error line, no
traceback, nothing written and no input changed; names with path segments, deep and aliased YAML and JSON,
non-finite numbers in a reference, counts past their maxima and paths of every kind (a directory, FIFO, device,
link loop, an empty file, one past its cap) are refused, for the reason they break."""

from __future__ import annotations

import pytest
from conftest import load_benchmark

EXAMPLES = {
    "panel files": 40,
    "overrides": 40,
    "data files": 40,
    "cell records": 6,
    "names": 20,
    "nesting": 16,
    "non-finite": 10,
    "counts": 6,
    "paths": 30,
}


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    module = load_benchmark("fuzz_inputs")
    box = module.sandbox(tmp_path_factory.mktemp("fuzz"), sorted(module.RECORDS.glob("*.json"))[:4])
    return module, module.targets(box)


@pytest.mark.parametrize("target", list(EXAMPLES))
def test_fuzzed_inputs_exit_cleanly(fuzz, target):
    module, targets = fuzz
    tally = module.Tally()
    targets[target](EXAMPLES[target], None, tally)  # derandomized: the same examples on every run
    assert tally.generated >= EXAMPLES[target] // 2 and not tally.failures
    assert tally.refused > 0 if target != "cell records" else tally.accepted == tally.generated
