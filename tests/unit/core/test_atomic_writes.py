"""Concurrent writers of one cache file: each writes its own temporary sibling (margincal.core.artifacts.atomic_path).

Two Ray workers that compute the same anchor table write the same cache path. With one fixed temporary name
(``<key>.tmp``) they wrote into the same file and the slower one's rename found it gone (FileNotFoundError) or
installed a file the other was still writing. Here two forked processes write one table to one cache path at the
same moment, round after round, with the write slowed down so the writes always overlap. (Verified: against the
fixed-name writer every run fails in the first round, the second rename raising FileNotFoundError.)"""

import multiprocessing
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

import margincal.mc.loss as objective
from margincal.data.records import EncodedQA
from margincal.mini.models import MiniArch, new_mini_model

ARCH = MiniArch(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2)
ROUNDS = 6
DELAY = 0.15  # seconds each save holds its temporary file before the rename


class _Tokenizer:
    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def __len__(self) -> int:
        return ARCH.vocab_size


def _model() -> torch.nn.Module:
    return new_mini_model(ARCH, _Tokenizer(), seed=0)


def _examples() -> list[EncodedQA]:
    return [EncodedQA(i, [1, 3 + i, 4 + i], [5 + i, 6, 7 + i, 2]) for i in range(4)]


def _write_tables(model, cache_root: str, rounds: int, barrier, delay: float) -> None:
    """One worker (forked: ``model`` is the parent's): in each round, wait for the other at the barrier, then
    compute and cache the same table."""
    torch.set_num_threads(1)  # as DataLoader workers do: no OpenMP pool in a forked child
    save = objective.save_file

    def slow_save(tensors, filename, *args, **kwargs):
        save(tensors, filename, *args, **kwargs)
        time.sleep(delay)  # the other worker writes meanwhile

    objective.save_file = slow_save
    examples = _examples()
    try:
        for i in range(rounds):
            barrier.wait(timeout=120)
            tables = objective.anchor_tables(model, "anchor", examples, 0, Path(cache_root) / f"round{i}")
            assert set(tables) == {"margin", "entropy", "gold"}
    except BaseException:
        barrier.abort()  # the other worker stops at its next wait instead of timing out
        raise


def test_two_processes_write_one_anchor_table_concurrently(tmp_path):
    model = _model()
    expected = objective.anchor_tables(model, "anchor", _examples(), 0)  # no cache: computed here
    ctx = multiprocessing.get_context("fork")  # the children share the parent's imports and model: quick to start
    barrier = ctx.Barrier(2)
    workers = [ctx.Process(target=_write_tables, args=(model, str(tmp_path), ROUNDS, barrier, DELAY)) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
        if w.is_alive():
            w.kill()
    assert [w.exitcode for w in workers] == [0, 0], "a writer failed (its traceback is in the captured stderr)"
    for i in range(ROUNDS):
        files = sorted((tmp_path / f"round{i}" / "anchors").iterdir())
        assert len(files) == 1 and files[0].suffix == ".safetensors", [f.name for f in files]  # no temp file left
        loaded = load_file(str(files[0]))
        assert set(loaded) == set(expected)
        assert all(torch.allclose(loaded[k], expected[k], atol=1e-5) for k in expected)


def test_figures_and_mini_data_leave_no_temporary_files(tmp_path):
    from margincal.mini.data import MiniConfig, generate
    from margincal.reporting.figures import save_figure

    bench = generate(MiniConfig(n_authors=10, n_holdout_authors=2, n_real_authors=6, n_world_facts=6, n_probe=4))
    bench.to_json_dir(tmp_path / "data")
    bench.to_json_dir(tmp_path / "data")  # rewriting replaces in place
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == sorted(f"{n}.json" for n in bench.splits)

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    png = save_figure(fig, tmp_path / "figs" / "line.png")
    assert png.read_bytes()[:4] == b"\x89PNG" and [p.name for p in png.parent.iterdir()] == ["line.png"]
    from PIL import Image

    with Image.open(png) as image:  # stored with a palette, at matplotlib's size
        assert image.mode == "P" and image.size == (round(6.4 * 130), round(4.8 * 130))
