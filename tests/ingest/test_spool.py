"""The on-disk spool's own rules: durable segments, order, survival, the size limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.aggregator.ingest.spool import Spool, SpoolFull, adopt_orphans
from gpufleet.aggregator.store import Point


def batch(n: int, tag: str = "n1") -> list[Point]:
    return [
        Point(
            "gpu",
            {"node": tag, "gpu": str(i)},
            {"util_gpu_pct": float(i), "ok": True, "seq": i},
            1_790_000_000_000_000_000 + i,
        )
        for i in range(n)
    ]


def test_batches_come_back_in_order_with_their_types_and_survive_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10 << 20)
    spool.append(batch(3, "first"))
    spool.append(batch(2, "second"))
    reopened = Spool(tmp_path, max_bytes=10 << 20)  # what an aggregator restart sees
    assert len(reopened) == 2 and reopened.status().points == 5
    n, points = reopened.oldest()
    assert [p.tags["node"] for p in points] == ["first"] * 3
    assert points[1].fields == {"util_gpu_pct": 1.0, "ok": True, "seq": 1}
    reopened.remove(n)
    assert reopened.oldest()[1][0].tags["node"] == "second"
    assert reopened.status().drained_points_total == 3


def test_a_half_written_segment_from_a_crash_is_discarded(tmp_path: Path) -> None:
    Spool(tmp_path, max_bytes=10 << 20).append(batch(1))
    (tmp_path / "0000000000000002.tmp").write_bytes(b'["gpu",{"no')  # never renamed: never acknowledged
    spool = Spool(tmp_path, max_bytes=10 << 20)
    assert len(spool) == 1 and not list(tmp_path.glob("*.tmp"))


def test_near_the_limit_it_warns_and_at_the_limit_it_refuses(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=4000, warn_ratio=0.5)
    spool.append(batch(10))
    size = spool.status().bytes
    while spool.status().bytes + size <= 4000:
        spool.append(batch(10))
    assert spool.status().near_limit
    with pytest.raises(SpoolFull, match="not acknowledging"):
        spool.append(batch(10))
    assert spool.status().refused_total == 1
    with pytest.raises(SpoolFull, match="at most 90%"):
        spool.append(batch(1))  # full stays full: a small batch does not squeeze in
    while spool.status().bytes > 0.9 * 4000 or spool.status().bytes + size > 4000:
        n, _ = spool.oldest()
        spool.remove(n)
    spool.append(batch(10))  # room again once the store takes it back below 90 % (and it fits)


def test_a_large_batch_refused_keeps_it_refusing_until_that_batch_would_fit(tmp_path: Path) -> None:
    """A group-commit batch of many reports does not fit while the spool is half full: the spool
    refuses every batch until the drain has made room for that one, so acks stop once and the
    status does not flap back to "acknowledging" when a small batch would still squeeze in
    (once seen as `gpufleet status` saying acknowledging again while the store was down)."""
    big = batch(60)
    scratch = Spool(tmp_path / "scratch", max_bytes=1 << 20)
    scratch.append(big)
    big_bytes = scratch.status().bytes
    spool = Spool(tmp_path / "spool", max_bytes=big_bytes * 2)
    while spool.status().bytes < big_bytes * 1.2:
        spool.append(batch(5))
    with pytest.raises(SpoolFull):
        spool.append(big)
    with pytest.raises(SpoolFull, match="room for the"):
        spool.append(batch(1))  # it would fit, but the big one would not: still refusing
    while spool.status().bytes + big_bytes > big_bytes * 2:
        spool.remove(spool.oldest()[0])
    spool.append(big)


def test_the_spools_of_workers_no_longer_run_are_moved_into_the_main_spool(tmp_path: Path) -> None:
    """ingest_workers lowered from 3 to 1: what workers 1 and 2 spooled is not stranded."""
    for k, batches in ((0, 1), (1, 2), (2, 1)):
        spool = Spool(tmp_path / f"spool-worker-{k}", 1 << 20)
        for b in range(batches):
            spool.append(batch(2, f"w{k}-{b}"))
    main = Spool(tmp_path / "spool", 1 << 20)
    assert adopt_orphans(tmp_path, 1, main) == 3
    moved = []
    while (oldest := main.oldest()) is not None:
        moved.append(oldest[1][0].tags["node"])
        main.remove(oldest[0])
    assert moved == ["w1-0", "w1-1", "w2-0"]  # oldest first, worker by worker
    assert len(Spool(tmp_path / "spool-worker-1", 1 << 20)) == 0
    assert len(Spool(tmp_path / "spool-worker-0", 1 << 20)) == 1  # worker 0 still runs: its own
