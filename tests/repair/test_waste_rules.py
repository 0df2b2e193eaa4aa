"""The waste findings (issue 54) over real snapshots, the ledger that judges a node's process
claims, and the desk that alerts owners: an idle allocation waits out its window from when it went
idle; an orphan is named with its pid, memory and ended job; a process outside its job's GPUs is
found; and a node's word moves only its own GPUs' findings (a job it names that the scheduler never
placed on it is "unknown", never another node's job or owner). The alert carries the owner in its
labels, escaped for each sink."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.aggregator.workloads.ledger import WorkloadLedger
from gpufleet.aggregator.workloads.schedulers import Job
from gpufleet.protos import telemetry_pb2
from gpufleet.repair.alerts.alertmanager import AlertmanagerSink
from gpufleet.repair.alerts.base import Alert
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.alerts.pagerduty import PagerDutySink
from gpufleet.repair.alerts.slack import SlackSink
from gpufleet.repair.alerts.webhook import WebhookSink
from gpufleet.repair.evaluator import Evaluator
from gpufleet.repair.model import (
    CLAIM_ENDED,
    CLAIM_NONE,
    CLAIM_RUNNING,
    CLAIM_UNKNOWN,
    WASTE_RULES,
    NodeSnapshot,
    Owner,
    ProcessClaim,
    WorkloadOnNode,
)
from gpufleet.repair.policy import load_policy
from gpufleet.repair.state import Workflow, open_state
from gpufleet.repair.waste_desk import WasteDesk
from harness.alert_receiver import AlertReceiver

GIB = 1 << 30
T0 = 1_800_000_000.0
ALICE = Owner("alice", "llm-train", "", "foundation")


def _snap(node: str, workloads=(), claims=(), at_s: float = T0) -> NodeSnapshot:
    s = NodeSnapshot.reporting(node, [telemetry_pb2.GpuSample(index=i) for i in range(4)], int(at_s * 1e9))
    s.workloads, s.claims = tuple(workloads), tuple(claims)
    return s


def _waste(evaluator: Evaluator, snap: NodeSnapshot, now_s: float) -> list:
    found = evaluator.evaluate(Workflow(snap.node), snap, int(now_s * 1e9))
    return [f for f in found if f.code in WASTE_RULES]


def _evaluator(tmp_path) -> Evaluator:
    return Evaluator(load_policy(), open_state("sqlite", str(tmp_path / "repair.sqlite3")).kept)


def test_an_idle_allocation_is_found_after_its_window_from_when_it_went_idle(tmp_path) -> None:
    ev = _evaluator(tmp_path)
    window = load_policy().rules["idle_allocation"].window_s
    idle = WorkloadOnNode(
        "slurm:7", "train", ALICE, (0, 1), T0, idle_since_unix_s=T0 + 100, hbm_used_bytes=GIB
    )
    (f,) = _waste(ev, _snap("n1", [idle]), T0 + 200)
    assert (f.code, f.gpu, f.workload, f.cordon) == ("idle_allocation", 0, "slurm:7", False)
    assert "(llm-train, team foundation)" in f.evidence and "GPU(s) 0,1" in f.evidence
    assert "alice" not in f.evidence  # a user name is for the roles that may see it, not every screen
    assert not ev.persisted(f, int((T0 + 100 + window - 1) * 1e9))
    assert ev.persisted(f, int((T0 + 100 + window) * 1e9))
    # It worked between two looks and went idle again: the window starts again.
    again = WorkloadOnNode("slurm:7", "train", ALICE, (0, 1), T0, idle_since_unix_s=T0 + 3000)
    (g,) = _waste(ev, _snap("n1", [again]), T0 + 3100)
    assert not ev.persisted(g, int((T0 + 100 + window) * 1e9))
    # Working: nothing.
    busy = WorkloadOnNode("slurm:7", "train", ALICE, (0, 1), T0, idle_since_unix_s=None)
    assert _waste(ev, _snap("n1", [busy]), T0 + 4000) == []


def test_orphans_are_named_with_pid_memory_and_their_job_and_only_on_free_gpus_when_jobless(tmp_path) -> None:
    ev = _evaluator(tmp_path)
    running = WorkloadOnNode("slurm:9", "next", ALICE, (2,), T0)
    claims = [
        ProcessClaim("slurm:7", CLAIM_ENDED, (0,), (4242,), 60 * GIB, ALICE),
        ProcessClaim("", CLAIM_NONE, (1,), (77,), 2 * GIB),  # no job, on a free GPU
        ProcessClaim("", CLAIM_NONE, (2,), (78,), 2 * GIB),  # no job, on slurm:9's GPU: not an orphan
        ProcessClaim("", CLAIM_NONE, (3,), (79,), 100 << 20),  # under the 1 GiB threshold
    ]
    found = {f.gpu: f for f in _waste(ev, _snap("n1", [running], claims), T0)}
    assert set(found) == {0, 1}
    assert found[0].workload == "slurm:7" and "4242" in found[0].evidence and "60.0 GiB" in found[0].evidence
    assert "slurm:7 (llm-train, team foundation) has ended" in found[0].evidence
    assert found[1].workload == "" and "in no job" in found[1].evidence


def test_a_process_on_a_gpu_its_job_was_not_given_is_found(tmp_path) -> None:
    ev = _evaluator(tmp_path)
    mine = WorkloadOnNode("slurm:5", "a", ALICE, (0, 1), T0)
    other = WorkloadOnNode("slurm:6", "b", Owner("bob", "vision"), (2,), T0)
    claims = [ProcessClaim("slurm:5", CLAIM_RUNNING, (0, 1, 2, 3), (11,), GIB, ALICE)]
    found = {f.gpu: f for f in _waste(ev, _snap("n1", [mine, other], claims), T0)}
    assert set(found) == {2, 3} and all(f.code == "gpu_outside_allocation" for f in found.values())
    assert "slurm:6's GPU" in found[2].evidence and "a GPU no job was given" in found[3].evidence


@settings(max_examples=150, deadline=None)
@given(
    workloads=st.lists(
        st.builds(
            WorkloadOnNode,
            key=st.sampled_from(["slurm:1", "slurm:2", "kubernetes:ns/p"]),
            name=st.text(max_size=8),
            owner=st.builds(Owner, st.text(max_size=8), st.text(max_size=8)),
            gpus=st.lists(st.integers(0, 7), max_size=4).map(tuple),
            start_unix_s=st.just(T0),
            idle_since_unix_s=st.one_of(st.none(), st.floats(T0 - 1e5, T0 + 1e5)),
            hbm_used_bytes=st.integers(0, 1 << 40),
        ),
        max_size=4,
    ),
    claims=st.lists(
        st.builds(
            ProcessClaim,
            workload=st.sampled_from(["", "slurm:1", "slurm:3", "other:<b>x</b>"]),
            status=st.sampled_from([CLAIM_RUNNING, CLAIM_ENDED, CLAIM_UNKNOWN, CLAIM_NONE]),
            gpus=st.lists(st.integers(0, 7), max_size=4).map(tuple),
            pids=st.lists(st.integers(0, 1 << 31), max_size=20).map(tuple),
            hbm_used_bytes=st.integers(0, 1 << 40),
        ),
        max_size=6,
    ),
)
def test_a_nodes_word_moves_only_its_own_gpus_findings(tmp_path_factory, workloads, claims) -> None:
    ev = _evaluator(tmp_path_factory.mktemp("kept"))
    snap = _snap("n1", workloads, claims)
    named_gpus = {g for w in workloads for g in w.gpus} | {g for c in claims for g in c.gpus}
    for f in _waste(ev, snap, T0 + 10):
        assert f.node == "n1" and f.gpu in named_gpus and not f.cordon
        # A workload is named only where the scheduler's word put it on this node (a running
        # allocation, or a job that ran here and ended), never from an unknown claim alone.
        if f.workload:
            ran_here = {w.key for w in workloads} | {c.workload for c in claims if c.status == CLAIM_ENDED}
            assert f.workload in ran_here, f


def _report(node: str, claims: list[tuple[str, str, list[int], int]]) -> telemetry_pb2.NodeReport:
    r = telemetry_pb2.NodeReport(node=node, seq=1, time_unix_ns=int(T0 * 1e9), interval_s=1.0)
    for scheduler, workload_id, gpus, hbm in claims:
        r.workloads.add(scheduler=scheduler, id=workload_id, gpu_indices=gpus, pids=[100], hbm_used_bytes=hbm)
    return r


def test_the_ledger_judges_claims_by_the_schedulers_word_not_the_nodes() -> None:
    ledger = WorkloadLedger("slurm", on_end=lambda w: None, now=lambda: T0)
    on_b = Job("slurm", "41", user="bob", account="vision", start_unix_s=T0, gpus_by_node={"b": (0, 1)})
    ended_on_b = Job("slurm", "40", user="bob", account="vision", start_unix_s=T0, gpus_by_node={"b": (2,)})
    ledger.refresh({"41": on_b, "40": ended_on_b})
    ledger.refresh({"41": on_b})  # 40 ended
    # Node a names b's running job and b's ended job: neither is a's; no owner of b's is named.
    ledger.on_report(_report("a", [("slurm", "41", [0], 60 * GIB), ("slurm", "40", [1], 60 * GIB)]))
    _, claims_a = ledger.waste_view("a")
    assert [(c.workload, c.status, c.owner) for c in claims_a] == [
        ("slurm:41", CLAIM_UNKNOWN, Owner()),
        ("slurm:40", CLAIM_UNKNOWN, Owner()),
    ]
    # b itself: its running job is its own, the ended job's process an orphan of that job.
    ledger.on_report(_report("b", [("slurm", "41", [0, 1], GIB), ("slurm", "40", [2], 60 * GIB)]))
    workloads_b, claims_b = ledger.waste_view("b")
    assert [w.key for w in workloads_b] == ["slurm:41"]
    assert [(c.workload, c.status, c.owner.user) for c in claims_b] == [
        ("slurm:41", CLAIM_RUNNING, "bob"),
        ("slurm:40", CLAIM_ENDED, "bob"),
    ]
    # And a's word changed nothing on b.
    assert ledger.waste_view("a")[0] == ()


def test_the_owner_reaches_each_sink_in_its_labels_escaped(
    tmp_path, alert_receiver: Callable[..., AlertReceiver]
) -> None:
    receiver = alert_receiver()
    owner = Owner("<!channel> eve", "acct&co", "", "team<x>")
    w = WorkloadOnNode("slurm:9", "j", owner, (0,), T0, idle_since_unix_s=T0)
    (f,) = _waste(_evaluator(tmp_path), _snap("n1", [w]), T0 + 10)
    snap = _snap("n1", [w])

    async def run() -> None:
        dispatcher = AlertDispatcher([WebhookSink(receiver.url)], group_wait_s=0.05)
        dispatcher.start()
        desk = WasteDesk(dispatcher, lambda: int(T0 * 1e9))
        deadline = time.monotonic() + 20

        async def received(n: int) -> None:
            while len(receiver.for_key("waste/idle_allocation/slurm:9")) < n and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

        desk.update("n1", [f], snap, int(T0 * 1e9))
        await received(1)
        desk.update("n1", [], snap, int((T0 + 20) * 1e9))  # it clears: resolved, once
        await received(2)
        await dispatcher.close()

    asyncio.run(run())
    sent = receiver.for_key("waste/idle_allocation/slurm:9")
    assert [a["status"] for a in sent] == ["firing", "resolved"]
    assert sent[0]["labels"] == {
        "alertname": "GpufleetWaste",
        "finding": "idle_allocation",
        "user": "<!channel> eve",
        "account": "acct&co",
        "team": "team<x>",
        "workload": "slurm:9",
    }
    fields = {k: v for k, v in sent[0].items() if k in Alert.__dataclass_fields__}
    alert = Alert(**fields, time_ns=sent[0]["time_unix_ns"])  # what the webhook was sent, to the others
    am = AlertmanagerSink("http://am:9093").request(alert).body[0]
    assert am["labels"]["team"] == "team<x>" and am["labels"]["alertname"] == "GpufleetWaste"
    assert am["labels"]["node"] == "n1" and "incident" not in am["labels"]
    slack = json.dumps(SlackSink("http://hooks.example/x").request(alert).body)
    # The owner in Slack's text is escaped: no mention, no link can be made of an account name.
    assert "&amp;co" in slack and "team&lt;x&gt;" in slack and "<x>" not in slack
    pd = PagerDutySink("key", "http://pd.example").request(alert).body
    assert pd["payload"]["custom_details"]["owner"]["user"] == "<!channel> eve"


def test_without_a_schedulers_word_no_process_is_judged() -> None:
    # workload_scheduler = none (or before the first read): every process would look like no
    # job's, on GPUs no job holds: an orphan everywhere. None is judged, none is found.
    ledger = WorkloadLedger("none", on_end=lambda w: None, now=lambda: T0)
    ledger.on_report(_report("a", [("none", "", [0], 60 * GIB)]))
    assert ledger.waste_view("a") == ((), ())
    slurm = WorkloadLedger("slurm", on_end=lambda w: None, now=lambda: T0)
    slurm.on_report(_report("a", [("none", "", [0], 60 * GIB)]))
    assert slurm.waste_view("a") == ((), ()), "before the scheduler's first read"
    slurm.refresh({})
    slurm.on_report(_report("a", [("none", "", [0], 60 * GIB)]))
    assert [c.status for c in slurm.waste_view("a")[1]] == [CLAIM_NONE]
