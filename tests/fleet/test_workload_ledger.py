"""The workload ledger's promise, as a property over whole scheduler answers and whole reports
(aggregator/workloads/ledger.py, in process: the scheduler's jobs and the nodes' reports are the
only inputs): whatever any node reports and claims, a workload's figures come only from the
GPUs the scheduler gave it on its own nodes; every claim of a job the scheduler does not place on
the claiming node is refused; GPU-hours allocated are the scheduler's times x GPUs, exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.aggregator.workloads.ledger import WorkloadLedger
from gpufleet.aggregator.workloads.schedulers import Job
from gpufleet.protos import telemetry_pb2

NODES = [f"n{i}" for i in range(4)]
T0 = 1_800_000_000.0

jobs_st = st.lists(
    st.builds(
        lambda jid, placement: Job(
            scheduler="slurm",
            id=str(jid),
            account=f"acct{jid % 3}",
            start_unix_s=T0 - 100,
            gpus_by_node={node: tuple(sorted(gpus)) for node, gpus in placement.items()},
        ),
        st.integers(1, 20),
        st.dictionaries(
            st.sampled_from(NODES), st.sets(st.integers(0, 7), min_size=1, max_size=4), min_size=1, max_size=2
        ),
    ),
    max_size=6,
    unique_by=lambda j: j.id,
)

reports_st = st.lists(
    st.tuples(
        st.sampled_from(NODES),
        st.lists(st.floats(0, 100), min_size=8, max_size=8),
        st.lists(
            st.tuples(st.integers(1, 25), st.sets(st.integers(0, 7), max_size=8)), max_size=4
        ),  # claims: (job id, GPUs)
    ),
    max_size=12,
)


def _report(
    node: str, utils: list[float], claims: list[tuple[int, set[int]]], t: float
) -> telemetry_pb2.NodeReport:
    r = telemetry_pb2.NodeReport(node=node, time_unix_ns=int(t * 1e9), interval_s=1.0)
    for i, u in enumerate(utils):
        r.gpus.add(index=i, util_gpu_pct=u, power_w=100.0)
    for jid, gpus in claims:
        r.workloads.add(scheduler="slurm", id=str(jid), part="0", gpu_indices=sorted(gpus), source="cgroup")
    return r


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(jobs=jobs_st, reports=reports_st)
def test_no_node_moves_figures_of_a_gpu_the_scheduler_did_not_give_the_job(
    jobs: list[Job], reports: list
) -> None:
    clock = [T0]
    ended = []
    ledger = WorkloadLedger("slurm", on_end=ended.append, now=lambda: clock[0])
    ledger.refresh({j.id: j for j in jobs})
    placed = {(j.id, node) for j in jobs for node in j.gpus_by_node}
    expected_refused = set()
    for k, (node, utils, claims) in enumerate(reports):
        clock[0] = T0 + k
        ledger.on_report(_report(node, utils, claims, clock[0]))
        expected_refused |= {(node, str(jid)) for jid, _ in claims if (str(jid), node) not in placed}
    clock[0] = T0 + 100
    ledger.refresh({j.id: j for j in jobs})  # a read after every claim: unknown jobs are refused
    for w in ledger.live():
        allowed = {(node, g) for node, gpus in w.job.gpus_by_node.items() for g in gpus}
        assert set(w.gpus) <= allowed, (w.job, set(w.gpus))
        assert set(w.claims) <= set(w.job.gpus_by_node)
        assert w.gpu_hours_allocated(clock[0]) == len(allowed) * 200 / 3600
    assert sum(ledger.refused_total.values()) == len(expected_refused)


def test_an_ended_job_keeps_its_gpus_and_is_summarised_once() -> None:
    """Slurm lists an ended job without its GRES detail, for minutes: its GPUs stay what they
    were and it is summarised once; a job that ran and ended between two reads still counts."""
    clock = [T0]
    ended = []
    ledger = WorkloadLedger("slurm", on_end=ended.append, now=lambda: clock[0])
    running = Job("slurm", "7", start_unix_s=T0 - 3600, gpus_by_node={"n0": (0, 1)})
    ledger.refresh({"7": running})
    done = Job("slurm", "7", start_unix_s=T0 - 3600, end_unix_s=T0 - 1800, gpus_by_node={"n0": ()})
    brief = Job("slurm", "8", start_unix_s=T0 - 60, end_unix_s=T0 - 30, gpus_by_node={"n1": (3,)})
    for _ in range(3):
        clock[0] += 10
        ledger.refresh({"7": done, "8": brief})
    assert [(w.job.id, w.gpu_count, w.gpu_hours_allocated(clock[0])) for w in ended] == [
        ("7", 2, 1.0),
        ("8", 1, 30 / 3600),
    ]
