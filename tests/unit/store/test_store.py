"""The stage store: content keys, build-once, atomic publication, cleanup after a failed writer, locking."""

import json
import threading
import time

import pytest

from margincal.core.artifacts import config_key
from margincal.store.stage_store import Store


def test_config_key_is_canonical_and_sensitive():
    a = config_key("unlearn", {"lr": 1e-4, "steps": 40})
    assert a == config_key("unlearn", {"steps": 40, "lr": 1e-4})  # key order does not matter
    assert len(a) == 16
    assert a != config_key("unlearn", {"lr": 1e-4, "steps": 41})
    assert a != config_key("polish", {"lr": 1e-4, "steps": 40})
    assert a != config_key("unlearn", {"lr": 1e-4, "steps": 40}, ["abc"])


def test_run_builds_once_and_records_meta(tmp_path):
    store = Store(tmp_path)
    calls = []

    def build(tmp):
        calls.append(tmp)
        (tmp / "out.txt").write_text("x")
        return {"value": 3}

    path = store.run("evaluate", "k1", {"seed": 2}, build)
    again = store.run("evaluate", "k1", {"seed": 2}, build)
    assert path == again == tmp_path / "evaluate" / "k1"
    assert len(calls) == 1 and (path / "out.txt").read_text() == "x"
    meta = store.meta("evaluate", "k1")
    assert meta["info"] == {"value": 3} and meta["manifest"]["config"] == {"seed": 2} and meta["manifest"]["seed"] == 2


def test_failed_build_publishes_nothing_and_is_cleaned(tmp_path):
    store = Store(tmp_path)

    def broken(tmp):
        (tmp / "half.bin").write_text("partial")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        store.run("unlearn", "k", {}, broken)
    assert not store.done("unlearn", "k") and not (tmp_path / "unlearn" / "k").exists()
    assert not list((tmp_path / "unlearn").glob(".k.tmp-*"))  # a failed build removes its own temp directory
    (tmp_path / "unlearn" / ".k.tmp-killed").mkdir(parents=True)  # what a writer killed with -9 leaves behind
    store.run("unlearn", "k", {}, lambda tmp: None)
    assert store.done("unlearn", "k")
    assert not list((tmp_path / "unlearn").glob(".k.tmp-*"))  # removed by the next writer of the key


def test_concurrent_writers_of_one_key_build_once(tmp_path):
    calls = []

    def slow(tmp):
        calls.append(1)
        time.sleep(0.3)
        return {}

    threads = [threading.Thread(target=lambda: Store(tmp_path).run("attack", "k", {}, slow)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert json.loads((tmp_path / "attack" / "k" / "stage.json").read_text())["key"] == "k"


def test_a_metered_block_counts_its_tokens_seconds_and_peak_memory():
    """Tokens added inside the block count, those before it do not; the peak is the process's (a CPU here)."""
    from margincal.core.artifacts import cpu_name
    from margincal.store.costs import add_tokens, metered

    add_tokens(5)
    with metered() as cost:
        add_tokens(7)
        add_tokens(3)
        ballast = bytearray(64 * 2**20)  # 64 MiB resident during the block
        ballast[::4096] = b"x" * len(ballast[::4096])
    assert cost["tokens"] == 10 and cost["seconds"] > 0 and cost["tokens_per_s"] == 10 / cost["seconds"]
    assert cost["device"] == cpu_name() and cost["memory"] in ("peak RSS", "peak RSS since start")
    assert cost["peak_memory_gib"] >= 64 / 1024
    del ballast


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def test_an_entry_records_its_files_digests_and_a_damaged_one_is_built_again_where_verified(tmp_path):
    store, builds = Store(tmp_path), []

    def build(tmp):
        builds.append(tmp)
        (tmp / "w.bin").write_bytes(b"abc")

    path = store.run("s", "k", {}, build)
    recorded = json.loads((path / "digests.json").read_text())
    assert recorded == {"stage.json": _sha((path / "stage.json").read_bytes()), "w.bin": _sha(b"abc")}
    assert store.damaged("s", "k") is None
    (path / "w.bin").write_bytes(b"abd")
    assert store.damaged("s", "k") == "w.bin is not the file it was (SHA-256 differs)"
    assert store.run("s", "k", {}, build) == path and len(builds) == 1  # a plain read takes the cache as it is
    assert store.run("s", "k", {}, build, verify=True) == path and len(builds) == 2  # handed out: built again
    assert (path / "w.bin").read_bytes() == b"abc" and store.damaged("s", "k") is None
    (path / "w.bin").unlink()
    assert store.damaged("s", "k") == "w.bin is missing"
    (path / "w.bin").write_bytes(b"abc")
    (path / "extra").write_bytes(b"")
    assert store.damaged("s", "k") == "extra was not in it"


def test_an_entry_from_before_digests_is_damaged_when_its_weights_are_cut_short(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    entry = tmp_path / "s" / "k"
    (entry / "model").mkdir(parents=True)
    (entry / "stage.json").write_text("{}")
    save_file({"w": np.zeros(64, dtype=np.float32)}, str(entry / "model" / "model.safetensors"))
    assert Store(tmp_path).damaged("s", "k") is None
    whole = (entry / "model" / "model.safetensors").read_bytes()
    (entry / "model" / "model.safetensors").write_bytes(whole[:-10])
    assert Store(tmp_path).damaged("s", "k") == "model.safetensors is cut short"


def test_adopting_a_damaged_entry_is_refused_before_anything_is_published(tmp_path):
    from margincal.core.errors import InputError

    source = Store(tmp_path / "a").run("s", "k", {}, lambda tmp: (tmp / "w.bin").write_bytes(b"abc") and None)
    (source / "w.bin").write_bytes(b"xbc")
    with pytest.raises(InputError, match="w.bin is not the file it was \\(SHA-256 differs\\); the entry is damaged"):
        Store(tmp_path / "b").adopt("s", "k", source)
    assert not (tmp_path / "b" / "s").exists()  # nothing published, no temporary copy left
    expected = {"w.bin": _sha(b"xbc"), "stage.json": _sha((source / "stage.json").read_bytes())}
    assert (Store(tmp_path / "b").adopt("s", "k", source, expected) / "w.bin").read_bytes() == b"xbc"


def test_a_store_that_is_not_a_directory_is_refused_in_one_line(tmp_path):
    import os

    from margincal.core.errors import InputError

    os.symlink(tmp_path / "loop", tmp_path / "loop")
    with pytest.raises(InputError, match="^the store .*loop is a link loop, not a directory: give a directory"):
        Store(tmp_path / "loop")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="^the store .*file is a file, not a directory"):
        Store(tmp_path / "file")
