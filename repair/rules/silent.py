"""A collector gone silent."""

from __future__ import annotations

from gpufleet.protos import vocabulary_pb2
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.policy import Entry, Policy
from gpufleet.repair.rules.base import Rule


class CollectorSilent(Rule):
    name = "collector_silent"

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        if snap.liveness != vocabulary_pb2.LIVENESS_SILENT:
            return []
        seen_ns = now_ns - int(snap.seconds_since_report * 1e9)
        return [
            entry.finding(
                snap.node, None, self.name, f"no report for {snap.seconds_since_report:.0f} s", seen_ns
            )
        ]
