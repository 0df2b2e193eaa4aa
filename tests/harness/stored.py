"""What the aggregator stored, read from outside it: the embedded store read-only (SQLite WAL:
a reader never blocks the writer) and InfluxDB over its HTTP API."""

from __future__ import annotations

import json
import sqlite3
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple


class StoredPoint(NamedTuple):
    tags: dict[str, str]
    fields: dict[str, Any]
    time_unix_ns: int


def read_points(
    data_dir: Path, measurement: str, start_ns: int = 0, end_ns: int = 2**63 - 1
) -> list[StoredPoint]:
    """The points of one measurement in an aggregator's embedded store, oldest first: its table
    and, merged over it as a settle would (aggregator/store/embedded.py), the rows still staged
    in the staging file beside it."""
    db = sqlite3.connect(f"file:{Path(data_dir) / 'store.sqlite3'}?mode=ro", uri=True)
    try:
        staged = Path(data_dir) / "store.staged.sqlite3"
        if staged.exists():
            db.execute("ATTACH DATABASE ? AS staged", (f"file:{staged}?mode=ro",))
        merged: dict[tuple[int, int], tuple[str, dict[str, Any]]] = {}
        for schema, table, order in (
            ("main", f"m_{measurement}", "t.ts"),
            ("staged", f"r_{measurement}", "t.rowid"),
        ):
            if schema == "staged" and not staged.exists():
                continue
            if not db.execute(f"SELECT 1 FROM {schema}.sqlite_master WHERE name = ?", (table,)).fetchone():
                continue
            cur = db.execute(
                f'SELECT s.tags, t.* FROM {schema}."{table}" t JOIN main.series s ON s.id = t.series_id '
                f"WHERE t.ts >= ? AND t.ts < ? ORDER BY {order}",
                (start_ns, end_ns),
            )
            names = [d[0] for d in cur.description]
            for row in cur.fetchall():
                fields = {n: v for n, v in zip(names[3:], row[3:], strict=True) if v is not None}
                key = (row[1], row[2])
                if key in merged:
                    merged[key][1].update(fields)
                else:
                    merged[key] = (row[0], fields)
        return [
            StoredPoint(dict(tuple(pair) for pair in json.loads(tags)), fields, ts)
            for (_, ts), (tags, fields) in sorted(merged.items(), key=lambda kv: kv[0][1])
        ]
    finally:
        db.close()


def stored_seqs(data_dir: Path, nodes: Iterable[str]) -> dict[str, list[int]]:
    """Each of these nodes' stored report seqs (the collector measurement), sorted, repeats
    kept: a node that stored nothing has an empty list."""
    seqs: dict[str, list[int]] = {n: [] for n in nodes}
    for p in read_points(data_dir, "collector"):
        if p.tags["node"] in seqs:
            seqs[p.tags["node"]].append(int(p.fields["seq"]))
    return {n: sorted(s) for n, s in seqs.items()}


def influx_seqs(influx_url: str, database: str) -> dict[tuple[str, str], list[int]]:
    """(node, boot id) → every seq stored in the collector measurement, as InfluxDB returns them."""
    query = urllib.parse.urlencode({"db": database, "q": 'SELECT "seq", "boot_id", "node" FROM "collector"'})
    body = json.loads(urllib.request.urlopen(f"{influx_url}/query?{query}", timeout=30).read())
    out: dict[tuple[str, str], list[int]] = {}
    for series in body["results"][0].get("series", []):
        cols = series["columns"]
        for row in series["values"]:
            r = dict(zip(cols, row, strict=True))
            out.setdefault((r["node"], r["boot_id"]), []).append(int(r["seq"]))
    return out
