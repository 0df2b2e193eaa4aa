"""What one enrolled node may cost the aggregator (docs/security.md "Bounded per-node state").

A node's credential proves only that it is that node; what it sends is still hostile input.
Each node has, across all its streams:

- a **report rate** and a **byte rate** (token buckets). A node over either is slowed, not
  refused: its stream is not read until the bucket allows the next report, so gRPC's flow
  control pushes back on that node alone. The bursts cover a collector replaying its whole
  buffer after an outage; the rates are many times what a collector sends.
- a cap on its **distinct series** in the store (GPU: index, uuid, model, cluster; engine:
  engine, model, port, pool, cluster) seen within `series_window_s`: a Hello or report that would
  take a node past it is refused with RESOURCE_EXHAUSTED naming the cap, so a node cannot grow
  the store's series (and the memory behind them) without end by renaming its engines or GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

SeriesKey = tuple[object, ...]


@dataclass
class TokenBucket:
    """rate tokens a second, at most burst saved up. take() spends and says how long the caller
    must wait before acting (0: at once); spending past empty is a debt paid by waiting."""

    rate: float
    burst: float
    tokens: float = -1.0  # -1: full at first use
    at: float = 0.0

    def take(self, amount: float, now: float) -> float:
        if self.tokens < 0 and self.at == 0.0:
            self.tokens, self.at = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= amount
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


@dataclass(frozen=True)
class BudgetLimits:
    reports_per_s: float = 20.0
    report_burst: int = 4000
    bytes_per_s: float = 256 * 1024
    byte_burst: int = 16 * 1024 * 1024
    max_series: int = 256
    series_window_s: float = 86400.0


@dataclass
class _Node:
    reports: TokenBucket
    bytes: TokenBucket
    series: dict[SeriesKey, float] = field(default_factory=dict)  # key -> last seen (monotonic)
    # What each kind of message last named, and when their times were last refreshed.
    last_keys: dict[str, tuple[tuple[SeriesKey, ...], float]] = field(default_factory=dict)


class NodeBudgets:
    def __init__(self, limits: BudgetLimits) -> None:
        self.limits = limits
        self._nodes: dict[str, _Node] = {}

    def _node(self, node: str) -> _Node:
        budget = self._nodes.get(node)
        if budget is None:
            lim = self.limits
            budget = self._nodes[node] = _Node(
                TokenBucket(lim.reports_per_s, lim.report_burst), TokenBucket(lim.bytes_per_s, lim.byte_burst)
            )
        return budget

    def pace(self, node: str, size_bytes: int, now: float | None = None) -> float:
        """Seconds the node's next report must wait (0: none) to stay within its rates."""
        now = time.monotonic() if now is None else now
        budget = self._node(node)
        return max(budget.reports.take(1, now), budget.bytes.take(size_bytes, now))

    def admit_series(self, node: str, kind: str, keys: Iterable[SeriesKey], now: float | None = None) -> str:
        """Record the series these keys name (kind: which message names them, gpu for a Hello's
        GPUs, engine for a report's engines); why not, when they would take the node past its
        cap ("": admitted). The common case, the same keys as the last message of that kind, is
        one tuple compare (their times are refreshed a few times a window)."""
        keys = tuple(keys)
        budget = self._node(node)
        now = time.monotonic() if now is None else now
        last = budget.last_keys.get(kind)
        if last is not None and last[0] == keys and now - last[1] < self.limits.series_window_s / 8:
            return ""
        series = budget.series
        new = [k for k in keys if k not in series]
        cap = self.limits.max_series
        if len(series) + len(new) > cap:
            oldest = now - self.limits.series_window_s
            for key in [k for k, seen in series.items() if seen < oldest]:
                del series[key]
            if len(series) + len(new) > cap:
                return (
                    f"it would make {len(series) + len(new)} distinct series for this node within "
                    f"{self.limits.series_window_s:g} s (GPUs by index, uuid and model; engines by name, "
                    f"model, port and pool); the cap is {cap} (max_series_per_node)"
                )
        for key in keys:
            series[key] = now
        budget.last_keys[kind] = (keys, now)
        return ""
