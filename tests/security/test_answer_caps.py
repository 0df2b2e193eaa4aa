"""One node's share of an answer (aggregator/api/answers.py), property-tested over whole
entries: whatever a node's GPUs, processes, engines and events (counts and text far past the
wire rules' bounds), its ListNodes entry and its GetNode answer end at most at their caps,
say exactly how many bytes were left out, keep what identifies the node, and leave an entry
already under its cap untouched; a listed answer never passes ANSWER_BYTES."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.aggregator.api.answers import (
    ANSWER_BYTES,
    CLIENT_RECEIVE_BYTES,
    NODE_DETAIL_BYTES,
    NODE_SUMMARY_BYTES,
    AnswerBytes,
    clip_detail,
    clip_summary,
)
from gpufleet.protos import fleet_pb2, telemetry_pb2

TEXT = st.integers(0, 9000)


@st.composite
def summaries(draw: st.DrawFn) -> fleet_pb2.NodeSummary:
    s = fleet_pb2.NodeSummary(node="n" * draw(st.integers(1, 253)), cluster="c", health_detail="why")
    for i in range(draw(st.integers(0, 80))):
        gpu = s.gpus.add(index=i, uuid="u" * draw(st.integers(0, 96)), model="m" * draw(st.integers(0, 128)))
        gpu.util_gpu_pct = 50.0
        processes = draw(st.integers(0, 300))
        gpu.processes.extend(telemetry_pb2.GpuProcess(pid=p, used_memory_bytes=1) for p in range(processes))
    for i in range(draw(st.integers(0, 80))):
        endpoint, reason = "e" * draw(TEXT), "r" * draw(TEXT)
        s.engines.add(engine="vllm", port=i, endpoint=endpoint, unreadable_reason=reason, model="m" * 253)
    s.gpu_count = len(s.gpus)
    return s


@st.composite
def details(draw: st.DrawFn) -> fleet_pb2.NodeDetail:
    summary = draw(summaries())
    d = fleet_pb2.NodeDetail(summary=summary, engines=summary.engines)
    for i in range(draw(st.integers(0, 150))):
        d.recent_events.add(kmsg_seq=i, message="x" * draw(st.integers(0, 4096)))
    return d


@settings(max_examples=60, deadline=None)
@given(summaries())
def test_a_nodes_entry_on_a_page_is_at_most_its_cap_and_says_what_was_left_out(
    s: fleet_pb2.NodeSummary,
) -> None:
    before = s.ByteSize()
    original = fleet_pb2.NodeSummary()
    original.CopyFrom(s)
    clipped = clip_summary(s)
    assert clipped.ByteSize() <= NODE_SUMMARY_BYTES
    if before <= NODE_SUMMARY_BYTES:
        assert clipped == original, "an entry under its cap is untouched"
    else:
        # clipped_bytes itself takes a few bytes of the entry: what it says is what was removed.
        assert clipped.clipped_bytes == before - (clipped.ByteSize() - _field_bytes(clipped.clipped_bytes))
        assert clipped.node == original.node and clipped.gpu_count == original.gpu_count
        kept_gpus = [g.index for g in clipped.gpus]
        assert kept_gpus == list(range(len(kept_gpus))), "GPUs leave from the last"
        if clipped.engines:
            assert not any(g.processes for g in clipped.gpus), "process lists leave before engines"


@settings(max_examples=60, deadline=None)
@given(details())
def test_a_nodes_getnode_answer_is_at_most_its_cap_keeping_the_newest_events(d: fleet_pb2.NodeDetail) -> None:
    before = d.ByteSize()
    newest = d.recent_events[-1].kmsg_seq if d.recent_events else None
    clipped = clip_detail(d)
    assert clipped.ByteSize() <= NODE_DETAIL_BYTES < CLIENT_RECEIVE_BYTES
    if before > NODE_DETAIL_BYTES:
        assert clipped.clipped_bytes > 0
        if clipped.recent_events:
            assert clipped.recent_events[-1].kmsg_seq == newest, "the oldest events leave first"
    else:
        assert clipped.clipped_bytes == 0


@settings(max_examples=30, deadline=None)
@given(st.lists(summaries(), min_size=1, max_size=60))
def test_a_page_of_clipped_entries_stays_under_the_answer_cap(entries: list[fleet_pb2.NodeSummary]) -> None:
    page, answer = AnswerBytes(), fleet_pb2.ListNodesResponse()
    for entry in entries:
        entry = clip_summary(entry)
        if not page.fits(entry):
            break
        answer.nodes.append(entry)
    assert answer.nodes, "a page always holds at least one node"
    assert answer.ByteSize() <= ANSWER_BYTES


def _field_bytes(value: int) -> int:
    """A uint32 field's bytes on the wire: its tag (2 bytes for field 23) and its varint."""
    return 2 + max(1, (value.bit_length() + 6) // 7)
