"""The live view works out each node's liveness incrementally (aggregator/fleet/state.py
liveness_by_node: only the nodes heard while not reporting, or whose next threshold came): a
property over whole sequences of hellos, reports (some with another interval) and clock steps
that the answer is always every node's liveness worked out from scratch."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.aggregator.fleet.state import FleetState
from gpufleet.protos import ingest_pb2, telemetry_pb2

S = 1_000_000_000
NODES = [f"n{i}" for i in range(5)]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("wait"), st.integers(0, 40 * S)),
        st.tuples(st.just("report"), st.sampled_from(NODES), st.sampled_from([0.0, 0.5, 1.0, 5.0])),
        st.tuples(st.just("hello"), st.sampled_from(NODES), st.sampled_from([0.5, 1.0, 5.0])),
        st.tuples(st.just("read")),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(steps=steps)
def test_liveness_worked_out_incrementally_is_always_the_liveness_from_scratch(steps: list) -> None:
    fleet = FleetState(stale_after_intervals=3.0, silent_after_intervals=10.0)
    now, seq = 1_800_000_000 * S, 0
    for step in steps:
        if step[0] == "wait":
            now += step[1]
        elif step[0] == "report":
            seq += 1
            fleet.on_report(
                telemetry_pb2.NodeReport(node=step[1], seq=seq, time_unix_ns=now, interval_s=step[2]), now
            )
        elif step[0] == "hello":
            fleet.on_hello(ingest_pb2.Hello(node=step[1], interval_s=step[2]), now)
        got = fleet.liveness_by_node(now)
        assert got == {n: fleet.liveness(live, now) for n, live in fleet.nodes.items()}, (step, now)
