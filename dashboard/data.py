"""What the dashboard shows, as pandas frames built from Fleet API answers. Kept apart from
the Streamlit page so it is plain, testable code."""

from __future__ import annotations

import pandas as pd

from gpufleet.cli.sre import liveness_name, node_row
from gpufleet.cli.timeparse import iso
from gpufleet.protos import fleet_pb2

GIB = 1024**3

HEAT_METRICS = {
    "GPU utilization %": "util_gpu_pct",
    "HBM used %": "hbm_used_pct",
    "GPU temperature °C": "temp_gpu_c",
    "Power W": "power_w",
}


def nodes_frame(resp: fleet_pb2.ListNodesResponse) -> pd.DataFrame:
    rows = []
    for n in resp.nodes:
        r = node_row(n)
        rows.append(
            {
                "node": r["node"],
                "cluster": r["cluster"],
                "state": r["liveness"],
                "connected": r["connected"],
                "last report": r["last_report"],
                "seconds since report": r["seconds_since_report"],
                "GPUs": r["gpu_count"],
                "GPUs lost": r["gpus_lost"],
                "util %": r["util_gpu_mean_pct"],
                "HBM used GiB": None if r["hbm_used_bytes"] is None else r["hbm_used_bytes"] / GIB,
                "HBM total GiB": None if r["hbm_total_bytes"] is None else r["hbm_total_bytes"] / GIB,
                "max temp °C": r["temp_gpu_max_c"],
                "power W": r["power_w"],
            }
        )
    return pd.DataFrame(rows)


def gpus_frame(resp: fleet_pb2.ListNodesResponse) -> pd.DataFrame:
    """One row per GPU: the heat map's cells. Absent values stay NaN (shown as gaps)."""
    rows = []
    for n in resp.nodes:
        for g in n.gpus:
            used = g.hbm_used_bytes if g.HasField("hbm_used_bytes") else None
            total = g.hbm_total_bytes if g.HasField("hbm_total_bytes") else None
            rows.append(
                {
                    "node": n.node,
                    "cluster": n.cluster,
                    "state": liveness_name(n.liveness),
                    "gpu": g.index,
                    "model": g.model,
                    "uuid": g.uuid,
                    "lost": g.lost,
                    "util_gpu_pct": g.util_gpu_pct if g.HasField("util_gpu_pct") else None,
                    "hbm_used_pct": 100 * used / total if used is not None and total else None,
                    "temp_gpu_c": g.temp_gpu_c if g.HasField("temp_gpu_c") else None,
                    "power_w": g.power_w if g.HasField("power_w") else None,
                }
            )
    return pd.DataFrame(
        rows, columns=["node", "cluster", "state", "gpu", "model", "uuid", "lost", *HEAT_METRICS.values()]
    )


def history_frame(resp: fleet_pb2.HistoryResponse) -> pd.DataFrame:
    """Long format: time, series label, value, plus every tag as a column (for CSV)."""
    rows = []
    for s in resp.series:
        tags = dict(s.tags)
        label = "/".join(
            filter(
                None, [tags.get("node"), f"gpu{tags['gpu']}" if "gpu" in tags else None, tags.get("engine")]
            )
        )
        for t, v in zip(s.times_unix_ns, s.values, strict=True):
            rows.append({"time": pd.Timestamp(iso(t)), "series": label, resp.metric: v, **tags})
    return pd.DataFrame(rows)


def engines_frame(engines: list) -> pd.DataFrame:
    """One row per engine replica; unreadable ones show why, and absent values stay empty."""

    def value(engine: object, name: str) -> float | None:
        return getattr(engine, name) if engine.HasField(name) else None  # type: ignore[attr-defined]

    return pd.DataFrame(
        [
            {
                "engine": e.engine,
                "model": e.model,
                "port": e.port,
                "GPUs": ",".join(str(i) for i in e.gpu_indices),
                "KV-cache usage": value(e, "kv_cache_usage_ratio"),
                "running": value(e, "requests_running"),
                "waiting": value(e, "requests_waiting"),
                "preemptions": value(e, "preemptions_total"),
                "prefix-cache hit ratio": value(e, "prefix_cache_hit_ratio"),
                "status": "ok" if e.readable else f"unreadable: {e.unreadable_reason}",
            }
            for e in engines
        ]
    )
