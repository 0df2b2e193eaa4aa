"""Real faults against ingest's promises: a data directory on a small real filesystem filled up
mid-ingest, a listener that raises, a poison batch in the spool, a store that stops answering,
a collector stopped while the aggregator is away. Each asserts what an operator sees (acks,
status, /ready, logs) and that nothing accepted is lost."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from gpufleet.aggregator.ingest.spool import Spool
from gpufleet.aggregator.store import EmbeddedStore, Point
from gpufleet.aggregator.store.influx import InfluxStore
from gpufleet.aggregator.supervise import Supervisor
from gpufleet.collector import carryover
from gpufleet.protos import fleet_pb2
from harness.dashboard import app
from harness.fleet_api import bearer
from harness.in_process import InProcessAggregator
from harness.influx import InfluxServer, influx_flags
from harness.processes import Cluster, free_port, gpufleet_argv
from harness.stored import read_points, stored_seqs
from harness.streams import HealthyNode, RawStream, hello, report
from harness.waiting import wait_until


def status(fleet: str, token: str) -> fleet_pb2.AggregatorStatus:
    from gpufleet.protos import fleet_pb2_grpc

    with grpc.insecure_channel(fleet) as channel:
        return fleet_pb2_grpc.FleetStub(channel).GetStatus(
            fleet_pb2.StatusRequest(), metadata=bearer(token), timeout=10
        )


def ready(metrics: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://{metrics}/ready", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


# --- a full disk ----------------------------------------------------------------------------
def fill(path: Path) -> None:
    """Write until the filesystem says ENOSPC."""
    chunk = b"\0" * (256 * 1024)
    with open(path, "wb") as fh:
        try:
            while True:
                fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


@pytest.mark.slow
def test_a_full_disk_stops_acks_loses_nothing_and_ingest_resumes_by_itself(
    cluster: Cluster, small_fs: Path
) -> None:
    data = small_fs / "data"
    agg = cluster.aggregator("aggregator", 0, 0, data)
    token = cluster.secrets.tokens["viewer"]
    node = "disk-node"
    cluster.collector(
        node,
        agg.ingest,
        "--interval-s",
        "0.1",
        "--sim-gpus",
        "8",
        "--buffer-reports",
        "100000",
        "--backoff-max-s",
        "1",
    )
    wait_until(
        lambda: agg.metric_value("gpufleet_ingest_reports_accepted_total") >= 10, 30, "reports to land"
    )

    fill(small_fs / "filler")
    wait_until(lambda: not status(agg.fleet, token).acknowledging, 30, "the aggregator to stop acknowledging")
    st = status(agg.fleet, token)
    assert not st.healthy and not st.store_ok
    assert "cannot take writes" in st.not_acknowledging_reason or "No space" in st.not_acknowledging_reason
    code, body = ready(agg.metrics)
    assert code == 503 and any("not acknowledging" in r for r in body["reasons"]), body  # type: ignore[union-attr]
    assert agg.proc.alive()

    (small_fs / "filler").unlink()
    wait_until(lambda: status(agg.fleet, token).acknowledging, 60, "acks to resume once there is room")
    wait_until(lambda: ready(agg.metrics)[0] == 200, 30, "/ready to pass again")
    accepted = agg.metric_value("gpufleet_ingest_reports_accepted_total")
    wait_until(
        lambda: agg.metric_value("gpufleet_ingest_reports_accepted_total") >= accepted + 10,
        30,
        "new reports to be acknowledged",
    )
    cluster.stop_all()  # the collector drains what it still holds first
    seqs = stored_seqs(data, [node])[node]
    assert seqs == list(range(1, len(seqs) + 1)), "a report acknowledged or sent is missing from the store"
    log = agg.proc.log()
    stops = log.count("not acknowledging reports: neither the store nor the spool")
    assert 1 <= stops <= 3 and stops <= log.count("reports are acknowledged again") + 1, (
        "one clear line when acks stop, not one per batch"
    )
    assert "Traceback" not in log


# --- a listener that raises -----------------------------------------------------------------
def test_a_listener_that_raises_never_delays_an_ack(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def broken(report: object, received_ns: int) -> None:
        raise RuntimeError("listener bug")

    def prepare(agg: object) -> None:
        agg.fanout.report_listeners.insert(0, ("broken", broken))  # type: ignore[attr-defined]

    caplog.set_level(logging.ERROR, logger="gpufleet.aggregator.ingest.fanout")
    agg = InProcessAggregator(tmp_path, prepare)
    try:
        healthy = HealthyNode(agg.ingest, agg.secrets.collector_token("listened-node"), "listened-node", 0.05)
        wait_until(lambda: len(healthy.latencies_s) >= 20, 30, "20 acknowledged reports")
        healthy.close()
        assert not healthy.errors and healthy.worst_ack_s < 2.0, (healthy.errors, healthy.latencies_s)
        wait_until(
            lambda: agg.metric_value("gpufleet_listener_errors_total", listener="broken") >= 20,
            10,
            "every report's listener error to be counted",
        )
        # The listeners after the broken one still ran: the fleet view has the node's reports.
        view = agg.aggregator.fleet.nodes["listened-node"]
        assert view.last_seq >= 20
        logged = [r for r in caplog.records if "listener broken failed" in r.getMessage()]
        assert logged and logged[0].node == "listened-node" and logged[0].exc_info is not None  # type: ignore[attr-defined]
        assert agg.aggregator.reports.unhealthy() == []
    finally:
        agg.close()


# --- a poison batch in the spool ------------------------------------------------------------
def _spool_with_poison(data_dir: Path, poison: Point) -> list[Point]:
    """Three spooled batches; the second holds one point the store will not take."""
    now = time.time_ns() - 60 * 10**9
    good = [
        Point(
            "gpu",
            {"node": "spooled-node", "gpu": str(i % 8), "cluster": "test"},
            {"util_gpu_pct": float(i)},
            now + i,
        )
        for i in range(12)
    ]
    spool = Spool(data_dir / "spool", 1 << 30)
    spool.append(good[:4])
    spool.append([*good[4:6], poison, *good[6:8]])
    spool.append(good[8:])
    return good


@pytest.mark.slow
@pytest.mark.parametrize("store", ["embedded", "influxdb"])
def test_a_poison_batch_in_the_spool_is_quarantined_and_the_rest_drains(
    cluster: Cluster, tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    data = tmp_path / "data"
    # What each store cannot hold: SQLite no integer past int64, line protocol no NaN.
    bad_value: object = 2**64 if store == "embedded" else float("nan")
    poison = Point(
        "gpu",
        {"node": "spooled-node", "gpu": "7", "cluster": "test"},
        {"ecc_dbe_volatile": bad_value},
        time.time_ns() - 10**9,
    )
    good = _spool_with_poison(data, poison)
    flags: tuple[str, ...] = ()
    if store == "influxdb":
        url = request.getfixturevalue("influxd")
        database = f"poison_{time.time_ns()}"
        flags = influx_flags(url, database)
    agg = cluster.aggregator("aggregator", 0, 0, data, *flags)
    token = cluster.secrets.tokens["viewer"]
    wait_until(lambda: status(agg.fleet, token).spool.batches == 0, 60, "the spool to drain past the poison")
    sp = status(agg.fleet, token).spool
    assert sp.quarantined_batches == 1 and sp.quarantined_points == 1
    quarantine = Path(sp.quarantine_dir)
    (meta,) = [json.loads(p.read_text()) for p in quarantine.glob("*.json")]
    assert meta["refusals"] == 3 and meta["points"] == 1 and meta["error"]
    assert str(quarantine) in agg.proc.log(), "the log names where the refused points are kept"
    # Every good point, including the poison's batch-mates, is in the store.
    if store == "embedded":
        agg.proc.stop()
        reader = EmbeddedStore(data / "store.sqlite3", retention_s=86400)
    else:
        reader = InfluxStore(url, database, create_database=False)
    try:
        stored = reader.query_points("gpu", 0, time.time_ns() + 10**12, {"node": ["spooled-node"]})
    finally:
        reader.close()
    assert sorted(p.time_unix_ns for p in stored) == [p.time_unix_ns for p in good]
    # A restart neither brings the poison back into the drain nor forgets it.
    agg.proc.stop()
    again = cluster.aggregator("aggregator-again", 0, 0, data, *flags)
    st = status(again.fleet, token)
    assert st.spool.batches == 0 and st.spool.quarantined_batches == 1 and st.spool.quarantined_points == 1
    assert "spool quarantine holds 1 batch(es)" in again.proc.log()


# --- a store that stops answering -----------------------------------------------------------
@pytest.mark.slow
def test_a_stalled_store_makes_the_aggregator_unready_until_it_answers(
    cluster: Cluster, tmp_path: Path
) -> None:
    influx = InfluxServer(tmp_path / "influxd")
    influx.start()
    try:
        agg = cluster.aggregator("aggregator", 0, 0, None, *influx_flags(influx.url), "--ack-watchdog-s", "2")
        s = RawStream(agg.ingest, cluster.secrets.collector_token("stall-node"))
        s.send(hello("stall-node"))
        assert s.recv().WhichOneof("body") == "welcome"
        s.send(report("stall-node", 1))
        assert list(s.recv().ack.seqs) == [1]
        assert ready(agg.metrics)[0] == 200
        assert influx.proc is not None
        influx.proc.send_signal(signal.SIGSTOP)  # alive, holding the connection, answering nothing
        try:
            s.send(report("stall-node", 2))
            _, body = wait_until(lambda: (r := ready(agg.metrics))[0] == 503 and r, 20, "/ready to fail")
            assert any("waited" in reason and "for its ack" in reason for reason in body["reasons"]), body  # type: ignore[union-attr]
            st = status(agg.fleet, cluster.secrets.tokens["viewer"])
            assert not st.healthy and st.oldest_unacked_s > 2
        finally:
            influx.proc.send_signal(signal.SIGCONT)
        assert list(s.recv(timeout_s=30).ack.seqs) == [2], "the stalled write completes and is acknowledged"
        wait_until(lambda: ready(agg.metrics)[0] == 200, 20, "/ready to pass again")
        s.close()
    finally:
        cluster.stop_all()
        influx.kill()


# --- an ingest worker that stops: the backlog's memory ceiling ---------------------------------
BACKLOG_MAX = 1024 * 1024  # the least ingest_backlog_max_bytes may be


@pytest.mark.slow
def test_a_stalled_worker_backlog_stays_under_its_ceiling_and_nothing_is_lost(cluster: Cluster) -> None:
    """Issue 57: an ingest worker that stops (SIGSTOP: alive, answering nothing) while a node keeps
    sending. The reports handed to it and not yet durable stay under ingest_backlog_max_bytes
    (past it the aggregator reads no more; the collector keeps the rest), the lag and the backlog
    are exported, /ready says so; once the worker runs again every report is acknowledged, in
    order, none lost."""
    import psutil

    agg = cluster.aggregator(
        "aggregator", 0, 0, None, "--ingest-workers", "1", "--ingest-backlog-max-bytes", str(BACKLOG_MAX),
        "--ack-watchdog-s", "2", "--node-reports-per-s", "100000", "--node-bytes-per-s", "1e12",
        "--node-report-burst", "100000", "--node-byte-burst", "1000000000",
    )  # fmt: skip
    node = "backlog-node"
    s = RawStream(agg.ingest, cluster.secrets.collector_token(node))
    s.send(hello(node, gpus=64))
    assert s.recv().WhichOneof("body") == "welcome"
    s.send(report(node, 1, gpus=64))
    assert list(s.recv(timeout_s=30).ack.seqs) == [1]
    aggregator = psutil.Process(agg.proc.popen.pid)
    (worker,) = [
        p for p in aggregator.children(recursive=True) if "gpufleet.aggregator.ingest.worker" in p.cmdline()
    ]
    one_report = len(report(node, 2, gpus=64).SerializeToString())
    sent = 1 + 3 * BACKLOG_MAX // one_report  # three ceilings' worth
    worker.suspend()
    try:
        for seq in range(2, sent + 1):
            s.send(report(node, seq, gpus=64))
        wait_until(
            lambda: agg.metric_value("gpufleet_ingest_backlog_bytes") >= BACKLOG_MAX - one_report,
            30,
            "the backlog to reach its ceiling",
        )
        wait_until(lambda: ready(agg.metrics)[0] == 503, 20, "/ready to say the ingest is behind")
        backlog = agg.metric_value("gpufleet_ingest_backlog_bytes")
        assert backlog <= BACKLOG_MAX + one_report, f"{backlog} bytes held past the ceiling {BACKLOG_MAX}"
        assert agg.metric_value("gpufleet_ingest_backlog_reports") < sent - 1, "the rest wait at the node"
        assert agg.metric_value("gpufleet_ingest_oldest_unacked_seconds") > 2
    finally:
        worker.resume()
    acked: list[int] = []
    wait_until(
        lambda: acked.extend(s.recv(timeout_s=30).ack.seqs) or acked[-1:] == [sent],
        120,
        "every report acknowledged once the worker runs again",
        context=lambda: f"acked up to {acked[-1:]} of {sent}",
    )
    assert acked == list(range(2, sent + 1)), "every report, in order, none lost"
    wait_until(lambda: ready(agg.metrics)[0] == 200, 30, "/ready to pass again")
    assert agg.metric_value("gpufleet_ingest_backlog_bytes") == 0
    s.close()


# --- supervision ----------------------------------------------------------------------------
def test_a_crashing_task_is_logged_counted_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    supervisor = Supervisor(registry, loop_restarts=2, loop_window_s=60)
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) <= 2:
            raise ValueError(f"crash {len(runs)}")

    async def main() -> None:
        await asyncio.wait_for(supervisor.start("flaky", flaky), 10)

    with caplog.at_level(logging.ERROR, logger="gpufleet.aggregator.supervise"):
        asyncio.run(main())
    assert len(runs) == 3, "restarted after each crash, ended when the body returned"
    record = supervisor.records["flaky"]
    assert record.restarts_total == 2 and record.last_error == "ValueError: crash 2"
    assert registry.get_sample_value("gpufleet_task_restarts_total", {"task": "flaky"}) == 2
    assert supervisor.looping() and "restarted 2 times" in supervisor.looping()[0]
    assert sum("background task flaky crashed" in r.getMessage() for r in caplog.records) == 2


# --- a collector stopped while the aggregator is away ---------------------------------------
@pytest.mark.slow
def test_reports_unacked_at_a_collector_stop_are_sent_after_its_restart(
    cluster: Cluster, tmp_path: Path
) -> None:
    ingest, fleet = free_port(), free_port()
    data, state = tmp_path / "data", tmp_path / "collector-state"
    agg = cluster.aggregator("aggregator", ingest, fleet, data)
    node = "carry-node"
    args = ("--interval-s", "0.2", "--sim-gpus", "2", "--state-dir", str(state), "--shutdown-grace-s", "0.5")
    collector = cluster.collector(node, agg.ingest, *args, "--backoff-max-s", "0.5")
    wait_until(lambda: agg.metric_value("gpufleet_ingest_reports_accepted_total") >= 3, 30, "reports to land")
    agg.proc.stop(signal.SIGKILL)
    wait_until(
        lambda: collector.log().count("retrying in") >= 3, 30, "the collector to sample on, unacknowledged"
    )
    collector.stop(signal.SIGTERM)
    kept = re.search(r"(\d+) unacknowledged report\(s\) kept in (\S+) for the next start", collector.log())
    assert kept, collector.log()[-2000:]
    path = carryover.carry_path(str(state), node)
    shutil.copy(path, tmp_path / "copy.pb")
    carried = carryover.load(tmp_path / "copy.pb", node, 10_000)
    assert len(carried) == int(kept.group(1)) >= 1

    agg = cluster.aggregator("aggregator-again", ingest, fleet, data)
    again = cluster.spawn(
        node + "-again",
        collector.popen.args,
        env={"GPUFLEET_COLLECTOR_TOKEN": cluster.secrets.collector_token(node)},
    )  # type: ignore[arg-type]
    wait_until(lambda: not path.exists(), 30, "the restarted collector to take the carried reports")
    wanted = {r.time_unix_ns for r in carried}

    def all_stored() -> bool:
        got = {ts for tags, _, ts in read_points(data, "collector") if tags["node"] == node}
        return wanted <= got

    wait_until(all_stored, 30, "every carried-over report to be stored at its own sampling time")
    assert "left unacknowledged by the last run are sent first" in again.log()


# --- a batch the store refuses: bisected ----------------------------------------------------
def test_bisect_finds_exactly_the_points_the_store_refuses(tmp_path: Path) -> None:
    from gpufleet.aggregator.ingest.writer import isolate

    store = EmbeddedStore(tmp_path / "store.sqlite3", retention_s=86400)
    now = time.time_ns()
    batch = [
        [
            Point(
                "gpu",
                {"node": f"n{i}", "gpu": "0"},
                {"ecc_dbe_volatile": 2**64 if i in (3, 17, 18) else i},
                now,
            )
        ]
        for i in range(25)
    ]

    async def write(entries: object) -> None:
        await asyncio.to_thread(store.write, [p for e in entries for p in e])  # type: ignore[attr-defined]

    async def main() -> list[tuple[object, BaseException]]:
        try:
            await write(batch)
        except Exception as exc:
            return await isolate(batch, write, exc)
        raise AssertionError("the store took an integer it cannot hold")

    bad = asyncio.run(main())
    assert sorted(e[0].tags["node"] for e, _ in bad) == ["n17", "n18", "n3"]  # type: ignore[index]
    assert all("OverflowError" in str(exc) for _, exc in bad)
    stored = {p.tags["node"] for p in store.query_points("gpu", 0, now + 1)}
    assert stored == {f"n{i}" for i in range(25)} - {"n3", "n17", "n18"}
    store.close()


def answered(s: RawStream, n: int) -> dict[int, tuple[str, Any]]:
    """seq -> (ack or reject, the message) for the next n reports answered on a stream (one Ack
    may carry several seqs: all those its batch made durable)."""
    out: dict[int, tuple[str, Any]] = {}
    while len(out) < n:
        m = s.recv(15)
        body = m.WhichOneof("body")
        for seq in m.ack.seqs if body == "ack" else [m.reject.seq]:
            out[seq] = (body, m)
    return out


def test_reports_a_concurrent_writer_made_unstorable_are_refused_alone(
    cluster: Cluster, influxd: str
) -> None:
    database = f"conflict_{time.time_ns()}"
    agg = cluster.aggregator("aggregator", 0, 0, None, *influx_flags(influxd, database))
    # Another writer got there first: util_gpu_pct is a string field in this shard now.
    body = f'gpu,node=someone-else util_gpu_pct="busy" {time.time_ns()}'.encode()
    urllib.request.urlopen(
        urllib.request.Request(f"{influxd}/write?db={database}", data=body, method="POST"), timeout=10
    )
    clash = RawStream(agg.ingest, cluster.secrets.collector_token("clash-node"))
    clean = RawStream(agg.ingest, cluster.secrets.collector_token("clean-node"))
    for s, node in ((clash, "clash-node"), (clean, "clean-node")):
        s.send(hello(node))
        assert s.recv().WhichOneof("body") == "welcome"
    for seq in range(1, 6):  # pipelined on both streams, so batches mix the two nodes
        clash.send(report("clash-node", seq))
        r = report("clean-node", seq)
        for g in r.report.gpus:
            g.ClearField("util_gpu_pct")
        clean.send(r)
    clean_answers, clash_answers = answered(clean, 5), answered(clash, 5)
    assert sorted(clean_answers) == [1, 2, 3, 4, 5] and {a for a, _ in clean_answers.values()} == {"ack"}
    assert sorted(clash_answers) == [1, 2, 3, 4, 5]
    for seq, (kind, m) in clash_answers.items():
        assert kind == "reject" and m.reject.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "refused by the store" in m.reject.message and "field type conflict" in m.reject.message
        assert m.reject.message.startswith(f"node 'clash-node': report seq {seq}")
    assert agg.metric_value("gpufleet_ingest_rejections_total", reason="store_refused") == 5
    # Counted in the worker that stored the batch: its stats reach the main process's metrics
    # within a second (aggregator/ingest/worker.py STATS_EVERY_S).
    wait_until(
        lambda: agg.metric_value("gpufleet_store_refused_reports_total") == 5, 10, "the refusals counted"
    )
    reader = InfluxStore(influxd, database, create_database=False)
    try:
        clean_points = reader.query_points("collector", 0, time.time_ns() + 10**12, {"node": ["clean-node"]})
    finally:
        reader.close()
    assert sorted(p.fields["seq"] for p in clean_points) == [1, 2, 3, 4, 5]
    for s in (clash, clean):
        s.close()


# --- what an operator sees while nothing is acknowledged ------------------------------------
@pytest.mark.slow
def test_cli_and_dashboard_say_why_while_nothing_is_acknowledged(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store is down (nothing listens on its port) and the 1 MiB spool fills up.
    dead = f"http://127.0.0.1:{free_port()}"
    agg = cluster.aggregator("aggregator", 0, 0, None, *influx_flags(dead), "--spool-max-bytes", "1048576")
    token = cluster.secrets.tokens["viewer"]
    s = RawStream(agg.ingest, cluster.secrets.collector_token("full-node"))
    s.send(hello("full-node"))
    assert s.recv().WhichOneof("body") == "welcome"
    for seq in range(1, 2000):
        s.send(report("full-node", seq))
    wait_until(lambda: not status(agg.fleet, token).acknowledging, 60, "the spool to fill and acks to stop")
    s.close()

    env = {
        **os.environ,
        "GPUFLEET_FLEET": agg.fleet,
        "GPUFLEET_TOKEN": token,
        "GPUFLEET_CLIENT_CONFIG": "/none",
    }
    out = subprocess.run(gpufleet_argv("status"), env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    # With ingest workers (the default) the reason names the worker whose spool is full.
    assert "UNHEALTHY" in out.stdout and re.search(
        r"NOT ACKNOWLEDGING: (ingest worker \d+: )?the spool is full", out.stdout
    ), out.stdout

    pytest.importorskip("streamlit")
    page = app(monkeypatch, agg.fleet, token)
    page.run()
    banners = [e.value for e in page.error]
    assert any(
        re.match(
            r"Aggregator UNHEALTHY: not acknowledging reports: (ingest worker \d+: )?the spool is full", b
        )
        for b in banners
    ), banners
