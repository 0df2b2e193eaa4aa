"""The store's own history as a replay's input (docs/architecture.md "Policy replay"): every
event the store holds for the range, each GPU health signal the rules watch or read beside
(and `lost`), and the node's GPU counts (NVML's and the PCI bus's), as an input at each sample
where its value changed. Signals compared across GPUs at every pass (clocks and power, for
gray failure) change at every sample and are not replayed from the store. Read node by node,
so memory holds one node's raw samples at a time; the time this takes grows with nodes x
samples in the range (raw samples, not roll-ups: a roll-up's mean would hide a flag set for
one sample), which is what `replay_max_days` bounds. What the store does not keep is not
replayed: a collector's silence (liveness is live state, not history) and the outcome of a live
GPU reset (the replay takes it from the recorded samples: repair/replay/engine.py)."""

from __future__ import annotations

import time

from gpufleet.aggregator.store.base import Store
from gpufleet.protos import vocabulary_pb2
from gpufleet.protos.names import EVENT_KINDS, EVENT_SOURCES
from gpufleet.repair.replay.history import NODE_SIGNALS, FaultHistory, FaultInput
from gpufleet.repair.replay.report import iso
from gpufleet.repair.rules import CONTEXT_FIELDS, WATCH_FIELDS

SIGNAL_FIELDS = tuple(
    f for f in dict.fromkeys((*WATCH_FIELDS, *CONTEXT_FIELDS, "lost")) if f not in NODE_SIGNALS
)
NODE_FIELDS = tuple(f for f in CONTEXT_FIELDS if f in NODE_SIGNALS)


def history_from_store(store: Store, start_ns: int, end_ns: int, gpus_per_node: int = 8) -> FaultHistory:
    """Blocking (store reads): call from a thread."""
    started = time.perf_counter()
    # The fleet: every node the store knows (its newest collector point: one per node, not one
    # per report over the range), with its GPU count when that point carries one.
    gpu_counts: dict[str, int] = {}
    for p in store.latest("collector"):
        node = p.tags.get("node", "")
        if node:
            gpu_counts[node] = int(p.fields.get("gpu_count", 0) or 0)
    inputs: list[FaultInput] = []
    for p in store.query_points("event", start_ns, end_ns):
        gpu = p.tags.get("gpu")
        kind = EVENT_KINDS.get(p.tags.get("kind", ""), 0)
        inputs.append(
            FaultInput(
                p.time_unix_ns,
                p.tags.get("node", ""),
                int(gpu) if gpu is not None and gpu.isdigit() else None,
                xid=int(p.fields.get("xid", 0)) if kind == vocabulary_pb2.EVENT_KIND_XID else 0,
                message=str(p.fields.get("message", "")),
                count=max(1, int(p.fields.get("count", 1))),
                kind=kind,
                source=EVENT_SOURCES.get(p.tags.get("source", ""), 0),
            )
        )
    for node in sorted(gpu_counts):
        inputs += _node_inputs(store, node, start_ns, end_ns)
        last: dict[tuple[int, str], object] = {}
        for p in store.query_points("gpu", start_ns, end_ns, {"node": [node]}):
            gpu_tag = p.tags.get("gpu", "")
            if not gpu_tag.isdigit():
                continue
            gpu = int(gpu_tag)
            for name in SIGNAL_FIELDS:
                value = p.fields.get(name)
                if value is None or isinstance(value, str) or last.get((gpu, name)) == value:
                    continue
                if (gpu, name) not in last and not value:
                    last[(gpu, name)] = value  # a clean first value is where a GPU starts anyway
                    continue
                last[(gpu, name)] = value
                inputs.append(FaultInput(p.time_unix_ns, node, gpu, signal=name, value=float(value)))
    read_s = time.perf_counter() - started
    history = FaultHistory.of(
        inputs,
        f"the store's history {iso(start_ns)} .. {iso(end_ns)} (read in {read_s:.1f} s)",
        0,
        gpus_per_node,
        start_ns,
        end_ns,
    )
    history.nodes = sorted(set(history.nodes) | set(gpu_counts))
    history.gpus_by_node = {n: c for n, c in gpu_counts.items() if c}
    return history


def _node_inputs(store: Store, node: str, start_ns: int, end_ns: int) -> list[FaultInput]:
    """The node's GPU counts (NVML's, the PCI bus's) at first sight and where they changed."""
    out: list[FaultInput] = []
    last: dict[str, object] = {}
    for p in store.query_points("collector", start_ns, end_ns, {"node": [node]}):
        for name in NODE_FIELDS:
            value = p.fields.get(name)  # an event-only report carries no GPU count
            if value is None or isinstance(value, str) or last.get(name) == value:
                continue
            last[name] = value
            out.append(FaultInput(p.time_unix_ns, node, None, signal=name, value=float(value)))
    return out
