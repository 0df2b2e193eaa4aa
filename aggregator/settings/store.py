"""The history store: which one (its own settings, InfluxDB's connection, are the store's:
aggregator/store/__init__.py), the spool that rides out its outages, and how long history and
its roll-ups are kept."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.aggregator.settings import require, setting
from gpufleet.aggregator.store import STORES


@dataclass
class StoreSettings:
    store: str = setting("embedded", f"history store: {STORES.described()}")
    spool_max_bytes: int = setting(
        1 << 30, "on-disk spool for batches the store cannot take; at this size acknowledgements stop"
    )
    spool_warn_ratio: float = setting(0.8, "the spool reports itself near its limit past this fraction")
    retention_s: float = setting(14 * 86400.0, "how long raw history is kept, in seconds")
    rollup_interval_s: float = setting(
        60.0,
        "seconds between roll-up passes; every 10th recomputes every series' trailing window (15 min of "
        "the 1-minute tier, 3 h of the hourly: late data within them is rolled up then), the others "
        "the last 3 min and each hour once it completes",
    )
    rollup_1m_retention_s: float = setting(
        90 * 86400.0, "how long 1-minute roll-ups are kept (InfluxDB: retention policy gpufleet_1m)"
    )
    rollup_1h_retention_s: float = setting(
        730 * 86400.0, "how long 1-hour roll-ups are kept (InfluxDB: retention policy gpufleet_1h)"
    )

    def check_store(self) -> None:
        require(self.store in STORES, f"store={self.store!r}: use one of {STORES.described()}")
        require(
            self.retention_s >= 3600, f"retention_s={self.retention_s:g} must be at least 3600 (one hour)"
        )
        require(
            10 <= self.rollup_interval_s <= 840,
            f"rollup_interval_s={self.rollup_interval_s:g} must be between 10 and 840 (the 1-minute tier "
            "looks back 15 minutes: a pass less often leaves some of its buckets unwritten)",
        )
        require(
            self.spool_max_bytes >= 1 << 20, f"spool_max_bytes={self.spool_max_bytes} must be at least 1 MiB"
        )
        require(
            0 < self.spool_warn_ratio < 1, f"spool_warn_ratio={self.spool_warn_ratio} must be between 0 and 1"
        )
