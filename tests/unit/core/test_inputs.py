"""The one checked door for a user's files (:mod:`margincal.core.inputs`, issue 59): every kind of path is named before
anything is read, reads stop at their cap whatever the file system says, empty files are refused, every loader goes
through the door (a scan of the source lists each raw read and fails on one it does not know), texts are bounded
before they are tokenised, and a long tokenisation stops on SIGTERM. The CLI-level rows are in
``tests/integration/test_bad_inputs.py``."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from margincal.config.files import read_yaml
from margincal.core.errors import InputError
from margincal.core.inputs import checked, path_kind, read_bytes, read_head, read_json, read_text
from margincal.data.lengths import bounded, check_fits, interruptible, longest_token
from margincal.data.records import QARecord, encode_qa

SRC = ROOT / "src" / "margincal"


@pytest.fixture
def kinds(tmp_path):
    """One path of every kind: a file, a directory, a FIFO, a socket, a link loop, a link to nothing, a missing path
    and a path below a file."""
    (tmp_path / "file.json").write_text("{}")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    yield tmp_path
    server.close()


@pytest.mark.parametrize(
    ("name", "kind", "error", "message"),
    [
        ("file.json", "file", None, None),
        ("dir", "directory", InputError, r"dir is a directory, not a file; give a JSON file"),
        ("fifo", "FIFO (named pipe)", InputError, r"fifo is a FIFO \(named pipe\), not a file"),
        ("sock", "socket", InputError, "sock is a socket, not a file"),
        ("loop", "link loop", InputError, "loop is a symbolic link loop"),
        ("dangling", "dangling link", FileNotFoundError, r"dangling is a symbolic link to .*nowhere, which does not"),
        ("missing", "missing", FileNotFoundError, "--flag .*missing: no such file"),
        ("file.json/below", "missing", FileNotFoundError, "no such file"),
    ],
)
def test_every_kind_of_path_is_named_before_it_is_read(kinds, name, kind, error, message):
    path = kinds / name
    assert path_kind(path) == kind
    if error is None:
        assert checked(path, "--flag") == path and read_json(path) == {}
        return
    with pytest.raises(error, match=message):
        read_json(path, "--flag")


def test_a_device_is_refused_whatever_size_it_reports():
    """``/dev/zero`` reports size 0 and never ends: it is refused by its kind, nothing read."""
    assert path_kind("/dev/zero") == "character device"
    with pytest.raises(InputError, match="/dev/zero is a character device, not a file; give a JSON file"):
        read_json("/dev/zero", "--claimed")


def test_reads_stop_at_their_cap_and_empty_files_are_refused(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"x" * 101)
    assert read_bytes(path, limit=101) == b"x" * 101
    with pytest.raises(InputError, match=r"a\.txt is larger than 100 bytes, the most margincal reads for it"):
        read_bytes(path, "--models", limit=100)
    for blank in (b"", b" \n\t\n"):
        path.write_bytes(blank)
        with pytest.raises(InputError, match=r"--models .*a\.txt is empty; give a list"):
            read_text(path, "--models", give="a list")
        assert read_bytes(path, empty=True) == blank
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match=r"is not UTF-8 text \(invalid start byte at byte 0\)"):
        read_text(path)
    path.write_bytes(b"---\nlicense: mit\n---\n" + b"x" * 10_000)
    assert read_head(path, 12) == "---\nlicense:"


def test_yaml_settings_are_never_taken_from_an_empty_file(tmp_path):
    """An empty preset or config file stops instead of standing for all defaults (issue 59: a 20-step attack ran)."""
    cases = {"empty.yaml": ("", "is empty"), "comments.yaml": ("# lr: 1e-4\n", "holds only comments"),
             "braces.yaml": ("{}\n", "holds an empty mapping")}  # fmt: skip
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=message):
            read_yaml(tmp_path / name)
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(InputError, match="dir.yaml is a directory, not a file"):
        read_yaml(tmp_path / "dir.yaml")


# Every raw read of a file in src/margincal outside margincal/core/inputs.py, as (module, function): each reads a file
# margincal wrote itself, or one already checked by the door, or is no read of a user's file at all.
RAW_READS = {
    ("auditing.card", "_read"): "stage files margincal wrote in its store",
    ("cli", "main"): "os.devnull",
    ("core.artifacts", "_fresh_sibling"): "creates a temporary file (os.open for writing)",
    ("core.artifacts", "_module_source"): "margincal's own source, for code versions",
    ("core.artifacts", "cpu_name"): "/proc/cpuinfo",
    ("core.artifacts", "weights_digest"): "the digest cache margincal wrote; weights files each checked a regular file",
    ("core.artifacts", "written_by_margincal"): "an anchor table's header at an output path (metadata only)",
    ("data.hub", "_cached_commit"): "a refs file of the Hugging Face cache",
    ("data.tofu", "load_qa_json"): "Parquet after inputs.checked and the size cap",
    ("data.tofu", "load_split"): "datasets.load_dataset of a hub id (no local path)",
    ("mc.loss", "anchor_tables"): "anchor tables margincal cached in its store",
    ("mc.loss", "load"): "an anchor table checked a regular file first",
    ("model.loading", "check_architecture"): "safetensors headers, each file checked by check_checkpoint",
    ("model.loading", "check_checkpoint"): "safetensors headers, each file checked a regular file first",
    ("model.quantize", "_weight"): "a weights shard of a checked model directory or of the Hugging Face cache",
    ("pipeline.cell", "_examples"): "attack.json margincal wrote in its store",
    ("pipeline.executors", "_logged"): "a cell's log, appended to",
    ("pipeline.executors", "worker_died"): "a cell record margincal wrote",
    ("pipeline.graph", "read"): "stage files margincal wrote in its store",
    ("store.costs", "_peak_rss_gib"): "/proc/self/status",
    ("store.stage_store", "_lock"): "a lock file, opened for writing",
    ("store.stage_store", "_recorded"): "digests.json margincal wrote in its store",
    ("store.stage_store", "_whole"): "a safetensors header of a file margincal published in its store",
    ("store.stage_store", "meta"): "stage.json margincal wrote in its store",
}
PATH_READS = {"read_text", "read_bytes"}  # pathlib's, called on a path object
MODULE_READS = {("json", "load"), ("json", "loads"), ("yaml", "safe_load"), ("yaml", "load"), ("os", "open"),
                ("os", "fdopen"), ("pq", "read_table")}  # fmt: skip
NAME_READS = {"open", "safe_open", "load_file", "load_dataset"}


def raw_reads(src: Path) -> dict[tuple[str, str], list[int]]:
    """(module, function) → lines of every raw file read in ``src`` outside ``inputs.py``: ``open``, ``os.open``,
    a path's ``read_text``/``read_bytes``, ``json.load(s)``, ``yaml`` loads, Parquet and safetensors opens,
    ``load_dataset``. A call by bare name to ``read_text``/``read_bytes``/``read_json`` is the door's own."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(src.rglob("*.py")):
        module = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        if module == "core.inputs":
            continue
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
                raw = (
                    (isinstance(f, ast.Attribute) and f.attr in PATH_READS and owner != "inputs")
                    or (isinstance(f, ast.Attribute) and (owner, f.attr) in MODULE_READS)
                    or (isinstance(f, ast.Name) and f.id in NAME_READS)
                )
                if raw:
                    found.setdefault((module, fn.name), []).append(node.lineno)
    return found


def test_every_loader_reads_a_users_file_through_the_door():
    """A raw read of a file that is not in :data:`RAW_READS` (a new loader that bypasses :mod:`margincal.core.inputs`)
    fails here, naming its module, function and line; a listed one that is gone must leave the list too."""
    found = raw_reads(SRC)
    assert {site: lines for site, lines in found.items() if site not in RAW_READS} == {}
    assert [site for site in RAW_READS if site not in found] == []


def test_a_planted_loader_that_bypasses_the_door_is_found(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "extra.py").write_text(
        "import json\nfrom pathlib import Path\n\ndef load_mine(path):\n    return json.loads(Path(path).read_text())\n"
    )
    assert raw_reads(tmp_path) == {("data.extra", "load_mine"): [5, 5]}


def test_texts_are_bounded_before_they_are_tokenised(tiny_tokenizer):
    """A text too long for max_length is refused by its characters alone; a text the protocol truncates is cut to a
    head (a tail) whose kept tokens are exactly the whole text's."""
    longest = longest_token(tiny_tokenizer)
    assert longest == max(len(t) for t in tiny_tokenizer.get_vocab())
    check_fits([("question", "x" * 10), ("answer", "y" * 10)], 20 // longest + 1, longest, "record 0")
    with pytest.raises(ValueError, match=r"record 3: its answer is 2,000 characters \(2,010 in all\), more than"):
        check_fits([("question", "x" * 10), ("answer", "y" * 2000)], 8, longest, "record 3")
    text = " ".join(f"Ann Bel writes sea novels {i}." for i in range(2000))
    whole = tiny_tokenizer(text)["input_ids"]
    head = bounded(tiny_tokenizer, text, 40, longest)
    tail = bounded(tiny_tokenizer, text, 40, longest, tail=True)
    assert len(head) < len(text) // 10 and len(tail) < len(text) // 10
    assert tiny_tokenizer(head)["input_ids"][:40] == whole[:40]
    assert tiny_tokenizer(tail)["input_ids"][-40:] == whole[-40:]
    assert bounded(tiny_tokenizer, "Ann Bel.", 40, longest) == "Ann Bel."


def test_a_question_of_megabytes_is_refused_naming_the_record_and_field(tiny_tokenizer):
    records = [QARecord("Where?", "Here."), QARecord("Why? " * 400_000, "Because.")]
    with pytest.raises(ValueError, match=r"^record 1: its question is 2,000,000 characters"):
        encode_qa(tiny_tokenizer, records, max_length=64)
    assert len(encode_qa(tiny_tokenizer, records, max_length=64, too_long="skip")) == 1


def test_interruptible_returns_and_raises_as_the_call_does():
    assert interruptible(lambda: 41 + 1) == 42
    with pytest.raises(ZeroDivisionError):
        interruptible(lambda: 1 / 0)


CHILD = """
import hashlib, signal, sys
from margincal.cli import Terminated, _terminate
from margincal.data.records import chunk_passages

class Endless:
    \"\"\"A tokenizer whose call, like the Rust one on a huge corpus, runs in C with the GIL released and never checks
    for signals, for an hour or more (PBKDF2 at 2e9 rounds).\"\"\"

    def __call__(self, text, **kwargs):
        hashlib.pbkdf2_hmac("sha256", b"margincal", b"salt", 2_000_000_000)
        return {"input_ids": []}

signal.signal(signal.SIGTERM, _terminate)
print("start", flush=True)
try:
    chunk_passages(Endless(), ["Ann Bel writes sea novels in Port Ivo."], 64)
    print("finished", flush=True)
except Terminated:
    print("terminated", flush=True)
    sys.exit(143)
"""


def test_a_long_tokenisation_stops_on_sigterm():
    """SIGTERM during a tokenizer call that holds its thread for hours in C (the Rust tokenizer on a whole corpus,
    open-unlearning's chunking of raw text) stops the process: the call runs in a worker thread while the main
    thread waits in slices, so the handler runs at once. A call in the main thread would hold the handler for the
    hours the call takes, so the process would not end at all within the test: the verdict is that it ends, with
    the handler's exit status, not how soon."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert child.stdout.readline() == b"start\n"
    time.sleep(1.0)
    child.terminate()
    try:
        out, _ = child.communicate(timeout=600)  # the call takes hours: a process that ends has been interrupted
    finally:
        child.kill()
    assert (child.returncode, out) == (143, b"terminated\n")


def test_corpus_blocks_rebuild_the_joined_corpus_within_their_bound():
    from margincal.data.records import corpus_blocks

    texts = ["one two three", "x" * 25, "four five six seven eight nine", "ten"]
    blocks = list(corpus_blocks(texts, 12))
    assert "".join(blocks) == "\n\n".join(texts) and all(len(b) <= 12 for b in blocks)
    assert blocks[:2] == ["one two ", "three\n\n"]  # a long passage cut after its last space within the bound
    assert blocks[2:5] == ["x" * 12, "x" * 12, "x\n\n"]  # no space: cut at the bound
    assert list(corpus_blocks(texts, 10**6)) == ["\n\n".join(texts)]  # within the bound: the corpus whole


def test_a_corpus_of_one_huge_document_is_tokenised_in_bounded_blocks(tiny_tokenizer, monkeypatch):
    """Issue 74: a 40 MB document drove an audit past 4 GiB, tokenised in one call. Each call now reads at most
    CORPUS_BLOCK_CHARS characters; a corpus within the bound is chunked exactly as the one whole call did."""
    from margincal.data import records

    text = "Ann Bel writes sea novels in Port Ivo. " * 300
    whole = records.chunk_passages(tiny_tokenizer, [text, "Where was Ann Bel born?"], 16)
    seen = []

    class Spy:
        def __call__(self, block, **kwargs):
            seen.append(len(block))
            return tiny_tokenizer(block, **kwargs)

        def decode(self, ids):
            return tiny_tokenizer.decode(ids)

    assert records.chunk_passages(Spy(), [text, "Where was Ann Bel born?"], 16) == whole and len(seen) == 1
    monkeypatch.setattr(records, "CORPUS_BLOCK_CHARS", 1000)
    seen.clear()
    blocked = records.chunk_passages(Spy(), [text, "Where was Ann Bel born?"], 16)
    assert len(seen) == 12 and max(seen) <= 1000
    assert "".join(blocked) == "".join(whole) == f"{text}\n\nWhere was Ann Bel born?"
    assert all(len(tiny_tokenizer(p, add_special_tokens=False)["input_ids"]) <= 17 for p in blocked)
