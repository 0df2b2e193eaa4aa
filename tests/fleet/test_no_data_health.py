"""A node is "healthy" only by its reports: one that has never had a report accepted reads no_data
(the CLI's and --json's health, the dashboard's "no data"), whatever it sent before or since —
property-tested over whole histories of Hellos and reports into the real live view, through the
Fleet API's health (aggregator/api/repair_view.py) and every surface's rendering of it."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.aggregator.api.repair_view import RepairView
from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.client.present import node_row
from gpufleet.dashboard.data import display_state
from gpufleet.protos import ingest_pb2, telemetry_pb2, vocabulary_pb2
from gpufleet.protos.names import health_name

NODES = ["n1", "n2", "n3"]

# One step of a history: a Hello of a node (with this many GPUs), or a report of a node accepted
# (with GPU samples or without: an events-only report is a report too).
steps_st = st.lists(
    st.one_of(
        st.tuples(st.just("hello"), st.sampled_from(NODES), st.integers(0, 8)),
        st.tuples(st.just("report"), st.sampled_from(NODES), st.integers(0, 8)),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(steps_st)
def test_no_node_without_an_accepted_report_reads_healthy_on_any_surface(
    steps: list[tuple[str, str, int]],
) -> None:
    fleet = FleetState()
    now = time.time_ns()
    seq = 0
    reported: set[str] = set()
    for kind, node, gpus in steps:
        now += 10**9
        if kind == "hello":
            hello = ingest_pb2.Hello(
                node=node, cluster="c", boot_id="b", interval_s=1.0,
                gpus=[telemetry_pb2.GpuIdentity(index=i) for i in range(gpus)],
            )  # fmt: skip
            fleet.on_hello(hello, now)
        else:
            seq += 1
            report = telemetry_pb2.NodeReport(node=node, cluster="c", boot_id="b", seq=seq, time_unix_ns=now)
            for i in range(gpus):
                report.gpus.add(index=i, util_gpu_pct=50.0)
            fleet.on_report(report, now)
            reported.add(node)
    view = RepairView(None, None)
    for live in fleet.nodes.values():
        summary = view.with_health(fleet.summary(live, now))
        cli = node_row(summary)["health"]
        screen = display_state(summary)
        if live.node in reported:
            assert summary.health == vocabulary_pb2.NODE_HEALTH_HEALTHY, live.node
            assert cli == "healthy"
        else:
            assert summary.health == vocabulary_pb2.NODE_HEALTH_NO_DATA, live.node
            assert cli == health_name(vocabulary_pb2.NODE_HEALTH_NO_DATA) == "no_data"
            assert screen in ("no data", "silent"), screen
        assert (screen == "healthy") == (
            live.node in reported and summary.liveness != vocabulary_pb2.LIVENESS_SILENT
        )
