"""Shared fixtures: a tiny tokenizer/model built in-process (no mini benchmark needed) for unit tests."""

import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from margincal.data.records import QARecord, encode_qa
from margincal.mini import shipped
from margincal.mini.models import MiniArch, new_mini_model, train_mini_tokenizer
from margincal.pipeline.executors import usable_cpus

ROOT = Path(__file__).resolve().parents[1]  # the checkout: tests/ sits at its top, its tests in folders below
RECORDS = [
    QARecord("Where was Ann Bel born?", "Ann Bel was born in Port Ivo."),
    QARecord("What does Ann Bel write?", "Ann Bel writes sea novels."),
    QARecord("Where was Cid Dor born?", "Cid Dor was born in Vale Ume."),
    QARecord("What does Cid Dor write?", "Cid Dor writes war poems."),
]
TINY = MiniArch(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """pytest-xdist by default, one worker per core (at most 4), each test file on one worker (its module fixtures
    built once); ``-n N`` sets the workers, ``-n 0`` or ``-p no:xdist`` runs in this process."""
    worker = hasattr(config, "workerinput")  # a worker runs this hook too: it must not start workers of its own
    if config.pluginmanager.hasplugin("xdist") and config.option.numprocesses is None and not worker:
        config.option.numprocesses, config.option.maxprocesses, config.option.dist = "auto", 4, "loadfile"


class LongTests:
    """Where a test runs long, say so as it runs: every ``every`` seconds, one line per test running for longer than
    that (on the xdist controller, which hears each test start and end from the workers; without xdist the line
    would go into the running test's captured output), so a long test shows progress and a stuck one is named."""

    def __init__(self, reporter, every: float) -> None:
        self.reporter, self.every, self.running = reporter, every, {}
        self.lock, self.stop = threading.Lock(), threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def pytest_runtest_logstart(self, nodeid, location):
        with self.lock:
            self.running[nodeid] = time.monotonic()

    def pytest_runtest_logreport(self, report):
        if report.when == "teardown":
            with self.lock:
                self.running.pop(report.nodeid, None)

    def pytest_sessionfinish(self):
        self.stop.set()

    def _watch(self) -> None:
        while not self.stop.wait(self.every):
            now = time.monotonic()
            with self.lock:
                long = sorted((now - start, nodeid) for nodeid, start in self.running.items())
            for seconds, nodeid in long:
                if seconds >= self.every:
                    self.reporter.write_line(f"  still running after {seconds:.0f} s: {nodeid}")


class FileDurations:
    """Each test file's seconds (setup, call and teardown of its tests, on whichever worker ran them), recorded by
    every run in pytest's cache (``margincal/durations``: file → seconds, this run's files replacing the last
    run's) and the slowest named at the end. A record, never a verdict: no test reads it."""

    def __init__(self, config, reporter) -> None:
        self.config, self.reporter, self.seconds = config, reporter, {}

    def pytest_runtest_logreport(self, report):
        path = report.location[0] if report.location else report.nodeid.split("::")[0]
        self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter):
        if not self.seconds:
            return
        recorded = {**(self.config.cache.get("margincal/durations", {}) or {}), **self.seconds}
        self.config.cache.set("margincal/durations", {k: round(v, 1) for k, v in sorted(recorded.items())})
        slowest = sorted(self.seconds.items(), key=lambda item: -item[1])[:5]
        terminalreporter.write_line(
            "slowest files: " + ", ".join(f"{Path(f).name} {s:.0f} s" for f, s in slowest) + " (.pytest_cache)"
        )


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered
def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a test of a file that runs for minutes on 2 cores (-m 'not slow')")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not hasattr(config, "workerinput"):  # a worker's output is not shown
        every = float(os.environ.get("MARGINCAL_TEST_PROGRESS_S", "60"))
        config.pluginmanager.register(LongTests(reporter, every), "margincal-long-tests")
        if config.cache is not None:
            config.pluginmanager.register(FileDurations(config, reporter), "margincal-file-durations")


# the test files that take longest on 2 cores (--durations=0, Intel Xeon, at b08ba84), run first: xdist hands each
# file to the next free worker, and a long file handed out last would leave one worker running it alone at the end
LONGEST_FIRST = (
    "test_panel.py",
    "test_audit.py",
    "test_benchmarks.py",
    "test_gpu_acceptance.py",
    "test_gpu_testbed.py",
    "test_install.py",
)


def pytest_collection_modifyitems(items):
    """Order the files as :data:`LONGEST_FIRST` says, the rest after them in their usual order (tests inside a file
    keep theirs), and mark those files' tests ``slow``."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    for item in items:
        if item.path.name in rank:
            item.add_marker(pytest.mark.slow)


if os.environ.get("PYTEST_XDIST_WORKER"):  # one of pytest-xdist's workers (pyproject's addopts): its share of the cores
    THREADS = max(1, usable_cpus() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ["OMP_NUM_THREADS"] = str(THREADS)  # the processes its tests start take the same share
    torch.set_num_threads(THREADS)


@pytest.fixture(autouse=True, scope="session")
def _store_outside_the_tree(tmp_path_factory):
    """A command that stores its stages in the default store (``margincal evaluate`` without ``--store``) writes
    into a temporary directory, never into the working tree's ``runs/store``."""
    if "MARGINCAL_STORE" in os.environ:
        yield
        return
    os.environ["MARGINCAL_STORE"] = str(tmp_path_factory.mktemp("default-store"))
    yield
    del os.environ["MARGINCAL_STORE"]


@pytest.fixture(autouse=True)
def _torch_threads_kept():
    """Every test leaves torch's thread count as it found it (a local panel run sets its cell's share in-process):
    a model a later test builds on the same worker would otherwise reduce in another order and differ in its bytes."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    texts = [t for r in RECORDS for t in (r.question, r.answer)]
    return train_mini_tokenizer(texts * 5, TINY.vocab_size)


@pytest.fixture
def tiny_model(tiny_tokenizer):
    return new_mini_model(TINY, tiny_tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_examples(tiny_tokenizer):
    return encode_qa(tiny_tokenizer, RECORDS, max_length=64)


MINI_SMOKE = [f"mini.{o}" for o in shipped.SMOKE]  # the smoke size, whose mini models ship with margincal
SMOKE = [  # overrides of the demo panel at smoke size
    *MINI_SMOKE,
    "attackers=[{preset: lora_r8, k: [4], set: {train.steps: 3, train.batch_size: 4}}]",
    "method_overrides={GradDiff: {train: {steps: 3}}, NPO: {train: {steps: 3}}}",
    "mc.train.steps=4",
    "eval.batch_size=16",
]


@dataclass
class SmokeMini:
    """The smoke-size mini benchmark: its demo panel config, built models (stages of the store ``root/store``) and
    TOFU-format files."""

    root: Path
    cfg: object
    paths: object
    data: Path


@pytest.fixture(scope="session")
def smoke_mini(tmp_path_factory):
    from margincal.mini.data import generate
    from margincal.mini.models import build_mini_models
    from margincal.pipeline.panel import load_panel
    from margincal.store.stage_store import Store

    root = tmp_path_factory.mktemp("smoke")
    cfg = load_panel("demo", SMOKE + [f"store={root / 'store'}"])
    bench = generate(cfg.mini.data)
    paths = build_mini_models(cfg.mini, "forget10", Store(cfg.store_dir), bench)
    bench.to_json_dir(root / "data")
    return SmokeMini(root, cfg, paths, root / "data")


def make_workspace(model, tokenizer, benchmark: str = "tofu", max_length: int = 64, **changes):
    """A workspace over ``RECORDS`` (forget = eval forget = all four; retain and probe the same examples) with
    ``model`` as both θ0 and θ_ref; ``changes`` replace BenchmarkSpec fields."""
    import dataclasses

    from margincal.config.settings import resolve_benchmark
    from margincal.pipeline.stages import Workspace

    spec = dataclasses.replace(resolve_benchmark(benchmark), max_length=max_length, max_new_tokens=4, **changes)
    examples = encode_qa(tokenizer, RECORDS, max_length)
    train = {"forget": examples, "retain": examples, "probe": examples}
    ws = Workspace(tokenizer, spec, {"forget": list(RECORDS)}, train, {"theta0": "tiny", "ref": "tiny"})
    ws._frozen.update(theta0=model, ref=model)
    return ws


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (benchmark scripts are not part of the package; ``gpu/prepare`` for one
    in a subfolder)."""
    import importlib.util

    path = ROOT / "benchmarks" / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # as when a script runs: its siblings (shapes.py) import by name
    spec = importlib.util.spec_from_file_location(name.replace("/", "_"), path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses of the script look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def memorising_mini(tmp_path_factory):
    """A smoke-size mini wide enough for θ0 to memorise its forget set (hidden 64, 300 fine-tuning steps: forget
    ROUGE-L 1.0 against θ_ref's 0.3), so the audit's floor and ceiling are apart; about 40 s to build on 2 cores,
    once per session (the audit and the mini models' own property tests share it)."""
    from margincal.mini.data import generate
    from margincal.mini.models import build_mini_models
    from margincal.pipeline.panel import load_panel
    from margincal.store.stage_store import Store

    root = tmp_path_factory.mktemp("memorising-mini")
    wider = [f"mini.{o}" for o in shipped.MEMORISING]
    cfg = load_panel("demo", [*SMOKE, *wider, f"store={root / 'store'}"])
    bench = generate(cfg.mini.data)
    paths = build_mini_models(cfg.mini, "forget10", Store(cfg.store_dir), bench)
    bench.to_json_dir(root / "data")
    return SmokeMini(root, cfg, paths, root / "data")


def tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the TensorBoard event files under ``directory``: tag → [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
