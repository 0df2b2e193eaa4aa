"""The embedded store's staged writes (aggregator/store/embedded.py): writers append, a settle
moves the rows into place in key order, reads settle first. What a reader sees must be what a
write in place gave: every acknowledged point, a replay merged into its row, the newest value
of a field winning, from any number of writer processes; a store written before staging
existed is read and written as it was; a full disk keeps the staged points, never loses them."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

import pytest

from gpufleet.aggregator.store import EmbeddedStore, Point
from gpufleet.aggregator.store.base import StoreUnavailable
from gpufleet.aggregator.store.embedded_staging import staged_path

S = 1_000_000_000
T0 = 1_790_000_040 * S


def gpu(node: str, index: int, t: int, **fields: float) -> Point:
    return Point("gpu", {"node": node, "gpu": str(index)}, fields, t)


def staged_rows(path: Path) -> int:
    db = sqlite3.connect(f"file:{staged_path(path)}?mode=ro", uri=True)
    try:
        return db.execute('SELECT COUNT(*) FROM "r_gpu"').fetchone()[0]
    finally:
        db.close()


def by_key(points: list[Point]) -> dict[tuple[str, str, int], dict[str, object]]:
    return {(p.tags["node"], p.tags["gpu"], p.time_unix_ns): p.fields for p in points}


def test_two_writers_replays_and_reads_between_give_what_writes_in_place_gave(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    # Two writers on one file (two ingest workers) and a reader (the main process).
    a, b = EmbeddedStore(path, 86400), EmbeddedStore(path, 86400)
    reader = EmbeddedStore(path, 86400)
    try:
        a.write(
            [gpu("n1", g, T0 + i * S, util_gpu_pct=i, power_w=100.0 + i) for i in range(5) for g in (0, 1)]
        )
        b.write([gpu("n2", 0, T0 + i * S, util_gpu_pct=50.0) for i in range(5)])
        assert staged_rows(path) == 15, "writes append to the staging table"
        first = by_key(reader.query_points("gpu", T0, T0 + 60 * S))
        assert staged_rows(path) == 0, "a read settles what was staged"
        assert len(first) == 15 and first[("n1", "1", T0 + 3 * S)] == {"util_gpu_pct": 3, "power_w": 103.0}
        # A replay of settled points, carrying one field anew (the newest value wins, the
        # field it does not carry is kept), and a replay of a staged point twice over.
        a.write([gpu("n1", 0, T0 + 2 * S, util_gpu_pct=99.0)])
        b.write([gpu("n2", 0, T0 + 9 * S, util_gpu_pct=1.0), gpu("n2", 0, T0 + 9 * S, util_gpu_pct=2.0)])
        a.write([gpu("n2", 0, T0 + 9 * S, temp_c=40.0)])
        second = by_key(reader.query_points("gpu", T0, T0 + 60 * S))
        assert len(second) == 16, "a replay is one point, not two"
        assert second[("n1", "0", T0 + 2 * S)] == {"util_gpu_pct": 99.0, "power_w": 102.0}
        assert second[("n2", "0", T0 + 9 * S)] == {"util_gpu_pct": 2.0, "temp_c": 40.0}
        assert {k: v for k, v in second.items() if k[2] != T0 + 9 * S and k != ("n1", "0", T0 + 2 * S)} == {
            k: v for k, v in first.items() if k != ("n1", "0", T0 + 2 * S)
        }
        assert a.settle() == 0, "nothing left to settle"
    finally:
        for s in (a, b, reader):
            s.close()


def test_a_writer_that_comes_to_a_measurement_late_takes_the_series_others_made(tmp_path: Path) -> None:
    """Each process keeps only the series of the measurements it has used (an ingest worker
    never reads the roll-ups'). One that first writes a measurement after others made its
    series must find them: same series, same ids, no second series for the same tags."""
    path = tmp_path / "store.sqlite3"
    a, b, reader = EmbeddedStore(path, 86400), EmbeddedStore(path, 86400), EmbeddedStore(path, 86400)
    try:
        b.write([gpu("n9", 0, T0, util_gpu_pct=1.0)])  # b knows "gpu" only
        rolled = [
            Point("gpu_1m", {"node": f"n{i}", "gpu": "0"}, {"util_gpu_pct_mean": float(i)}, T0)
            for i in range(50)
        ]
        a.write(rolled)  # a makes 50 roll-up series b has never seen
        b.write([gpu("n9", 1, T0, util_gpu_pct=2.0)])  # b catches up past them, not keeping them
        later = [
            Point("gpu_1m", {"gpu": "0", "node": f"n{i}"}, {"util_gpu_pct_max": 9.0}, T0)
            for i in range(45, 55)
        ]
        b.write(later)  # five known to a, five new
        got = {p.tags["node"]: p.fields for p in reader.query_points("gpu_1m", T0, T0 + S)}
        assert len(got) == 55, "a series the late writer met again was not made twice"
        assert got["n47"] == {"util_gpu_pct_mean": 47.0, "util_gpu_pct_max": 9.0}
        assert got["n52"] == {"util_gpu_pct_max": 9.0} and got["n3"] == {"util_gpu_pct_mean": 3.0}
        with contextlib.closing(sqlite3.connect(path)) as db:
            (count,) = db.execute("SELECT COUNT(*) FROM series WHERE measurement = 'gpu_1m'").fetchone()
        assert count == 55
        assert len(reader.query_points("gpu", T0, T0 + S)) == 2
    finally:
        for s in (a, b, reader):
            s.close()


def test_a_store_written_before_staging_is_read_and_written(tmp_path: Path) -> None:
    """The layout earlier versions wrote: the table, no staging table."""
    path = tmp_path / "store.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "PRAGMA journal_mode=WAL;"
        "CREATE TABLE series (id INTEGER PRIMARY KEY, measurement TEXT NOT NULL, tags TEXT NOT NULL, "
        "UNIQUE (measurement, tags));"
        'INSERT INTO series VALUES (1, \'gpu\', \'[["gpu", "0"], ["node", "old"]]\');'
        "CREATE TABLE m_gpu (series_id INTEGER NOT NULL, ts INTEGER NOT NULL, util_gpu_pct, "
        "PRIMARY KEY (series_id, ts)) WITHOUT ROWID;"
        f"INSERT INTO m_gpu VALUES (1, {T0}, 42.0);"
    )
    db.close()
    store = EmbeddedStore(path, 86400)
    try:
        assert by_key(store.query_points("gpu", T0, T0 + S)) == {("old", "0", T0): {"util_gpu_pct": 42.0}}
        store.write([gpu("old", 0, T0, power_w=300.0), gpu("new", 0, T0 + S, util_gpu_pct=7.0)])
        assert by_key(store.query_points("gpu", T0, T0 + 2 * S)) == {
            ("old", "0", T0): {"util_gpu_pct": 42.0, "power_w": 300.0},
            ("new", "0", T0 + S): {"util_gpu_pct": 7.0},
        }
    finally:
        store.close()


def test_a_full_disk_keeps_staged_points_and_reads_answer_without_them_until_it_has_room(
    small_fs: Path,
) -> None:
    store = EmbeddedStore(small_fs / "store.sqlite3", 86400)
    filler = small_fs / "filler"
    try:
        store.write([gpu("n1", 0, T0, util_gpu_pct=1.0)])
        assert len(store.query_points("gpu", T0, T0 + 60 * S)) == 1
        store.write([gpu("n1", 0, T0 + i * S, util_gpu_pct=float(i)) for i in range(1, 200)])
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)  # the disk fills up: not a byte left
        try:
            for size in (1 << 16, 1):
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * size):
                        pass
        finally:
            os.close(fd)
        with pytest.raises(StoreUnavailable):
            store.settle()
        # The read answers (with what was settled before the disk filled) and says why not more.
        assert len(store.query_points("gpu", T0, T0 + 600 * S)) == 1
        assert store.settler.failures_total == 2, "each failed settle is counted (the call's and the read's)"
        filler.unlink()
        got = store.query_points("gpu", T0, T0 + 600 * S)
        want = [1.0] + [float(i) for i in range(1, 200)]
        assert [p.fields["util_gpu_pct"] for p in got] == want, "none lost"
    finally:
        store.close()
