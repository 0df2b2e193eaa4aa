"""XID storms and boot catch-up, through real collector and aggregator processes: a storm of
identical kernel-log lines becomes a bounded number of events whose counts add up to every
line, and an XID logged while the collector was stopped is reported exactly once."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from harness.processes import Cluster
from harness.stored import read_points
from harness.waiting import wait_until

# Simulated GPU 4 sits on PCI bus 5c, GPU 2 on 3a (as on an HGX board).
STORM_LINE = "NVRM: Xid (PCI:0000:5c:00): 95, pid=4242, name=python3, Uncontained: SM ECC error\n"
OTHER_LINE = "NVRM: Xid (PCI:0000:3a:00): 94, pid=4243, name=python3, Contained: SM ECC error\n"
STORM_LINES = 100_000
STORM_S = 10.0
CPU_BOUND_S = 5.0  # the collector may use half of one core while 10,000 lines a second arrive


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def xid_events(data_dir: Path, xid: int) -> list:
    return [
        p for p in read_points(data_dir, "event") if p.tags["kind"] == "xid" and p.fields.get("xid") == xid
    ]


@pytest.mark.slow
def test_an_xid_storm_is_folded_into_counts_and_another_xid_is_not_held_back(cluster: Cluster) -> None:
    fifo = cluster.tmp / "kmsg"
    os.mkfifo(fifo)
    agg = cluster.aggregator()
    collector = cluster.collector("storm-node", agg.ingest, "--interval-s", "0.5", "--kmsg-path", str(fifo))
    wait_until(lambda: read_points(agg.data_dir, "gpu"), 20, "the collector's first samples in the store")
    cpu_before = cpu_seconds(collector.popen.pid)
    other_written_ns: list[int] = []

    def write_storm() -> None:
        # 100,000 identical lines over 10 s, in batches of 1,000 every 0.1 s; a different XID
        # on another GPU in the middle of it.
        with open(fifo, "w") as kmsg:
            start = time.monotonic()
            for batch in range(STORM_LINES // 1000):
                kmsg.write(STORM_LINE * 1000)
                if batch == STORM_LINES // 2000:
                    other_written_ns.append(time.time_ns())
                    kmsg.write(OTHER_LINE)
                kmsg.flush()
                pause = start + (batch + 1) * STORM_S / (STORM_LINES // 1000) - time.monotonic()
                if pause > 0:
                    threading.Event().wait(pause)  # pacing the writer, not waiting on a result

    writer = threading.Thread(target=write_storm)
    writer.start()
    try:
        other = wait_until(lambda: xid_events(agg.data_dir, 94), 20, "the XID 94 in the middle of the storm")
        # Read and sent as it came: its time is when the collector read it.
        assert other_written_ns, "the XID 94 was stored before it was written"
        read_after_s = (other[0].time_unix_ns - other_written_ns[0]) / 1e9
        assert read_after_s < 1.0, f"XID 94 was held back {read_after_s:.2f} s behind the storm"
    finally:
        writer.join()
    storm_cpu_s = cpu_seconds(collector.popen.pid) - cpu_before

    def folded() -> list | None:
        got = xid_events(agg.data_dir, 95)
        return got if sum(p.fields["count"] for p in got) >= STORM_LINES else None

    storm = wait_until(folded, 30, "counts adding up to all 100,000 storm lines")
    total = sum(p.fields["count"] for p in storm)
    print(
        f"storm: {STORM_LINES} lines in {STORM_S:g} s -> {len(storm)} events, counts sum {total}; "
        f"collector CPU {storm_cpu_s:.2f} s (bound {CPU_BOUND_S:g} s)"
    )
    assert total == STORM_LINES, f"counts sum to {total}, not the {STORM_LINES} lines written"
    # One event at once, then at most one per sampling tick (0.5 s) while it lasts, plus slack
    # for the tail and a late writer.
    assert len(storm) <= 1 + int(STORM_S / 0.5) + 10, f"{len(storm)} events for one storm"
    assert all(p.tags["gpu"] == "4" for p in storm)
    firsts = [p.fields.get("first_time_unix_ns", p.time_unix_ns) for p in storm]
    assert all(f <= p.time_unix_ns for f, p in zip(firsts, storm, strict=True))
    assert storm_cpu_s < CPU_BOUND_S, (
        f"the collector used {storm_cpu_s:.2f} s of CPU in a {STORM_S:g} s storm"
    )
    assert collector.alive()


def kmsg_record(seq: int, xid: int, bus: str, text: str) -> str:
    """A /dev/kmsg record ("prio,seq,usec,flags;text"), timed a few seconds ago by this
    machine's kernel clock."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000 - 5_000_000 + seq
    return f"3,{seq},{usec},-;NVRM: Xid (PCI:0000:{bus}:00): {xid}, pid={1000 + seq}, name=train, {text}\n"


@pytest.mark.slow
def test_xids_logged_while_the_collector_was_down_are_reported_exactly_once(cluster: Cluster) -> None:
    log = cluster.tmp / "kmsg.log"
    boot_id = cluster.tmp / "boot_id"
    boot_id.write_text("3a7c1e0e-1111-4222-8333-944455556666\n")
    state = cluster.tmp / "state"
    # Logged before the collector ever started.
    log.write_text(
        "6,1,100,-;Linux version 6.8.0 (not an XID)\n"
        + kmsg_record(2, 79, "5c", "GPU has fallen off the bus.")
        + kmsg_record(3, 48, "3a", "An uncorrectable double bit error")
    )
    agg = cluster.aggregator()
    args = ("--interval-s", "0.3", "--kmsg-path", str(log), "--state-dir", str(state))
    args += ("--kmsg-boot-id-path", str(boot_id), "--shutdown-grace-s", "5")

    def start() -> object:
        return cluster.collector("catchup-node", agg.ingest, *args)

    def seqs() -> list[int]:
        return sorted(
            p.fields.get("kmsg_seq", 0) for p in read_points(agg.data_dir, "event") if p.tags["kind"] == "xid"
        )

    def reports_after(t_ns: int) -> bool:
        return any(
            p.time_unix_ns > t_ns
            for p in read_points(agg.data_dir, "collector")
            if p.tags["node"] == "catchup-node"
        )

    collector = start()
    assert wait_until(lambda: seqs() if len(seqs()) >= 2 else None, 20, "the XIDs logged before start") == [
        2,
        3,
    ]

    # Stopped; two XIDs are logged meanwhile; started again: those two, and nothing twice.
    assert collector.stop(signal.SIGTERM) == 0
    with open(log, "a") as fh:
        fh.write(kmsg_record(4, 13, "3a", "Graphics SM Warp Exception"))
        fh.write("6,5,200,-;eth0: link up\n")
        fh.write(kmsg_record(6, 94, "5c", "Contained: SM ECC error"))
    collector = start()
    assert wait_until(lambda: seqs() if len(seqs()) >= 4 else None, 20, "the XIDs logged while stopped") == [
        2,
        3,
        4,
        6,
    ]
    # Restarted with nothing new: after it has sent reports for a while, still nothing twice.
    assert collector.stop(signal.SIGTERM) == 0
    restarted_ns = time.time_ns()
    collector = start()
    wait_until(lambda: reports_after(restarted_ns + 10**9), 20, "reports from the restarted collector")
    assert seqs() == [2, 3, 4, 6]

    # Killed (no chance to save anything at exit); one more XID; started again.
    collector.stop(signal.SIGKILL)
    with open(log, "a") as fh:
        fh.write(kmsg_record(7, 79, "3a", "GPU has fallen off the bus."))
    killed_ns = time.time_ns()
    collector = start()
    assert wait_until(lambda: seqs() if len(seqs()) >= 5 else None, 20, "the XID logged after the kill") == [
        2,
        3,
        4,
        6,
        7,
    ]
    wait_until(lambda: reports_after(killed_ns + 10**9), 20, "reports from the collector after the kill")
    assert seqs() == [2, 3, 4, 6, 7]
    assert collector.alive()
