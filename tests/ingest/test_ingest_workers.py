"""Ingest workers (ingest_workers = N): reports checked and stored by worker processes while the
main process keeps the streams. A real aggregator with real worker processes and real
simulated collectors; the fault is a worker killed with SIGKILL mid-stream. What is checked is
what an SRE would see: nothing acknowledged is lost, every report is stored once, the crash is
logged and counted, the worker comes back by itself, and /ready says so while it is down.
(That every report's values arrive unchanged and every refusal still happens through the
workers is tests/ingest/test_ingest_fuzz.py and tests/ingest/test_ingest_bad_input.py, run in both modes.)"""

from __future__ import annotations

import urllib.error
import urllib.request

import psutil
import pytest

from harness.processes import AggregatorHandle, Cluster
from harness.stored import stored_seqs
from harness.waiting import wait_until

NODES = [f"wk-node-{i}" for i in range(6)]


def workers_of(agg: AggregatorHandle) -> dict[int, psutil.Process]:
    """The aggregator's ingest worker processes by index."""
    found = {}
    for child in psutil.Process(agg.proc.popen.pid).children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if "gpufleet.aggregator.ingest.worker" in argv and child.status() != psutil.STATUS_ZOMBIE:
            found[int(argv[argv.index("--index") + 1])] = child
    return found


def ready(agg: AggregatorHandle) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{agg.metrics}/ready", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_reports_are_stored_by_the_workers_and_counted_by_the_main_process(cluster: Cluster) -> None:
    agg = cluster.aggregator("aggregator", 0, 0, None, "--ingest-workers", "2")
    assert sorted(workers_of(agg)) == [0, 1]
    for node in NODES[:2]:
        cluster.collector(node, agg.ingest, "--interval-s", "0.2", "--sim-gpus", "2")
    wait_until(
        lambda: all(len(s) >= 5 for n, s in stored_seqs(agg.data_dir, NODES).items() if n in NODES[:2]),
        30,
        "reports",
    )
    # The workers' store writes show in the main process's own metrics (from their stats).
    wait_until(lambda: agg.metric_value("gpufleet_store_points_written_total") > 0, 10, "points written")
    assert agg.metric_value("gpufleet_ingest_reports_accepted_total") >= 10
    assert ready(agg)[0] == 200


@pytest.mark.slow
def test_a_killed_worker_loses_nothing_and_comes_back(cluster: Cluster) -> None:
    agg = cluster.aggregator("aggregator", 0, 0, None, "--ingest-workers", "2")
    for node in NODES:
        cluster.collector(node, agg.ingest, "--interval-s", "0.1", "--sim-gpus", "2")
    wait_until(
        lambda: all(len(s) >= 10 for s in stored_seqs(agg.data_dir, NODES).values()),
        30,
        "every node to report",
    )

    victim_index, victim = sorted(workers_of(agg).items())[0]
    victim.kill()  # SIGKILL: no chance to finish anything
    restarts = f"ingest-worker-{victim_index}"
    wait_until(
        lambda: agg.metric_value("gpufleet_task_restarts_total", task=restarts) == 1,
        30,
        "the dead worker to be counted as a restart",
    )
    wait_until(
        lambda: victim_index in workers_of(agg) and workers_of(agg)[victim_index].pid != victim.pid,
        30,
        "a new worker in its place",
    )
    assert f"ingest worker {victim_index} (pid {victim.pid})" in agg.proc.log()

    at_restart = {n: max(s) for n, s in stored_seqs(agg.data_dir, NODES).items()}
    wait_until(
        lambda: all(max(s) >= at_restart[n] + 20 for n, s in stored_seqs(agg.data_dir, NODES).items()),
        60,
        "every node, the dead worker's too, to report again",
    )
    wait_until(lambda: ready(agg)[0] == 200, 30, "/ready to pass again")
    for proc in cluster.procs[1:]:  # the collectors: they stop after their last report is acked
        proc.stop()
    for node, seqs in stored_seqs(agg.data_dir, NODES).items():
        # Every report from 1 to the last one stored is there exactly once: what the worker held
        # when it died was not acknowledged, and the collector sent it again.
        missing = set(range(1, seqs[-1] + 1)) - set(seqs)
        assert seqs == list(range(1, seqs[-1] + 1)), f"{node}: missing {sorted(missing)}"
    assert agg.proc.alive()
