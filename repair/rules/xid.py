"""XIDs: each XID event on a GPU becomes the finding the policy gives it, with the multi-XID
workflows (48 with 63/64) applied over the XIDs seen on the same GPU."""

from __future__ import annotations

from gpufleet.protos import telemetry_pb2, vocabulary_pb2
from gpufleet.protos.names import event_source_name
from gpufleet.repair.model import Finding, NodeSnapshot
from gpufleet.repair.policy import Entry, Policy
from gpufleet.repair.rules.base import Rule


class Xid(Rule):
    name = "xid"

    def evaluate(self, snap: NodeSnapshot, entry: Entry, policy: Policy, now_ns: int) -> list[Finding]:
        lookback_ns = int(policy.workflow["xid_lookback_s"] * 1e9)
        events = [
            e
            for e in snap.events
            if e.kind == vocabulary_pb2.EVENT_KIND_XID and now_ns - e.time_unix_ns <= lookback_ns
        ]
        within_ns = max((wf.within_s for wf in policy.workflows), default=0.0) * 1e9
        found: dict[tuple[int | None, int], Finding] = {}
        for event in events:
            gpu = _gpu(event)
            near = {
                other.xid
                for other in events
                if other is not event
                and _gpu(other) == gpu
                and abs(other.time_unix_ns - event.time_unix_ns) <= within_ns
            }
            xid_entry, _why = policy.xid_entry(event.xid, near)
            source = event_source_name(event.source)
            evidence = f"XID {event.xid} from {source}"
            message = event.message.strip().splitlines()[0][:200] if event.message.strip() else ""
            if message:
                evidence += f": {message}"
            finding = xid_entry.finding(snap.node, gpu, f"xid_{event.xid}", evidence, event.time_unix_ns)
            key = (gpu, event.xid)
            if key not in found or found[key].seen_ns < finding.seen_ns:
                found[key] = finding  # the newest occurrence of each XID per GPU
        return list(found.values())


def _gpu(event: telemetry_pb2.Event) -> int | None:
    return event.gpu_index if event.HasField("gpu_index") else None
