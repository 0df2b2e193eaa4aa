"""The capacity-guard tests' fleet: node snapshots and engine readings as the aggregator hands
them to the repair controller (its input), one vLLM replica a serving node, and the controller
on them with the real policy, the given control-plane state and the `none` backend."""

from __future__ import annotations

import time

from gpufleet.protos import telemetry_pb2, vocabulary_pb2
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.backends.none import NoBackend
from gpufleet.repair.controller import Hooks, Rails, RepairController
from gpufleet.repair.model import NodeSnapshot
from gpufleet.repair.outcome import Status
from gpufleet.repair.policy import Policy
from gpufleet.repair.serving import ReplicaReading
from gpufleet.repair.state import RepairState

MODEL = "meta-llama/Llama-3.1-70B-Instruct"
# XID 79 (the GPU fell off the bus) is urgent as shipped; the deferrable case says it may wait.
DEFERRABLE = "[xid.79]\nmay_wait = true\n"


class Fleet:
    """Node snapshots and engine readings as the aggregator would hand them over."""

    def __init__(self, serving: dict[str, float], idle: list[str] = ()) -> None:
        self.kv = dict(serving)  # node -> its one replica's KV-cache usage
        self.snaps = {n: self._snap(n) for n in [*serving, *idle]}

    @staticmethod
    def _snap(node: str) -> NodeSnapshot:
        return NodeSnapshot(
            node,
            "c",
            vocabulary_pb2.LIVENESS_REPORTING,
            0.5,
            "boot-1",
            True,
            8,
            gpus={i: telemetry_pb2.GpuSample(index=i, uuid=f"GPU-{node}-{i}") for i in range(8)},
            sample_time_ns=time.time_ns(),
        )

    def add_replica(self, node: str, kv: float) -> None:
        self.kv[node] = kv
        self.snaps[node] = self._snap(node)

    def snapshots(self, only: set[str] | None) -> list[NodeSnapshot]:
        for snap in self.snaps.values():
            snap.sample_time_ns = time.time_ns()
        return [s for n, s in self.snaps.items() if only is None or n in only]

    def readings(self) -> list[ReplicaReading]:
        return [
            ReplicaReading(
                node, "c", "vllm", MODEL, 8000, (0, 1), kv_cache_usage_ratio=kv, requests_running=20
            )
            for node, kv in self.kv.items()
        ]

    def xid(self, node: str, gpu: int = 0, xid: int = 79) -> None:
        self.snaps[node].events.append(
            telemetry_pb2.Event(
                kind=vocabulary_pb2.EVENT_KIND_XID,
                source=vocabulary_pb2.EVENT_SOURCE_NVML,
                time_unix_ns=time.time_ns(),
                gpu_index=gpu,
                xid=xid,
            )
        )


def controller(state: RepairState, fleet: Fleet, policy: Policy) -> RepairController:
    return RepairController(
        policy,
        state,
        NoBackend(),
        Rails(max_out_of_service_fraction=1),
        Hooks(),
        AlertDispatcher([], store=state.kept),
        fleet.snapshots,
        lambda node, command: False,
        serving=fleet.readings,
    )


def drains_started(state: RepairState, node: str) -> int:
    return sum(1 for a in state.audit_log(node) if a.action == "drain" and a.outcome.status is Status.STARTED)
