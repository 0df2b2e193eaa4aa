"""The collector's /healthz and /ready (served beside /metrics).

/healthz (liveness) says whether the sampling loop still ticks: it does not fail because one
GPU's NVML call hangs, since that call cannot hold the loop (collector/sources/deadline.py) —
restarting the collector would not unstick the driver and would hide the fault (the opposite
of what a liveness kill of a health monitor does). /ready says whether reports reach an
aggregator, and names every GPU reported driver_unresponsive and the call it is stuck in.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from gpufleet.collector.sources.nvml_start import NvmlNotAnswering

if TYPE_CHECKING:
    from gpufleet.collector.agent import CollectorAgent

Answer = tuple[int, str, bytes]
_JSON = "application/json"
# The sampling loop is dead when it has not finished a tick for this many intervals (and at
# least this long past the call deadline, which one tick may wait).
_STALLED_INTERVALS = 5.0


def _answer(ok: bool, body: dict[str, object]) -> Answer:
    body["status"] = "ok" if ok else "failing"
    return (200 if ok else 503), _JSON, json.dumps(body, sort_keys=True).encode() + b"\n"


def _hung(agent: CollectorAgent) -> list[dict[str, object]]:
    return [
        {"gpu": u.index, "nvml_call": u.call, "waited_s": round(u.waited_s, 1)}
        for u in agent.sampler.unresponsive
    ]


def healthz(agent: CollectorAgent) -> Answer:
    c = agent.config
    since_s = time.monotonic() - agent.last_tick_s
    allowed_s = _STALLED_INTERVALS * c.interval_s + c.nvml_deadline_s
    body: dict[str, object] = {"last_tick_s_ago": round(since_s, 3), "driver_unresponsive": _hung(agent)}
    if since_s > allowed_s:
        body["why"] = f"the sampling loop has not ticked for {since_s:.1f} s (allowed {allowed_s:.1f} s)"
    return _answer(since_s <= allowed_s, body)


def ready(agent: CollectorAgent) -> Answer:
    code, _, _ = healthz(agent)
    hung = _hung(agent)
    body: dict[str, object] = {
        "connected": agent.stream.connected.is_set(),
        "aggregator": agent.stream.aggregator,
        "unacked_reports": len(agent.book.buffer),
        "driver_unresponsive": hung,
    }
    why = []
    if code != 200:
        why.append("the sampling loop is stalled")
    if not agent.stream.connected.is_set():
        why.append(f"not connected to aggregator {agent.stream.aggregator}")
    if hung:
        # Still ready: the hang is reported (and repaired) through the aggregator.
        body["note"] = "; ".join(
            f"GPU {h['gpu']} driver unresponsive for {h['waited_s']} s in {h['nvml_call']}" for h in hung
        )
    if isinstance(agent.source, NvmlNotAnswering):
        # Ready too: the node is reported (no GPUs from NVML beside its PCI bus's) and repaired
        # through the aggregator; a restart would meet the same stuck driver.
        body["nvml_start_waited_s"] = round(agent.source.waited_s, 1)
        body["note"] = "; ".join(
            filter(
                None,
                [
                    str(body.get("note", "")),
                    f"NVML has not answered its start for {agent.source.waited_s:.0f} s",
                ],
            )
        )
    if why:
        body["why"] = "; ".join(why)
    return _answer(not why, body)
