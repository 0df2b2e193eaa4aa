"""The on-disk spool: batches the store could not take, kept until it can.

When a store write fails, the batch is written to the spool instead (one segment file per
batch, fsynced, renamed into place so a crash never leaves half a segment) and the reports
are acknowledged: they are durable. While the spool holds anything, new batches go behind it,
so the store receives points in the order they arrived. A drainer writes segments to the
store oldest first, deleting each once the store has it, backing off between failures
(honouring Retry-After). The spool survives an aggregator restart: it is just files.

Bounded by `max_bytes`: past `warn_ratio` of it the spool reports itself near its limit
(gauge gpufleet_spool_near_limit, a logged warning — alert on it); at the limit it refuses
new batches (counted), and goes on refusing until the drain has taken it below RESUME_RATIO
(90 %) of the limit and made room for the batch that did not fit, so the aggregator stops
acknowledging and collectors keep the reports in their own replay buffers until there is room.
Nothing is dropped here.

A disk that cannot take the segment (ENOSPC, EIO) raises SpoolUnavailable: the batch is not
acknowledged, and the half-written file is removed. A batch the store refuses again and again
(the writer's POISON_RETRIES) is bisected by the writer; the points the store will not take
are moved to `quarantine/` beside the segments, one `.seg` (the points, as spooled) and one
`.json` (why, when, how often) per batch. Quarantined batches are kept, counted and shown in
`gpufleet status`; a restart does not bring them back into the drain.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from gpufleet.aggregator.store.base import Point, StoreUnavailable

log = logging.getLogger("gpufleet.aggregator.ingest.spool")


RESUME_RATIO = 0.9


class SpoolFull(StoreUnavailable):
    """The spool is at its size limit; the batch was not taken."""


class SpoolUnavailable(StoreUnavailable):
    """The spool's disk cannot take the batch (full, I/O error); the batch was not taken."""


@dataclass
class SpoolStatus:
    bytes: int
    batches: int
    points: int
    oldest_age_s: float
    drained_points_total: int
    drain_points_per_s: float
    max_bytes: int
    near_limit: bool
    refused_total: int
    quarantined_batches: int
    quarantined_points: int
    quarantine_dir: str


def _encode(points: list[Point]) -> bytes:
    return b"\n".join(
        json.dumps(
            [p.measurement, dict(p.tags), dict(p.fields), p.time_unix_ns],
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
        for p in points
    )


def _decode(data: bytes) -> list[Point]:
    points = []
    for row in data.splitlines():
        measurement, tags, fields, ts = json.loads(row)
        points.append(Point(measurement, tags, fields, ts))
    return points


class Spool:
    def __init__(self, directory: Path, max_bytes: int, warn_ratio: float = 0.8) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.warn_ratio = warn_ratio
        self._lock = threading.Lock()
        for stale in self.directory.glob("*.tmp"):  # a crash mid-write: never acknowledged
            stale.unlink()
        self._segments: deque[tuple[int, Path, int, int, float]] = (
            deque()
        )  # (n, path, bytes, points, created)
        for path in sorted(self.directory.glob("*.seg")):
            data = path.read_bytes()
            self._segments.append(
                (int(path.stem), path, len(data), data.count(b"\n") + 1, path.stat().st_mtime)
            )
        self._next = (self._segments[-1][0] + 1) if self._segments else 1
        self._bytes = sum(s[2] for s in self._segments)
        self.drained_points_total = 0
        self.refused_total = 0
        # Refusing since a batch did not fit: until the drain brings the spool to this size.
        self._resume_at_bytes: int | None = None
        self._drained: deque[tuple[float, int]] = deque(maxlen=120)  # (monotonic, points) per drain
        self._warned = False
        self.quarantine_dir = self.directory / "quarantine"
        self.quarantine_dir.mkdir(exist_ok=True)
        self.quarantined_batches = 0
        self.quarantined_points = 0
        for meta in self.quarantine_dir.glob("*.json"):
            self.quarantined_batches += 1
            with contextlib.suppress(OSError, ValueError):  # an unreadable sidecar still counts
                self.quarantined_points += int(json.loads(meta.read_text()).get("points", 0))
        if self.quarantined_batches:
            log.warning(
                "spool quarantine holds %d batch(es), %d points the store refused, in %s",
                self.quarantined_batches,
                self.quarantined_points,
                self.quarantine_dir,
            )
        if self._segments:
            log.warning(
                "spool holds %d batch(es), %d bytes from before the restart; draining them first",
                len(self._segments),
                self._bytes,
            )

    def __len__(self) -> int:
        return len(self._segments)

    def append(self, points: list[Point]) -> None:
        """Make the batch durable in the spool (raises SpoolFull at the size limit)."""
        data = _encode(points)
        with self._lock:
            # Once full, it stays full until the drain has made real room: below RESUME_RATIO,
            # and room for the batch that did not fit. Acks stop and resume once, not batch by
            # batch as smaller batches squeeze in beside a large one that was refused (the
            # status would flap between "not acknowledging" and "acknowledging" while the
            # store is still down).
            if self._bytes + len(data) > self.max_bytes or (
                self._resume_at_bytes is not None and self._bytes > self._resume_at_bytes
            ):
                if self._resume_at_bytes is None:
                    self._resume_at_bytes = min(
                        int(RESUME_RATIO * self.max_bytes), max(0, self.max_bytes - len(data))
                    )
                self.refused_total += 1
                raise SpoolFull(
                    f"the spool is full ({self._bytes} of {self.max_bytes} bytes); not "
                    f"acknowledging until the store takes it back below {self._resume_at_bytes} bytes "
                    f"(at most {RESUME_RATIO:.0%}, and room for the {len(data)}-byte batch refused)"
                )
            self._resume_at_bytes = None
            n = self._next
            self._next += 1
        path = self.directory / f"{n:016d}.seg"
        try:
            _write_durably(path, data)
        except OSError as exc:
            raise SpoolUnavailable(
                f"cannot write spool segment {path} ({len(data)} bytes): {exc.strerror or exc}; "
                "not acknowledging until the disk takes writes again"
            ) from exc
        with self._lock:
            self._segments.append((n, path, len(data), len(points), time.time()))
            self._bytes += len(data)
            near = self._bytes >= self.warn_ratio * self.max_bytes
        if near and not self._warned:
            log.warning(
                "spool is past %.0f %% of its limit (%d of %d bytes): the store has been "
                "unreachable for a while",
                100 * self.warn_ratio,
                self._bytes,
                self.max_bytes,
            )
        self._warned = near

    def oldest(self) -> tuple[int, list[Point]] | None:
        with self._lock:
            if not self._segments:
                return None
            n, path = self._segments[0][0], self._segments[0][1]
        return n, _decode(path.read_bytes())

    def quarantine(self, n: int, points: list[Point], error: str, refusals: int) -> None:
        """Keep `points` of segment n (those the store refused) aside, and drop segment n."""
        base = self.quarantine_dir / f"{n:016d}"
        _write_durably(base.with_suffix(".seg"), _encode(points))
        meta = {"segment": n, "points": len(points), "error": error, "refusals": refusals, "at": time.time()}
        _write_durably(base.with_suffix(".json"), json.dumps(meta).encode())
        self.quarantined_batches += 1
        self.quarantined_points += len(points)
        log.error(
            "spooled batch %d: the store refused %d point(s) %d times (%s); kept in %s, the rest "
            "of the spool drains",
            n,
            len(points),
            refusals,
            error,
            base.with_suffix(".seg"),
        )
        self.remove(n)

    def quarantine_unreadable(self, error: str) -> None:
        """The oldest segment cannot be read back: move it into the quarantine as it is."""
        with self._lock:
            if not self._segments:
                return
            n, path = self._segments[0][0], self._segments[0][1]
        base = self.quarantine_dir / f"{n:016d}"
        path.replace(base.with_suffix(".seg"))
        meta = {"segment": n, "points": 0, "error": f"unreadable: {error}", "refusals": 0, "at": time.time()}
        _write_durably(base.with_suffix(".json"), json.dumps(meta).encode())
        self.quarantined_batches += 1
        log.error(
            "spooled batch %d cannot be read back (%s); moved to %s", n, error, base.with_suffix(".seg")
        )
        with self._lock:
            if self._segments and self._segments[0][0] == n:
                _, _, size, _, _ = self._segments.popleft()
                self._bytes -= size

    def remove(self, n: int) -> None:
        with self._lock:
            if not self._segments or self._segments[0][0] != n:
                return
            _, path, size, points, _ = self._segments.popleft()
            self._bytes -= size
        path.unlink(missing_ok=True)
        self.drained_points_total += points
        self._drained.append((time.monotonic(), points))

    def status(self) -> SpoolStatus:
        with self._lock:
            oldest = time.time() - self._segments[0][4] if self._segments else 0.0
            points = sum(s[3] for s in self._segments)
            size, batches = self._bytes, len(self._segments)
        now = time.monotonic()
        recent = [(t, n) for t, n in self._drained if now - t <= 60]
        rate = sum(n for _, n in recent) / 60 if recent else 0.0
        return SpoolStatus(
            size,
            batches,
            points,
            oldest,
            self.drained_points_total,
            rate,
            self.max_bytes,
            size >= self.warn_ratio * self.max_bytes,
            self.refused_total,
            self.quarantined_batches,
            self.quarantined_points,
            str(self.quarantine_dir),
        )


def _write_durably(path: Path, data: bytes) -> None:
    """Write, fsync and rename into place (then fsync the folder): a crash or a full disk
    never leaves half a file under the final name."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


WORKER_SPOOL_PREFIX = "spool-worker-"  # DATA_DIR/spool-worker-K: ingest worker K's own spool


def worker_spool_dir(data_path: Path, index: int) -> Path:
    """Each ingest worker spools on its own: a spool has one writer."""
    return data_path / f"{WORKER_SPOOL_PREFIX}{index}"


def adopt_orphans(data_path: Path, workers: int, into: Spool) -> int:
    """Move what the spools of ingest workers that no longer exist hold (ingest_workers was
    lowered, or set to 0) into `into`, oldest first: each batch is made durable there before it
    is removed from the old spool, so a crash in between replays it (writes are idempotent).
    Returns how many batches moved; an unreadable batch is left where it is, logged."""
    moved = 0
    for directory in sorted(data_path.glob(f"{WORKER_SPOOL_PREFIX}*")):
        suffix = directory.name.removeprefix(WORKER_SPOOL_PREFIX)
        if not suffix.isdigit() or int(suffix) < workers or not directory.is_dir():
            continue
        orphan = Spool(directory, 1 << 62)
        while (oldest := _oldest_or_none(orphan, directory)) is not None:
            n, points = oldest
            try:
                into.append(points)
            except (SpoolFull, SpoolUnavailable) as exc:
                log.error("cannot move spooled batches out of %s now (%s); they stay there", directory, exc)
                return moved
            orphan.remove(n)
            moved += 1
    if moved:
        log.warning(
            "moved %d spooled batches of ingest workers that no longer run into %s; they drain "
            "to the store from there",
            moved,
            into.directory,
        )
    return moved


def _oldest_or_none(spool: Spool, directory: Path) -> tuple[int, list[Point]] | None:
    try:
        return spool.oldest()
    except Exception as exc:  # a segment that does not decode: left for a person to look at
        log.error("cannot read a spooled batch in %s (%s); left there", directory, exc)
        return None
