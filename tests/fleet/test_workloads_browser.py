"""The Workloads page and the node page's owner of each GPU, in a real browser (headless
Chromium): an aggregator reading a site's job records (the demo's scheduler: each simulated job
a user's, in an account, its process in a Slurm cgroup), one simulated node running such a job and
another whose job holds its GPUs idle (the waste section: issue 54).
What the pages show must be what the Fleet API answers: the workload, its account, its
efficiency; the user hidden from the dashboard's viewer token (show_user_names is off)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.client.present import owner_label, workload_name
from gpufleet.protos import fleet_pb2
from harness.browser import CHROMIUM_FLAGS, SHOTS, chromium_path, drawn, open_page, serve_dashboard, settled
from harness.processes import Cluster
from harness.waiting import wait_until

sync_api = pytest.importorskip("playwright.sync_api")

NODE, IDLE_NODE = "wl-node-1", "wl-node-2"


@pytest.mark.slow
def test_the_workloads_page_and_each_gpus_owner_in_chromium(cluster: Cluster) -> None:
    jobs = cluster.tmp / "jobs"
    jobs.mkdir()
    policy = cluster.tmp / "policy.toml"
    policy.write_text("[rules.idle_allocation]\nwindow_s = 10.0\n")
    agg = cluster.aggregator(
        "aggregator",
        0,
        0,
        None,
        "--workload-scheduler",
        "site",
        "--workload-site-jobs-dir",
        str(jobs),
        "--workload-poll-s",
        "1",
        "--repair-policy-file",
        str(policy),
        "--repair-observe-interval-s",
        "1",
    )
    cluster.collector(NODE, agg.ingest, "--interval-s", "1", "--sim-gpus", "2", "--sim-jobs-dir", str(jobs))
    # A second node whose job holds its GPUs and runs nothing on them: an idle allocation (issue 54).
    idle_scenario = cluster.tmp / "idle.toml"
    idle_scenario.write_text('[[fault]]\nat_s = 0.0\ngpu = 0\nkind = "busy"\nutil = 0.0\n')
    cluster.collector(
        IDLE_NODE, agg.ingest, "--interval-s", "1", "--sim-gpus", "2", "--sim-jobs-dir", str(jobs),
        "--sim-scenario", str(idle_scenario),
    )  # fmt: skip
    stub, meta = agg.fleet_stub(), cluster.secrets.metadata("ops")

    def running() -> Any:
        answer = stub.ListWorkloads(fleet_pb2.ListWorkloadsRequest(node=NODE), metadata=meta, timeout=30)
        read = [w for w in answer.running if w.HasField("util_mean_pct")]
        return read[0] if read else None

    job = wait_until(running, 60, "the node's job attributed, with readings")
    idle = wait_until(
        lambda: next(
            iter(
                stub.ListWorkloads(
                    fleet_pb2.ListWorkloadsRequest(node=IDLE_NODE), metadata=meta, timeout=30
                ).waste
            ),
            None,
        ),
        60,
        "the idle node's job found idle",
        context=lambda: (
            repr(
                [
                    (
                        w.id,
                        w.user,
                        w.account,
                        w.util_mean_pct if w.HasField("util_mean_pct") else None,
                        list(w.nodes),
                    )
                    for w in stub.ListWorkloads(
                        fleet_pb2.ListWorkloadsRequest(), metadata=meta, timeout=30
                    ).running
                ]
            )
            + repr(stub.GetNode(fleet_pb2.GetNodeRequest(node=IDLE_NODE), metadata=meta, timeout=30).findings)
        ),
    )
    assert idle.finding == "idle_allocation" and idle.nodes == [IDLE_NODE] and list(idle.gpus) == [0, 1]
    name, label = workload_name(job), owner_label(job)
    assert job.account and job.user and label.endswith(f"({job.account})")

    chromium = chromium_path()
    url = serve_dashboard(cluster, agg.fleet)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.goto(url)
        open_page(page, "Workloads")
        for text in (
            "Top owners",
            "Running (2)",
            "A workload's report",
            name,
            job.account,
            "(hidden)",
            "Held and not used now (",
            "idle_allocation",
            idle.workload,
        ):
            page.get_by_text(text).first.wait_for(state="attached", timeout=60_000)
        settled(page, "Workloads")
        # Viewers see the account, never the user (the dashboard runs with a viewer token).
        assert page.get_by_text(job.user, exact=True).count() == 0, "a viewer was shown a user name"
        drawn(page)
        page.screenshot(path=str(SHOTS / "workloads.png"), full_page=True)

        page.goto(f"{url}/?page=node&node={NODE}")
        page.get_by_role("heading", name="Node").first.wait_for(timeout=60_000)
        # The GPU table's workload column: each GPU the job holds, named with its account.
        page.get_by_text(label).first.wait_for(state="attached", timeout=60_000)
        settled(page, "Node")
        browser.close()
