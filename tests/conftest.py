"""Fixtures every area of the suite uses: real gpufleet processes for one test (cluster), and
the real servers started once per session (influxd, slurmctld with twenty slurmd, PostgreSQL).
Each area's own fixtures are in its conftest.py; shared helpers are in harness/, one module
per job (harness/__init__.py)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.influx import InfluxServer
from harness.processes import Cluster, stop_left_running
from harness.slurm import SLURM_NODES

# The longest tests, measured (docs/testing.md, the 50 slowest): collected first, so that the
# parallel workers start them at once and the short ones fill in around them. Started last, the
# 20,000-node test alone (4.5 min in a worker) would set the suite's end.
START_FIRST = (
    "tests/fleet/test_fleet_scale.py",
    "tests/project/test_packaging.py",
    "tests/repair/test_repair_chaos.py",
    "tests/fleet/test_demo_screens.py",
    "tests/replication/test_control_plane_hangs.py",
    "tests/repair/test_repair_rails.py",
    "tests/collector/test_driver_hangs.py",
    "tests/security/test_node_names.py",
    "tests/fleet/test_dashboard_browser.py",
    "tests/store/test_store_outage.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules in START_FIRST first, in that order; every other test as collected."""
    rank = {path: i for i, path in enumerate(START_FIRST)}

    def first(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::")[0], len(START_FIRST))

    items.sort(key=first)  # stable: within a module, and for the rest, the collected order


CPU_SHOWN = 30  # the tests that used the most CPU, listed at the end of every run
# Each area's CPU budget, seconds, all its tests together, their processes included: what lets
# the whole suite take 8 minutes of pytest on two cores (docs/testing.md "Where the CPU goes").
# Every run ends with each area's CPU against it, so an area that grows past its share shows.
CPU_BUDGET_S = {
    "fleet": 260.0,  # the ninth session: three demos read in Chromium (the serving one added)
    "repair": 180.0,
    "ingest": 105.0,
    "project": 100.0,  # the DCGM face and declared-metrics checks
    "replication": 75.0,
    "store": 65.0,
    "security": 65.0,
    "collector": 30.0,
}
_CPU_AT_START = pytest.StashKey[float]()
_STARTED_AT = pytest.StashKey[float]()


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for (the processes a test
    started and stopped: aggregators, collectors, a browser)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_AT_START] = _cpu_s()
    item.stash[_STARTED_AT] = time.time()


LOG_LINES_ON_FAILURE = 60  # the tail of each process's log a failed test's report carries


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that fails with gpufleet processes running (its `cluster`) carries the tail of
    each one's log in its report: what the aggregator or a collector said while the test waited
    is in CI's output, not only in a temporary folder that is gone. Each test's report carries
    the CPU it used, set-up to teardown (`cpu_s`): the suite is CPU-bound on two cores, so
    this, not the wall time, says what to make cheaper."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "teardown" and _CPU_AT_START in item.stash:
        report.user_properties.append(("cpu_s", _cpu_s() - item.stash[_CPU_AT_START]))
        # When it ran (Unix seconds, set-up to teardown): where the cores sat idle, at the end
        # of a run waiting on its longest tests, is read from these.
        report.user_properties.append(("started_unix_s", item.stash[_STARTED_AT]))
        report.user_properties.append(("ended_unix_s", time.time()))
    running = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and report.when == "call" and isinstance(running, Cluster):
        for proc in running.procs:
            tail = proc.log().splitlines()[-LOG_LINES_ON_FAILURE:]
            report.sections.append((f"log of {proc.name} (last {len(tail)} lines)", "\n".join(tail)))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """No gpufleet process outlives the run: one a fixture left (its set-up failed before its
    teardown was armed) is stopped here and named."""
    left = stop_left_running()
    if left:
        print(f"\nstopped {len(left)} process(es) a test left running: {', '.join(left)}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    used = [
        (dict(r.user_properties)["cpu_s"], r.nodeid)
        for reports in terminalreporter.stats.values()
        for r in reports
        if getattr(r, "when", "") == "teardown" and "cpu_s" in dict(getattr(r, "user_properties", []))
    ]
    if not used:
        return
    terminalreporter.write_sep("=", f"the {min(CPU_SHOWN, len(used))} tests that used the most CPU")
    for cpu_s, nodeid in sorted(used, reverse=True)[:CPU_SHOWN]:
        terminalreporter.write_line(f"{cpu_s:8.1f} s CPU  {nodeid}")
    terminalreporter.write_line(
        f"{sum(c for c, _ in used):8.1f} s CPU in all {len(used)} tests (their processes included; "
        "the session's servers are not)"
    )
    by_area: dict[str, float] = {}
    for cpu_s, nodeid in used:
        area = nodeid.split("/")[1] if nodeid.startswith("tests/") else "other"
        by_area[area] = by_area.get(area, 0.0) + cpu_s
    terminalreporter.write_sep("=", "CPU by area, against its budget (docs/testing.md)")
    for area, cpu_s in sorted(by_area.items(), key=lambda kv: -kv[1]):
        budget = CPU_BUDGET_S.get(area)
        if budget is None:
            verdict = "no budget: give it one in tests/conftest.py CPU_BUDGET_S"
        elif cpu_s > budget:
            verdict = f"OVER its {budget:.0f} s by {cpu_s - budget:.1f} s"
        else:
            verdict = f"within its {budget:.0f} s"
        terminalreporter.write_line(f"{cpu_s:8.1f} s CPU  tests/{area}/  {verdict}")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 24 MiB tmpfs for a data directory, mounted for this test only (the full-disk faults)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for the full-disk test needs root (CI runs as root)")
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture(scope="session")
def influxd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real influxd for the session."""
    server = InfluxServer(tmp_path_factory.mktemp("influxd"))
    server.start()
    try:
        yield server.url
    finally:
        server.kill()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real slurmctld with its slurmd nodes (gpu-node-01..22: harness/slurm.py) for the session."""
    from harness.slurm import SlurmCluster

    # Outside pytest's own temporary folder (mode 0700, root's): jobs run as other users
    # (tests/fleet/test_workloads_slurm.py), and slurmstepd starts their batch script from the
    # spool folder as that user, so the path to it must be traversable by them.
    home = Path(tempfile.mkdtemp(prefix="gpufleet-slurm-"))
    home.chmod(0o755)
    cluster = SlurmCluster(home, SLURM_NODES)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def alert_receiver() -> Iterator[Callable[..., Any]]:
    """Makes real HTTP alert receivers (harness/alert_receiver.py; its arguments: fail_first,
    port), each closed after the test even when it fails (the repair and workloads tests')."""
    from harness.alert_receiver import AlertReceiver

    made: list[AlertReceiver] = []

    def make(**kwargs: Any) -> AlertReceiver:
        receiver = AlertReceiver(**kwargs)
        made.append(receiver)
        return receiver

    try:
        yield make
    finally:
        for receiver in made:
            receiver.close()


@pytest.fixture
def kube() -> Iterator[Any]:
    """A Kubernetes API server stand-in (tests/harness/k8s_standin.py) on loopback, closed after
    the test even when it fails (the repair backend's tests and the workloads' use it)."""
    from harness.k8s_standin import KubeStandin

    standin = KubeStandin()
    try:
        yield standin
    finally:
        standin.close()


@pytest.fixture
def slurm(slurm_cluster: Any) -> Any:
    """The session's Slurm with every node resumed: each test starts from an idle cluster (the
    workloads tests' nodes aside: their jobs run while other tests start)."""
    from harness.slurm import WORKLOAD_NODES

    slurm_cluster.cancel_all(spare=WORKLOAD_NODES)
    slurm_cluster.resume_all(spare=WORKLOAD_NODES)
    return slurm_cluster


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A real PostgreSQL for the session (tests/harness/pg.py)."""
    from harness.pg import PostgresServer

    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def pg_url(postgres_server: Any) -> Iterator[str]:
    """A fresh database of the session's PostgreSQL, for one test (dropped after it)."""
    url = str(postgres_server.new_database())
    yield url
    postgres_server.drop_database(url)
