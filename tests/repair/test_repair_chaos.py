"""Chaos on the real Slurm: 20 nodes for 90 s with random XID faults, a scheduler that fails
30 % of reads, the aggregator SIGKILLed every 20 s, and a person draining and resuming random
nodes. The rails' promises are checked on every look at Slurm and from the audit log at the
end; the counts are printed (run with -s to see them)."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.alert_receiver import AlertReceiver
from harness.processes import Cluster, free_port
from harness.repair import audit_rows, gpufleet_cli, lines
from harness.slurm import SLURM_NODES
from harness.waiting import wait_until

CHAOS_S = 90.0
KILL_EVERY_S = 20.0
MIN_KILLS = 4
CAP = 4
POLICY = """
[workflow]
validate_s = 5.0
reboot_timeout_s = 15.0
reset_timeout_s = 15.0
"""
PERSON = "person: chaos"


# Four GPUs a node, not the simulator's eight: the rails and their invariants do not depend on
# the count, and twenty collectors' CPU for 90 s halves (most of a simulated node's work is per GPU).
GPUS = 4


def scenario(path: Path, rng: random.Random, faulty: bool) -> Path:
    """One to three faults at random times: on a faulty node XIDs that cordon (79, 48, 94, 95),
    some with the GPU lost, and application XIDs (13, 31) that must not; on a clean node only
    the application XIDs."""
    faults = []
    for _ in range(rng.randint(1, 3)):
        at_s, gpu = rng.uniform(2.0, CHAOS_S - 20), rng.randrange(GPUS)
        xid = rng.choice([79, 48, 94, 95, 13, 31] if faulty else [13, 31])
        faults.append(f'[[fault]]\nat_s = {at_s:.1f}\ngpu = {gpu}\nkind = "xid"\nxid = {xid}\n')
        if xid == 79 and rng.random() < 0.5:
            faults.append(f'[[fault]]\nat_s = {at_s:.1f}\ngpu = {gpu}\nkind = "lost"\n')
    path.write_text("\n".join(faults))
    return path


def workflow_states(data: Path) -> dict[str, str]:
    db = sqlite3.connect(f"file:{data / 'repair.sqlite3'}?mode=ro", uri=True)
    try:
        return {n: json.loads(b)["state"] for n, b in db.execute("SELECT node, body FROM workflow")}
    finally:
        db.close()


def person_acts(
    rng: random.Random,
    slurm: Any,
    states: dict[str, tuple[set[str], str]],
    workflows: dict[str, str],
    clean: set[str],
    person_drains: dict[str, str],
    n: int,
) -> int:
    """One thing a person does in Slurm, as an SRE with the dashboard open would: resume a
    drained node (theirs or the automation's), take over a node the automation is repairing,
    or drain a node that is not failing. (Slurm has no conditional update: a person's drain
    landing in the milliseconds between the automation's read and its write of the same node
    would be lost; the person here does not race the automation on a node it is about to
    cordon or uncordon, which a person watching the dashboard does not either.)"""
    drained = [node for node, (words, _) in states.items() if "DRAIN" in words]
    mine = [node for node in drained if states[node][1].startswith("gpufleet:")]
    takeable = [node for node in mine if workflows.get(node) in ("draining", "repairing", "quarantined")]
    free = [node for node in clean if node not in drained]
    choice = rng.random()
    if choice < 0.4 and drained:
        node = rng.choice(drained)
        try:
            slurm.scontrol("update", f"NodeName={node}", "State=RESUME")
        except subprocess.CalledProcessError:
            # The automation returned it between the person's look and their resume (slurmctld
            # refuses to resume a node that is not drained): nothing for the person to do.
            if "DRAIN" in slurm.state(node)[0]:
                raise
            return 0
        person_drains.pop(node, None)
    elif choice < 0.7 and takeable:
        node = rng.choice(takeable)
        person_drains[node] = f"{PERSON} {n}: taking over"
        slurm.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={person_drains[node]}")
    elif free:
        node = rng.choice(free)
        person_drains[node] = f"{PERSON} {n}"
        slurm.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={person_drains[node]}")
    else:
        return 0
    return 1


def begun(rows: list[dict[str, Any]], node: str, action: str) -> int:
    """Audit rows of automatic steps begun on the node (written before the step is done)."""
    return sum(
        1
        for r in rows
        if r["node"] == node
        and r["actor"] == "automation"
        and r["action"] == action
        and r["outcome"] == "started"
    )


@pytest.mark.slow
def test_chaos_rails_hold_under_kills_scheduler_faults_and_a_person(
    alert_receiver: Callable[..., AlertReceiver], cluster: Cluster, slurm: Any
) -> None:
    # A new seed each run; GPUFLEET_CHAOS_SEED replays the one a failed run printed.
    seed = int(os.environ.get("GPUFLEET_CHAOS_SEED") or random.Random(int(time.time())).randrange(1 << 30))
    rng = random.Random(seed)
    print(f"\nchaos seed {seed} (GPUFLEET_CHAOS_SEED={seed} replays it)")
    nodes = SLURM_NODES[:20]
    scontrol = slurm.wrapper(cluster.tmp / "scontrol")
    receiver = alert_receiver()
    policy = cluster.tmp / "policy.toml"
    policy.write_text(POLICY)
    ports, data = (free_port(), free_port()), cluster.tmp / "data"
    resets = cluster.tmp / "resets"
    resets.mkdir()
    argv = [
        "--repair-policy-file",
        str(policy),
        "--repair-interval-s",
        "0.5",
        "--repair-backend",
        "slurm",
        "--repair-slurm-conf",
        str(slurm.conf),
        "--repair-slurm-scontrol",
        str(scontrol.path),
        "--repair-observe-interval-s",
        "5",
        "--repair-reboot-command",
        f"sh -c 'echo {{node}} >> {cluster.tmp}/reboots.txt'",
        "--repair-max-out-of-service",
        str(CAP),
        "--repair-max-out-of-service-fraction",
        "1",
        "--repair-breaker-nodes",
        "7",
        "--alert-webhooks",
        receiver.url,
        "--alert-group-wait-s",
        "0.5",
    ]
    restarts = 0
    agg = cluster.aggregator("agg-0", ports[0], ports[1], data, *argv)
    clean = set(rng.sample(nodes, 8))
    for node in nodes:
        cluster.collector(
            node,
            agg.ingest,
            "--interval-s",
            "2",
            "--sim-gpus",
            str(GPUS),
            "--sim-scenario",
            str(scenario(cluster.tmp / f"{node}.toml", rng, faulty=node not in clean)),
            "--reset-command",
            f"sh -c 'echo {{gpu_index}} >> {resets / node}'",
        )
    scontrol.fail_reads(30)

    person_drains: dict[str, str] = {}  # node → the reason the person gave, while drained
    violations: list[str] = []
    looks = person_actions = 0
    started = next_kill = next_person = time.monotonic()
    next_kill += KILL_EVERY_S
    breaker_reset_done = False
    # At least CHAOS_S, and at least MIN_KILLS kills: on a busy machine a restart takes longer,
    # and the run goes on until it has had its kills (up to three times as long).
    while time.monotonic() - started < CHAOS_S or (
        restarts < MIN_KILLS and time.monotonic() - started < 3 * CHAOS_S
    ):
        now = time.monotonic()
        every = slurm.states()
        states = {n: every.get(n, (set(), "")) for n in nodes}
        looks += 1
        ours = [
            n for n, (words, reason) in states.items() if "DRAIN" in words and reason.startswith("gpufleet:")
        ]
        if len(ours) > CAP:
            violations.append(f"{len(ours)} nodes out of service by automation, cap {CAP}: {ours}")
        for node, reason in person_drains.items():
            words, now_reason = states[node]
            if "DRAIN" not in words or now_reason != reason:
                violations.append(f"the person's drain of {node} changed: {words} {now_reason!r}")
        if now >= next_person:
            next_person = now + rng.uniform(1.0, 4.0)
            person_actions += person_acts(
                rng, slurm, states, workflow_states(data), clean, person_drains, person_actions
            )
        if now >= next_kill:
            agg.proc.stop(signal.SIGKILL)
            restarts += 1
            agg = cluster.aggregator(f"agg-{restarts}", ports[0], ports[1], data, *argv)
            next_kill = time.monotonic() + KILL_EVERY_S
        if not breaker_reset_done and now - started > CHAOS_S * 0.6:
            status = gpufleet_cli(agg, cluster, "viewer", "breaker", "status", "--json")
            if status.returncode == 0 and '"breaker_tripped": true' in status.stdout:
                reset = gpufleet_cli(agg, cluster, "ops", "breaker", "reset", "--reason", "chaos: storm over")
                breaker_reset_done = reset.returncode == 0
        time.sleep(0.2)  # pacing of the person and the checker, not synchronisation
    scontrol.fail_reads(0)

    # Quiet now: every incident that closed and was paged must be resolved at the receiver.
    rows = audit_rows(data)

    def closed_incidents() -> set[str]:
        db = sqlite3.connect(f"file:{data / 'repair.sqlite3'}?mode=ro", uri=True)
        try:
            return {i for (i,) in db.execute("SELECT id FROM incident WHERE closed_ns > 0")}
        finally:
            db.close()

    def unresolved() -> set[str]:
        fired = {a["key"] for a in receiver.received if a["status"] == "firing" and a["key"] != "breaker"}
        resolved = {a["key"] for a in receiver.received if a["status"] == "resolved"}
        return (fired & closed_incidents()) - resolved

    wait_until(lambda: not unresolved(), 60, "every paged incident that closed to be resolved")

    # From the audit log: nothing automatic begins between a trip and the reset that followed
    # it. Every automatic action is audited "started" first; what may still be written while
    # tripped is a hold, the outcome of the step a node had in flight at the trip (a reboot hook
    # finishing, then timing out), a validation found failing, a quarantine (a person decides).
    tripped = False
    in_flight: dict[str, str] = {}  # node → the action it last started
    for row in rows:
        if row["action"] == "breaker_trip":
            tripped = True
        elif row["action"] == "breaker_reset":
            tripped = False
        elif row["actor"] != "automation" or row["outcome"].startswith("held: breaker"):
            continue
        elif row["outcome"] == "started":
            if tripped:
                violations.append(f"automatic action begun while the breaker was tripped: {row}")
            in_flight[row["node"]] = row["action"]
        elif (
            tripped
            and in_flight.get(row["node"]) != row["action"]
            and row["action"] not in ("validate", "quarantine")
        ):
            violations.append(f"automatic action while the breaker was tripped: {row}")
    # Every scheduler change has its audit row; no reset is repeated.
    calls = scontrol.calls()
    for node in nodes:
        drains = sum(1 for c in calls if c.startswith(f"update NodeName={node} State=DRAIN Reason=gpufleet:"))
        resumes = sum(1 for c in calls if c == f"update NodeName={node} State=RESUME")
        cordon_rows, uncordon_rows = begun(rows, node, "cordon"), begun(rows, node, "uncordon")
        if drains > cordon_rows or resumes > uncordon_rows:
            violations.append(
                f"{node}: {drains} drains / {resumes} resumes, audited {cordon_rows} / {uncordon_rows}"
            )
        # One reset step may cover several GPUs ("GPU(s) 2, 6"): each carried out once at most.
        begun_gpus = collections.Counter(
            gpu.strip()
            for r in rows
            if r["node"] == node and r["action"] == "reset_gpu" and r["outcome"] == "started"
            for gpu in r["reason"].removeprefix("GPU(s) ").split(",")
        )
        done = collections.Counter(lines(resets / node))
        if done - begun_gpus:
            violations.append(
                f"{node}: GPU resets {dict(done)} carried out, {dict(begun_gpus)} begun: repeated"
            )
    counts = collections.Counter((r["action"], r["status"]) for r in rows if r["actor"] == "automation")
    holds = sum(n for (_, outcome), n in counts.items() if outcome == "held")
    print(
        f"chaos: {CHAOS_S:.0f} s, {len(nodes)} nodes, {restarts} aggregator kills, {looks} looks at Slurm, "
        f"{person_actions} person actions, {len(calls)} scontrol calls, "
        f"{sum(1 for c in calls if 'show node' in c)} reads (30 % failed), {holds} held steps"
    )
    for (action, outcome), n in sorted(counts.items()):
        print(f"  {action:12} {outcome:10} {n}")
    print(f"  alerts received: {len(receiver.received)}; breaker reset during the run: {breaker_reset_done}")
    assert restarts >= MIN_KILLS
    assert not violations, "\n".join(violations[:20])
