"""The collector's XID folding over whole sequences of XIDs (hypothesis): every occurrence is
in some event's count, a key's first XID (or one after a quiet window) is never held back, and
a storm is at most one event per key per flush."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.collector.sources.kmsg_parse import record_position
from gpufleet.collector.xid_fold import XidFolder
from gpufleet.protos import telemetry_pb2, vocabulary_pb2

WINDOW_S = 5.0
steps = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 3), st.sampled_from([13, 79, 94, 95]), st.integers(0, 8 * 10**9)),
        st.just("flush"),
    ),
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_folded_counts_add_up_and_new_xids_go_at_once(seq: list) -> None:
    folder = XidFolder(WINDOW_S)
    t = 1_700_000_000 * 10**9
    offered: dict[tuple[int, int], int] = {}
    counted: dict[tuple[int, int], int] = {}
    last_seen: dict[tuple[int, int], int] = {}
    pending: set[tuple[int, int]] = set()
    flushes = 0
    sent_per_key: dict[tuple[int, int], int] = {}
    at_once: dict[tuple[int, int], int] = {}
    for step in seq:
        if step == "flush":
            flushes += 1
            for event in folder.flush():
                key = (event.gpu_index, event.xid)
                assert event.first_time_unix_ns <= event.time_unix_ns
                counted[key] = counted.get(key, 0) + event.count
                sent_per_key[key] = sent_per_key.get(key, 0) + 1
            pending.clear()
            continue
        gpu, xid, dt = step
        t += dt
        key = (gpu, xid)
        event = telemetry_pb2.Event(
            kind=vocabulary_pb2.EVENT_KIND_XID,
            source=vocabulary_pb2.EVENT_SOURCE_KMSG,
            time_unix_ns=t,
            gpu_index=gpu,
            xid=xid,
        )
        offered[key] = offered.get(key, 0) + 1
        quiet = key not in last_seen or (key not in pending and t - last_seen[key] > WINDOW_S * 1e9)
        sent = folder.offer(event)
        assert sent == quiet, f"XID {xid} on GPU {gpu}: sent={sent}, expected {quiet}"
        if sent:
            at_once[key] = at_once.get(key, 0) + 1
            counted[key] = counted.get(key, 0) + 1
            sent_per_key[key] = sent_per_key.get(key, 0) + 1
        else:
            pending.add(key)
        last_seen[key] = max(last_seen.get(key, 0), t)
    for event in folder.flush():
        key = (event.gpu_index, event.xid)
        counted[key] = counted.get(key, 0) + event.count
        sent_per_key[key] = sent_per_key.get(key, 0) + 1
    assert counted == offered, "every XID offered is in exactly one event's count"
    assert folder.folded_total == sum(offered.values()) - sum(at_once.values())
    for key, n in sent_per_key.items():
        # A storm costs at most one event per flush, beyond those sent at once after quiet.
        assert n - at_once.get(key, 0) <= flushes + 1


@given(st.text(max_size=200))
def test_any_kernel_log_line_has_a_position_or_none(line: str) -> None:
    seq, usec = record_position(line)
    assert seq >= 0 and (usec is None or usec >= 0)
    if ";" not in line:
        assert (seq, usec) == (0, None)
