"""The reports of one collector boot: numbered (boot id, seq 1, 2, 3, ...), held in the replay
buffer until acknowledged, and what they say over time: the XIDs sent, counted for /metrics, and
the oldest kernel-log record in each unacknowledged report (what the kernel-log cursor may not
pass: collector/kmsg_cursor.py)."""

from __future__ import annotations

import uuid

from gpufleet.collector.config import CollectorConfig
from gpufleet.collector.replay_buffer import ReplayBuffer
from gpufleet.protos import telemetry_pb2, vocabulary_pb2


class ReportBook:
    def __init__(self, config: CollectorConfig) -> None:
        self._config = config
        self.boot_id = uuid.uuid4().hex
        self.seq = 0
        self.buffer = ReplayBuffer(config.buffer_reports)
        # XIDs reported since start, by (GPU, number), for /metrics (collector/metrics_endpoint.py).
        self.xid_counts: dict[tuple[str, int], int] = {}
        # The last XID number of each GPU (its index as text), for the DCGM face's
        # DCGM_FI_DEV_XID_ERRORS (collector/dcgm_face.py): swapped in whole with the counts.
        self.xid_last: dict[str, int] = {}
        # Kernel-log records handed on by the watcher and not yet in a report (added from its
        # thread), and the oldest record in each unacknowledged report, by seq.
        self.kmsg_inflight: set[int] = set()
        self.kmsg_unacked: dict[int, int] = {}

    def new(
        self, time_ns: int, stats: telemetry_pb2.CollectorStats, **parts: object
    ) -> telemetry_pb2.NodeReport:
        """The next report of this boot (seq + 1), with parts, held for sending until acked."""
        self.seq += 1
        c = self._config
        report = telemetry_pb2.NodeReport(
            node=c.node,
            cluster=c.cluster,
            boot_id=self.boot_id,
            seq=self.seq,
            time_unix_ns=time_ns,
            interval_s=c.interval_s,
            stats=stats,
            **parts,
        )
        xids = [e for e in report.events if e.kind == vocabulary_pb2.EVENT_KIND_XID]
        if xids:
            # A new dict, swapped in whole: /metrics reads it from its own thread.
            counts, last = dict(self.xid_counts), dict(self.xid_last)
            for e in sorted(xids, key=lambda e: e.time_unix_ns):
                key = (str(e.gpu_index) if e.HasField("gpu_index") else "", e.xid)
                counts[key] = counts.get(key, 0) + max(1, e.count)
                if e.HasField("gpu_index"):
                    last[str(e.gpu_index)] = e.xid
            self.xid_counts, self.xid_last = counts, last
        kmsg_seqs = [e.kmsg_seq for e in report.events if e.kmsg_seq]
        if kmsg_seqs:
            self.kmsg_unacked[report.seq] = min(kmsg_seqs)
        self.buffer.add(report)
        return report

    def take_carried(self, carried: list[telemetry_pb2.NodeReport]) -> None:
        """Reports a previous run left unacknowledged, numbered into this boot, to go first."""
        for report in carried:
            self.seq += 1
            report.boot_id, report.seq = self.boot_id, self.seq
            self.buffer.add(report)
