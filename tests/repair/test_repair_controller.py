"""The repair controller in-process, on node snapshots built here (its input), with the real
policy, the SQLite state and the `none` backend: decisions that need many passes, checked
quickly."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gpufleet.protos import telemetry_pb2, vocabulary_pb2
from gpufleet.repair.alerts.dispatcher import AlertDispatcher
from gpufleet.repair.backends.none import NoBackend
from gpufleet.repair.controller import Hooks, Rails, RepairController
from gpufleet.repair.model import NodeSnapshot
from gpufleet.repair.outcome import Status
from gpufleet.repair.policy import load_policy
from gpufleet.repair.state import open_state


class Fleet:
    """Node snapshots as the aggregator would hand them over."""

    def __init__(self, nodes: list[str]) -> None:
        self.snaps = {
            n: NodeSnapshot(
                n,
                "c",
                vocabulary_pb2.LIVENESS_REPORTING,
                0.5,
                "boot-1",
                True,
                8,
                gpus={i: telemetry_pb2.GpuSample(index=i, uuid=f"GPU-{n}-{i}") for i in range(8)},
            )
            for n in nodes
        }

    def tick(self) -> None:
        for snap in self.snaps.values():
            snap.sample_time_ns = time.time_ns()

    def snapshots(self, only: set[str] | None) -> list[NodeSnapshot]:
        return [s for n, s in self.snaps.items() if only is None or n in only]

    def xid(self, node: str, gpu: int, xid: int) -> None:
        self.snaps[node].events.append(
            telemetry_pb2.Event(
                kind=vocabulary_pb2.EVENT_KIND_XID,
                source=vocabulary_pb2.EVENT_SOURCE_NVML,
                time_unix_ns=time.time_ns(),
                gpu_index=gpu,
                xid=xid,
            )
        )


def controller(tmp: Path, fleet: Fleet, rails: Rails | None = None) -> RepairController:
    return RepairController(
        load_policy(),
        open_state("sqlite", str(tmp / "repair.sqlite3")),
        NoBackend(),
        rails or Rails(max_out_of_service_fraction=1),
        Hooks(),
        AlertDispatcher([]),
        fleet.snapshots,
        lambda node, command: False,
    )


def test_overridden_findings_stay_overridden_across_later_uncordons(tmp_path: Path) -> None:
    async def scenario() -> None:
        fleet = Fleet(["n1"])
        repair = controller(tmp_path, fleet)
        fleet.snaps["n1"].gpus[1].ecc_dbe_volatile = 1  # a level finding that stays
        fleet.tick()
        await repair.pass_once()
        assert repair.workflows["n1"].state == "cordoned"
        await repair.uncordon("n1", "known bad GPU, job must finish", "alice")
        fleet.xid("n1", 3, 95)  # a second, different fault: cordoned again
        fleet.tick()
        await repair.pass_once()
        assert repair.workflows["n1"].state == "cordoned"
        await repair.uncordon("n1", "still finishing the job", "alice")
        for _ in range(3):
            fleet.tick()
            await repair.pass_once()
        # Neither the ECC error (overridden first) nor XID 95 brings the automation back.
        assert repair.workflows["n1"].state == "healthy"
        cordons = [
            a
            for a in repair.state.audit_log("n1")
            if a.action == "cordon" and a.actor == "automation" and a.outcome.ok
        ]
        assert len(cordons) == 2
        # Once the ECC error clears (e.g. after a reset), a new one is acted on again: a third
        # incident in 7 days, so the lemon node goes to a person instead of round the loop.
        fleet.snaps["n1"].gpus[1].ecc_dbe_volatile = 0
        fleet.tick()
        await repair.pass_once()
        fleet.snaps["n1"].gpus[1].ecc_dbe_volatile = 1
        fleet.tick()
        await repair.pass_once()
        assert repair.workflows["n1"].state == "quarantined"
        assert repair.workflows["n1"].detail.startswith("lemon node: 3 incidents in 7 days")

    asyncio.run(scenario())


def test_dry_run_decides_and_audits_but_touches_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        fleet = Fleet(["n1"])
        repair = controller(tmp_path, fleet, Rails(dry_run=True, max_out_of_service_fraction=1))
        fleet.xid("n1", 0, 79)
        for _ in range(3):
            fleet.tick()
            await repair.pass_once()
        wf = repair.workflows["n1"]
        assert wf.state == "waiting" and wf.detail == "dry-run: would cordon"
        (entry,) = [a for a in repair.state.audit_log("n1") if a.action == "cordon"]
        assert entry.outcome.status is Status.DRY_RUN and entry.reason.startswith("gpufleet: xid_79 on GPU 0")
        assert repair.out_of_service() == 0

    asyncio.run(scenario())


def test_a_finding_waits_out_its_persistence_window(tmp_path: Path) -> None:
    async def scenario() -> None:
        fleet = Fleet(["n1"])
        repair = controller(tmp_path, fleet)
        repair.policy.rules["nvlink_down"] = repair.policy.rules["nvlink_down"].__class__(
            **{**vars(repair.policy.rules["nvlink_down"]), "window_s": 0.3}
        )
        fleet.snaps["n1"].gpus[4].nvlink_links_inactive = 1
        fleet.tick()
        await repair.pass_once()
        assert repair.workflows["n1"].state == "suspect"
        started = time.monotonic()
        while repair.workflows["n1"].state == "suspect" and time.monotonic() - started < 5:
            fleet.tick()
            await repair.pass_once()
        assert repair.workflows["n1"].state == "cordoned"
        assert time.monotonic() - started >= 0.25
        # The link came back before anything else happened: a flap inside the window never cordons.
        fleet2 = Fleet(["n2"])
        repair2 = controller(tmp_path / "b", fleet2)
        repair2.policy.rules["nvlink_down"] = repair.policy.rules["nvlink_down"]
        fleet2.snaps["n2"].gpus[4].nvlink_links_inactive = 1
        fleet2.tick()
        await repair2.pass_once()
        fleet2.snaps["n2"].gpus[4].nvlink_links_inactive = 0
        fleet2.tick()
        await repair2.pass_once()
        assert repair2.workflows["n2"].state == "healthy"

    asyncio.run(scenario())


def test_a_persistence_window_does_not_restart_with_the_aggregator(tmp_path: Path) -> None:
    async def scenario() -> None:
        fleet = Fleet(["n1"])
        window = (
            load_policy()
            .rules["nvlink_down"]
            .__class__(**{**vars(load_policy().rules["nvlink_down"]), "window_s": 0.3})
        )
        first = controller(tmp_path, fleet)
        first.policy.rules["nvlink_down"] = window
        fleet.snaps["n1"].gpus[4].nvlink_links_inactive = 1
        fleet.tick()
        await first.pass_once()
        assert first.workflows["n1"].state == "suspect"
        seen_at = time.monotonic()
        first.state.close()  # the aggregator dies inside the window
        while time.monotonic() - seen_at < 0.35:  # the window runs out while it is down
            await asyncio.sleep(0.01)
        second = controller(tmp_path, fleet)
        second.policy.rules["nvlink_down"] = window
        fleet.tick()
        await second.pass_once()
        # Its first pass after the restart: the window counted from the first sighting is over.
        assert second.workflows["n1"].state == "cordoned"

    asyncio.run(scenario())


def test_the_demo_storm_after_the_trip_no_automatic_action_happens(tmp_path: Path) -> None:
    """As a new user found it: 12 nodes, breaker at 3, one node's uncorrectable-ECC repair under
    way, then six nodes lose a GPU. After the trip nothing automatic happens, in any state."""

    async def scenario() -> None:
        fleet = Fleet([f"n{i:02d}" for i in range(12)])
        repair = controller(tmp_path, fleet, Rails(max_out_of_service_fraction=1, breaker_nodes=3))
        fleet.snaps["n00"].gpus[2].ecc_dbe_volatile = 1
        for _ in range(3):
            fleet.tick()
            await repair.pass_once()
        assert repair.workflows["n00"].state in ("repairing", "validating")
        for i in range(1, 7):
            fleet.snaps[f"n{i:02d}"].gpus[5].lost = True
        for _ in range(10):  # ten passes over the storm, the ECC node's repair due meanwhile
            fleet.tick()
            await repair.pass_once()
        assert repair.breaker_tripped
        log = repair.state.audit_log(limit=1000)
        trip = next(i for i, a in enumerate(log) if a.action == "breaker_trip")
        after = [a for a in log[trip + 1 :] if a.actor == "automation"]
        assert after and all(
            a.outcome.status is Status.HELD and a.outcome.detail.startswith("breaker tripped") for a in after
        ), after
        assert len({(a.node, a.action) for a in after}) == len(after), "each held step audited once"
        # Until a person resets it: then the held workflows carry on.
        await repair.reset_breaker("storm understood", "alice")
        fleet.tick()
        await repair.pass_once()
        resumed = [a for a in repair.state.audit_log(limit=1000)[len(log) :] if a.actor == "automation"]
        assert any(a.outcome.status is not Status.HELD for a in resumed)

    asyncio.run(scenario())


class CountingFleet(Fleet):
    """The same snapshots, counting which nodes each pass asked for."""

    def __init__(self, nodes: list[str]) -> None:
        super().__init__(nodes)
        self.asked: list[set[str] | None] = []

    def snapshots(self, only: set[str] | None) -> list[NodeSnapshot]:
        self.asked.append(None if only is None else set(only))
        return super().snapshots(only)


def test_between_full_passes_only_what_changed_is_evaluated(tmp_path: Path) -> None:
    """A 500-node healthy fleet: one full pass per observe interval; the 1 s ticks between look
    only at nodes that changed. A node gone silent and a node whose health field moved are acted
    on at the next tick or at once, not at the next full pass."""

    async def scenario() -> None:
        fleet = CountingFleet([f"n{i}" for i in range(500)])
        fleet.tick()
        ticks: list[int] = []  # one per tick: the controller asks for the fleet's liveness
        repair = RepairController(
            load_policy(),
            open_state("sqlite", str(tmp_path / "repair.sqlite3")),
            NoBackend(),
            Rails(max_out_of_service_fraction=1),
            Hooks(),
            AlertDispatcher([]),
            fleet.snapshots,
            lambda node, command: False,
            observe_interval_s=3600.0,  # one full pass in this test: the first
            liveness=lambda: ticks.append(1) or {n: s.liveness for n, s in fleet.snaps.items()},
        )
        stop = asyncio.Event()
        loop = asyncio.create_task(repair.run(stop, interval_s=0.05))

        async def until(check: object, what: str) -> None:
            deadline = time.monotonic() + 10
            while not check():  # type: ignore[operator]
                assert time.monotonic() < deadline, what
                await asyncio.sleep(0.01)  # polling the controller's state, with a deadline

        await until(lambda: len(ticks) >= 10, "ten ticks")
        assert fleet.asked == [None]  # the first pass read the whole fleet; a quiet fleet needs no more

        silent = fleet.snaps["n17"]
        silent.liveness, silent.seconds_since_report = vocabulary_pb2.LIVENESS_SILENT, 120.0
        await until(lambda: any(f.code == "collector_silent" for f in repair.findings.get("n17", [])), "n17")

        fleet.snaps["n42"].gpus[3].ecc_dbe_volatile = 1
        repair.poke("n42")  # what the health watch does when a watched field changes
        await until(
            lambda: repair.workflows.get("n42") and repair.workflows["n42"].state == "cordoned", "n42"
        )
        assert None not in fleet.asked[1:]  # no full pass was needed for either
        assert max(len(only or ()) for only in fleet.asked[1:]) <= 2
        stop.set()
        await loop

    asyncio.run(scenario())
