"""What one node can put on the Fleet API's answers (issue: "one node's credential still costs
everyone"), written as the attack against a real aggregator on loopback: a node sends the
largest Hello and reports the wire rules allow (every string and repeated field at its bound:
tests/harness/maximal.py), then floods maximal events; every answer a person reads it through
(ListNodes, GetNode, QueryEvents, `gpufleet nodes|node|events`, the dashboard's overview and
node page) stays under the 4 MiB a client takes, its entry on a ListNodes page under the
per-node cap, with what was left out said, and the other nodes still listed beside it."""

from __future__ import annotations

import subprocess

import pytest

from gpufleet.aggregator.api.answers import ANSWER_BYTES, NODE_DETAIL_BYTES, NODE_SUMMARY_BYTES
from gpufleet.protos import fleet_pb2
from harness.maximal import events_report, maximal_hello, maximal_report, node_name
from harness.processes import Cluster, gpufleet_argv
from harness.streams import RawStream, hello, report

CLIENT_LIMIT = 4 << 20  # what a gRPC client takes by default
CLUSTER, BOOT = "c" * 253, "b" * 64


def _acked(s: RawStream, msg: object, seq: int) -> None:
    """Sent and acknowledged (the repair commands its readings bring are let be)."""
    s.send(msg)
    got = s.recv(60)
    while got.WhichOneof("body") == "command":
        got = s.recv(60)
    assert got.WhichOneof("body") == "ack" and list(got.ack.seqs) == [seq], got


def test_a_node_filling_every_field_to_its_bound_stays_within_its_share_of_every_answer(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    agg = cluster.aggregator("aggregator", 0, 0, None)
    honest = RawStream(agg.ingest, cluster.secrets.collector_token("honest-node"))
    honest.send(hello("honest-node"))
    assert honest.recv().WhichOneof("body") == "welcome"
    _acked(honest, report("honest-node", 1), 1)

    node = node_name()
    s = RawStream(agg.ingest, cluster.secrets.collector_token(node))
    s.send(maximal_hello(node, CLUSTER, BOOT))
    assert s.recv().WhichOneof("body") == "welcome"
    first = maximal_report(node, CLUSTER, BOOT, 1, events=100)
    assert 1_000_000 > first.ByteSize() > 700_000
    _acked(s, first, 1)
    for seq in range(2, 8):  # 1,300 maximal events: over the default QueryEvents limit of 1,000
        flood = events_report(node, CLUSTER, BOOT, seq, 200, first=seq * 1000)
        _acked(s, flood, seq)
    newest = flood.report.events[-1].kmsg_seq

    viewer = cluster.secrets.metadata()
    stub = agg.fleet_stub()
    page = stub.ListNodes(fleet_pb2.ListNodesRequest(), metadata=viewer)
    assert [n.node for n in page.nodes] == ["honest-node", node], "every node listed, one page"
    entry = page.nodes[1]
    print(
        f"ListNodes: {page.ByteSize():,} bytes; the maximal node's entry {entry.ByteSize():,} "
        f"({entry.clipped_bytes:,} left out, {len(entry.engines)} of 64 engines kept)"
    )
    assert entry.ByteSize() <= NODE_SUMMARY_BYTES and entry.clipped_bytes > 0
    assert len(entry.gpus) == 64 and entry.gpus[63].util_gpu_pct == 100.0, "its GPUs are kept"
    assert page.nodes[0].clipped_bytes == 0 and len(page.nodes[0].gpus) == 8

    detail = stub.GetNode(fleet_pb2.GetNodeRequest(node=node), metadata=viewer)
    print(
        f"GetNode: {detail.ByteSize():,} bytes ({detail.clipped_bytes:,} left out), "
        f"{len(detail.recent_events)} of 100 recent events kept"
    )
    assert detail.ByteSize() <= NODE_DETAIL_BYTES < CLIENT_LIMIT and detail.clipped_bytes > 0
    assert len(detail.engines) == 64 and len(detail.summary.gpus[0].processes) == 64
    assert detail.recent_events and detail.recent_events[-1].kmsg_seq == newest, "the newest kept"

    events = stub.QueryEvents(fleet_pb2.EventsRequest(), metadata=viewer)
    print(f"QueryEvents: {events.ByteSize():,} bytes, {len(events.events)} events")
    assert events.ByteSize() <= ANSWER_BYTES + 4096 and events.truncated
    xids = [e.time_unix_ns for e in events.events if e.kind == "xid"]
    # The store keeps events of one instant apart by a nanosecond each.
    assert max(xids) >= flood.report.time_unix_ns, "the newest events are the ones kept"

    viewer_token = cluster.secrets.tokens["viewer"]
    said = {}
    for command in ("nodes", "node", "events"):
        argv = [command, node] if command == "node" else [command]
        out = subprocess.run(
            gpufleet_argv(*argv, "--fleet", agg.fleet, "--token", viewer_token),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, (argv, out.stderr)
        said[command] = out.stdout
    assert "honest-node" in said["nodes"]
    cut = "cut to the per-node cap of an answer (engine details first; `gpufleet node NAME` shows more)"
    assert f"{cut}: {node}" in said["nodes"]
    assert "bytes of this node's answer were left out" in said["node"]
    assert "only the newest" in said["events"] and "what fits one answer" in said["events"]

    pytest.importorskip("streamlit")
    from harness.dashboard import app

    at = app(monkeypatch, agg.fleet, viewer_token).run()
    assert not at.exception, at.exception
    assert set(at.dataframe[0].value["node"]) == {"honest-node", node}
    at.sidebar.radio[0].set_value("Node").run()
    at.selectbox[0].set_value(node).run()
    assert not at.exception, at.exception
    assert len(at.dataframe[0].value) == 64, "the node page lists its 64 GPUs"
    assert any("bytes of this node's answer were left out" in c.value for c in at.caption)
    s.close()
    honest.close()
