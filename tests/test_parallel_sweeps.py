"""Sweeps started together share one data directory and one cache: nothing they write may collide."""
from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

from experiments.climb.overrides import check_writable
from experiments.core.cache import build_once, manifest_ok

WORKERS = 4


def _probe_many(data_dir: str, times: int) -> int:
    for _ in range(times):
        check_writable(Path(data_dir))
    return times


def test_the_write_probe_of_parallel_sweeps_never_collides(tmp_path):
    # A fixed probe name failed here within a few hundred checks: one process removed the file another
    # was about to remove ("data directory ... is not writable (No such file or directory)").
    with mp.get_context("spawn").Pool(WORKERS) as pool:
        done = pool.starmap(_probe_many, [(str(tmp_path), 300)] * WORKERS)
    assert done == [300] * WORKERS
    assert not list(tmp_path.iterdir())


def _build(out: str, log: str) -> bool:
    def build(tmp: Path) -> None:
        with open(log, "a") as fh:
            fh.write(f"{tmp.name}\n")
        time.sleep(0.5)   # long enough that every other process arrives while this one builds
        (tmp / "weights.bin").write_bytes(b"\1" * 1024)

    return build_once(Path(out), build, "test folder")


def test_parallel_builders_of_one_folder_build_it_once_and_all_reuse_it(tmp_path):
    out, log = tmp_path / "models" / "m-123", tmp_path / "builds.log"
    with mp.get_context("spawn").Pool(WORKERS) as pool:
        reused = pool.starmap(_build, [(str(out), str(log))] * WORKERS)
    assert sorted(reused) == [False] + [True] * (WORKERS - 1)
    assert len(log.read_text().splitlines()) == 1
    assert manifest_ok(out) and (out / "weights.bin").read_bytes() == b"\1" * 1024
    assert not list(out.parent.glob(".m-123.partial-*"))


def test_a_killed_builders_partial_folder_is_cleared_and_the_folder_built(tmp_path):
    out = tmp_path / "m-1"
    stale = tmp_path / ".m-1.partial-dead"
    stale.mkdir()
    (stale / "half.bin").write_bytes(b"\0")
    assert build_once(out, lambda tmp: (tmp / "w.bin").write_bytes(b"\2")) is False
    assert not stale.exists() and manifest_ok(out)
    assert build_once(out, lambda tmp: (_ for _ in ()).throw(AssertionError("rebuilt"))) is True
